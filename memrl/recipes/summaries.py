"""The demos' per-method summaries of a held-out evaluation, over the scored groups the one evaluator
(memrl.eval.evaluator) keeps: MemAct's (peak context, prunes, overflow), the context-management family's
(peak / mean context, tokens discarded, branches, summaries, stopped by the budget), the reading methods'
(MemAgent / InfMem on the synthetic task: model calls, chunks read, retrievals, stop rate) and MEM1's
(objectives right, peak and mean context per objective count). Each method's evaluation is greedy and
sampled through `evaluate_tasks`, so the statistics are the evaluator's. The demos' tables are declared by
the methods (memrl.recipes.tables).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from memrl.eval.evaluator import (
    EvalProtocol,
    EvalResult,
    Rollout,
    evaluate_policy,
    evaluate_tasks,
    mean_and_se,
    metric_mean,
    result_from_groups,
)
from memrl.types import Group, Task
from memrl.workflows import boxed_em_outcome

# ---------------------------------------------------------------- MemAct


def memact_summary(res: EvalResult) -> dict[str, float]:
    """A MemAct evaluation (one sample per task, groups kept) in the MemAct demo's terms: accuracy (all sub-questions
    right, %) and its SE (`res.se`), sub-question accuracy, mean / peak working context, the largest peak,
    prunes per task, overflow (stopped by the context budget, %), turns, and accuracy by question count."""
    trajs = [t for g in res.groups for t in g.trajectories]
    if len(trajs) != res.num_tasks:
        raise ValueError(f"memact_summary: {len(trajs)} trajectories for {res.num_tasks} tasks; it needs the "
                         "result's groups (keep_groups=True), one trajectory per task")
    out = {
        "accuracy": res.accuracy,
        "accuracy_se": res.se,
        "subq_accuracy": 100.0 * metric_mean(trajs, "multiq_subq_accuracy"),
        "mean_context_tokens": metric_mean(trajs, "mean_context_tokens"),
        "peak_context_tokens": metric_mean(trajs, "peak_context_tokens"),
        "max_context_tokens": max(t.metrics["peak_context_tokens"] for t in trajs),
        "prunes_per_task": metric_mean(trajs, "prunes"),
        "failed_prunes_per_task": metric_mean(trajs, "failed_prunes"),
        "overflow": 100.0 * metric_mean(trajs, "stop_context_budget"),
        "turns": metric_mean(trajs, "turns"),
        "num_tasks": float(len(trajs)),
    }
    for k in sorted({int(t.metrics.get("multiq_questions", 0)) for t in trajs}):
        sub = [float(t.reward or 0.0) for t in trajs if int(t.metrics.get("multiq_questions", 0)) == k]
        out[f"accuracy_{k}q"] = 100.0 * (math.fsum(sub) / len(sub))
    return out


MEMACT_SE_DDOF = 0
"""The MemAct demo's standard error: binomial, sqrt(p (1 - p) / tasks) (one 0/1 sample per task)."""


def memact_summary_of(groups: Sequence[Group]) -> dict[str, float]:
    """`memact_summary` of scored groups of one trajectory each (e.g. a scripted agent's)."""
    return memact_summary(result_from_groups(groups, 1, 0.0, metrics=(), se_ddof=MEMACT_SE_DDOF, keep_groups=True))


def evaluate_memact(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                    seed: int, prune_tool: bool = True, **labels: Any) -> dict[str, dict[str, float]]:
    """The MemAct demo's held-out protocol: {"greedy": summary, "sampled": summary}, one trajectory per task
    each (sampled at `temperature`, top_p 1, no top-k), the prune tool offered and never withheld (or, with
    `prune_tool=False`, withheld in every trajectory: the search-only baseline), both seeded with `seed`;
    each summary is `memact_summary` plus the evaluation's `seconds`. `labels`: the rows' (evaluate_tasks)."""
    base = replace(wf_cfg, no_prune_prob=0.0, prune_tool=prune_tool, top_p=1.0, top_k=-1)
    proto = EvalProtocol(greedy=True, samples=1, temperature=temperature, seed=seed, metrics=(),
                         se_ddof=MEMACT_SE_DDOF, keep_groups=True)
    res = evaluate_policy(rollout, base, {"all": list(tasks)}, proto, **labels)["all"]
    return {mode: {**memact_summary(r), "seconds": r.seconds} for mode, r in res.items()}


# ---------------------------------------------------------------- the context-management family's metrics


CONTEXT_SE_DDOF = 1
"""The context-management evaluations' standard error: the sample standard deviation over tasks / sqrt(tasks)."""


def context_summary(res: EvalResult) -> dict[str, float]:
    """A fold / summarize / sliding_window evaluation (one trajectory per task, groups kept) in the terms of
    benchmarks/context_management.py: accuracy (all sub-questions right, %) and its SE (`res.se`), per-task
    means of peak / mean working context, tokens discarded, turns, branches, summaries, the share stopped by
    the budget (%), and the number of tasks."""
    trajs = [t for g in res.groups for t in g.trajectories]
    if len(trajs) != res.num_tasks:
        raise ValueError(f"context_summary: {len(trajs)} trajectories for {res.num_tasks} tasks; it needs the "
                         "result's groups (keep_groups=True), one trajectory per task")
    return {
        "accuracy": res.accuracy,
        "accuracy_se": res.se,
        "peak_context_tokens": metric_mean(trajs, "peak_context_tokens"),
        "mean_context_tokens": metric_mean(trajs, "mean_context_tokens"),
        "tokens_discarded": metric_mean(trajs, "tokens_discarded"),
        "turns": metric_mean(trajs, "turns"),
        "branches": metric_mean(trajs, "branches"),
        "summaries": metric_mean(trajs, "summaries"),
        "stopped_by_budget": 100.0 * metric_mean(trajs, "stop_context_budget"),
        "num_tasks": float(len(trajs)),
    }


def context_summary_of(groups: Sequence[Group]) -> dict[str, float]:
    """`context_summary` of scored groups of one trajectory each (e.g. a scripted agent's)."""
    return context_summary(result_from_groups(groups, 1, 0.0, metrics=(), se_ddof=CONTEXT_SE_DDOF, keep_groups=True))


def evaluate_context(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                     seed: int, **labels: Any) -> dict[str, dict[str, float]]:
    """The context demo's held-out protocol (memrl.recipes.context): {"greedy": summary, "sampled": summary},
    one trajectory per task each (sampled at `temperature`, top_p 1, no top-k), both seeded with `seed`; each
    summary is `context_summary` plus the evaluation's `seconds`. `labels`: the rows' (evaluate_tasks)."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    proto = EvalProtocol(greedy=True, samples=1, temperature=temperature, seed=seed, metrics=(),
                         se_ddof=CONTEXT_SE_DDOF, keep_groups=True)
    res = evaluate_policy(rollout, base, {"all": list(tasks)}, proto, **labels)["all"]
    return {mode: {**context_summary(r), "seconds": r.seconds} for mode, r in res.items()}


# ---------------------------------------------------------------- reading agents (MemAgent / InfMem)


def reading_summary_of(groups: Sequence[Group], seconds: float = 0.0) -> dict[str, float]:
    """A MemAgent / InfMem evaluation in the terms of the InfMem demo (memrl.recipes.infmem), over scored groups
    with their tasks: accuracy (%, the exact-match outcome `boxed_em_outcome`, whatever the workflow's training
    reward mixes in) and its SE over tasks (each task's mean over its samples, ddof 1); per trajectory the
    means of model calls (its segments), chunks read (memory calls), the document's chunks, retrievals and
    tokens read; the share that stopped early (%) and the mean stop step of those that did (0 when none did)."""
    if not groups or any(g.task is None for g in groups):
        raise ValueError("reading_summary_of: needs scored groups that carry their task")
    per_task = [math.fsum(boxed_em_outcome(g.task, t) for t in g.trajectories) / len(g.trajectories)  # type: ignore[arg-type]
                for g in groups]
    acc, se = mean_and_se(per_task, 1)
    trajs = [t for g in groups for t in g.trajectories]
    stopped = [t for t in trajs if t.metrics.get("stopped", 0.0)]
    n = len(trajs)
    return {
        "accuracy": 100.0 * acc,
        "accuracy_se": 100.0 * se,
        "model_calls": math.fsum(len(t.segments) for t in trajs) / n,
        "chunks_read": math.fsum(sum(s.info.get("kind") == "memory" for s in t.segments) for t in trajs) / n,
        "chunks": metric_mean(trajs, "num_chunks"),
        "retrievals": metric_mean(trajs, "retrievals"),
        "tokens_read": metric_mean(trajs, "tokens_read"),
        "stop_rate": 100.0 * len(stopped) / n,
        "stop_step": math.fsum(t.metrics["stop_step"] for t in stopped) / len(stopped) if stopped else 0.0,
        "num_tasks": float(len(groups)),
        "seconds": seconds,
    }


def evaluate_reading(rollout: Rollout, wf_cfg: Any, tasks_by_length: dict[int, list[Task]], temperature: float,
                     seed: int, **labels: Any) -> dict[str, dict[str, dict[str, float]]]:
    """The InfMem demo's held-out protocol (memrl.recipes.infmem): {length (str): {"greedy": summary, "sampled":
    summary}}, one trajectory per task each (sampled at `temperature`, top_p 1, no top-k), both seeded with
    `seed`; each summary is `reading_summary_of`. `labels`: the rows' (evaluate_tasks)."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    proto = EvalProtocol(greedy=True, samples=1, temperature=temperature, seed=seed, metrics=(), keep_groups=True)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for length, tasks in tasks_by_length.items():
        res = evaluate_policy(rollout, base, {length: tasks}, proto, **labels)[length]
        out[str(length)] = {mode: reading_summary_of(r.groups, r.seconds) for mode, r in res.items()}
        print(f"  {length} chunks: " + ", ".join(f"{m} {s['accuracy']:.1f} ± {s['accuracy_se']:.1f}%, "
                                                 f"{s['model_calls']:.1f} calls" for m, s in out[str(length)].items()))
    return out


# ---------------------------------------------------------------- MEM1


def mem1_summary(groups: list[Group]) -> dict[str, float]:
    """One trajectory per task: accuracy (all objectives right, %) and its SE over tasks (sample std), the
    objectives' mean accuracy (%), the per-task means of the peak context (the workflow's
    peak_context_tokens: the longest prompt + reply) and of the mean prompt length over the task's calls,
    turns, the share answered (%), and the number of tasks."""
    trajs = [t for g in groups for t in g.trajectories]
    if len(trajs) != len(groups):
        raise ValueError(f"mem1_summary: {len(trajs)} trajectories for {len(groups)} tasks; one per task needed")
    acc, se = mean_and_se([t.metrics.get("multiq_all_correct", 0.0) for t in trajs])

    def mean(values: list[float]) -> float:
        return math.fsum(values) / len(values)

    return {
        "accuracy": 100.0 * acc, "accuracy_se": 100.0 * se,
        "objective_accuracy": 100.0 * mean([t.metrics.get("multiq_subq_accuracy", 0.0) for t in trajs]),
        "peak_context_tokens": mean([t.metrics["peak_context_tokens"] for t in trajs]),
        "mean_context_tokens": mean([mean([s.info["context_tokens"] for s in t.segments]) for t in trajs]),
        "turns": mean([t.metrics["turns"] for t in trajs]),
        "answered": 100.0 * mean([t.metrics["answered"] for t in trajs]),
        "num_tasks": float(len(trajs)),
    }


def evaluate_mem1(rollout: Rollout, wf_cfg: Any, tasks: dict[int, list[Task]], temperature: float,
                  seed: int, **labels: Any) -> dict[str, dict[str, dict[str, float]]]:
    """The MEM1 demo's held-out protocol (memrl.recipes.mem1): {"greedy": {k: summary}, "sampled": {k: summary}}
    over the tasks of each objective count k (one trajectory per task each; sampled at `temperature`, top_p 1,
    no top-k; both seeded with `seed`); each summary is `mem1_summary` plus the evaluation's `seconds`.
    `labels`: the rows' (evaluate_tasks; the bucket is k)."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    out: dict[str, dict[str, dict[str, float]]] = {"greedy": {}, "sampled": {}}
    for k, ts in tasks.items():
        for mode, temp in (("greedy", 0.0), ("sampled", temperature)):
            res = evaluate_tasks(rollout, base, ts, 1, temp, seed, metrics=(), keep_groups=True, bucket=k, **labels)
            out[mode][str(k)] = {**mem1_summary(res.groups), "seconds": res.seconds}
    return out
