"""The demos' per-method summaries of a held-out evaluation, over its rows (memrl.eval.evaluator: one row per
trajectory, its reward and metrics): MemAct's (peak context, prunes, overflow), the context-management family's
(peak / mean context, tokens discarded, branches, summaries, stopped by the budget), the reading methods'
(MemAgent / InfMem on the synthetic task: model calls, chunks read, retrievals, stop rate) and MEM1's
(objectives right, peak and mean context per objective count). Each method's evaluation is greedy and
sampled through `evaluate_rows`, so the statistics are the evaluator's; a scripted agent's summary is over
its played groups' rows (`evaluation_rows`). The demos' tables are declared by the methods
(memrl.recipes.tables).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from memrl.eval.evaluator import Rollout, accuracy, evaluate_rows, per_task, row_mean
from memrl.types import Task

Row = Mapping[str, Any]


def one_per_task(rows: Sequence[Row], who: str) -> int:
    """The number of tasks of rows with one trajectory per task; fails otherwise."""
    n = len(per_task(rows))
    if n != len(rows):
        raise ValueError(f"{who}: {len(rows)} rows for {n} tasks; one trajectory per task needed")
    return n


def greedy_and_sampled(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float, seed: int,
                       **labels: Any) -> list[dict[str, Any]]:
    """The rows of a greedy then a sampled evaluation (at `temperature`), one trajectory per task each, both
    seeded with `seed`. `labels`: evaluate_rows' (the rows' bucket: the length or objective count, "all" for
    one task set; the policy, held-out digest and rows file: memrl.recipes.parts.policy_labels)."""
    return [r for temp in (0.0, temperature) for r in evaluate_rows(rollout, wf_cfg, tasks, 1, temp, seed, **labels)]


# ---------------------------------------------------------------- MemAct


MEMACT_SE_DDOF = 0
"""The MemAct demo's standard error: binomial, sqrt(p (1 - p) / tasks) (one 0/1 sample per task)."""


def memact_summary(rows: Sequence[Row]) -> dict[str, float]:
    """A MemAct evaluation's rows (one trajectory per task) in the MemAct demo's terms: accuracy (all sub-questions
    right, %) and its binomial SE, sub-question accuracy, mean / peak working context, the largest peak, prunes
    per task, overflow (stopped by the context budget, %), turns, and accuracy by question count."""
    n = one_per_task(rows, "memact_summary")
    acc, se = accuracy(rows, MEMACT_SE_DDOF)
    out = {
        "accuracy": acc,
        "accuracy_se": se,
        "subq_accuracy": 100.0 * row_mean(rows, "multiq_subq_accuracy"),
        "mean_context_tokens": row_mean(rows, "mean_context_tokens"),
        "peak_context_tokens": row_mean(rows, "peak_context_tokens"),
        "max_context_tokens": max(r["metrics"]["peak_context_tokens"] for r in rows),
        "prunes_per_task": row_mean(rows, "prunes"),
        "failed_prunes_per_task": row_mean(rows, "failed_prunes"),
        "overflow": 100.0 * row_mean(rows, "stop_context_budget"),
        "turns": row_mean(rows, "turns"),
        "num_tasks": float(n),
    }
    questions = [int(r["metrics"].get("multiq_questions", 0)) for r in rows]
    for k in sorted(set(questions)):
        sub = [float(r["reward"]) for r, q in zip(rows, questions, strict=True) if q == k]
        out[f"accuracy_{k}q"] = 100.0 * (math.fsum(sub) / len(sub))
    return out


def evaluate_memact(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                    seed: int, prune_tool: bool = True, **labels: Any) -> dict[str, dict[str, float]]:
    """The MemAct demo's held-out protocol: {"greedy": summary, "sampled": summary}, one trajectory per task
    each (sampled at `temperature`, top_p 1, no top-k), the prune tool offered and never withheld (or, with
    `prune_tool=False`, withheld in every trajectory: the search-only baseline), both seeded with `seed`;
    each summary is `memact_summary` plus the evaluation's `seconds`. `labels`: the rows' (evaluate_rows)."""
    base = replace(wf_cfg, no_prune_prob=0.0, prune_tool=prune_tool, top_p=1.0, top_k=-1)
    return greedy_and_sampled(rollout, base, tasks, temperature, seed, memact_summary, bucket="all", **labels)


# ---------------------------------------------------------------- the context-management family's metrics


CONTEXT_SE_DDOF = 1
"""The context-management evaluations' standard error: the sample standard deviation over tasks / sqrt(tasks)."""


def context_summary(rows: Sequence[Row]) -> dict[str, float]:
    """A fold / summarize / sliding_window evaluation's rows (one trajectory per task) in the terms of
    benchmarks/context_management.py: accuracy (all sub-questions right, %) and its SE over tasks, per-task
    means of peak / mean working context, tokens discarded, turns, branches, summaries, the share stopped by
    the budget (%), and the number of tasks."""
    n = one_per_task(rows, "context_summary")
    acc, se = accuracy(rows, CONTEXT_SE_DDOF)
    return {
        "accuracy": acc,
        "accuracy_se": se,
        "peak_context_tokens": row_mean(rows, "peak_context_tokens"),
        "mean_context_tokens": row_mean(rows, "mean_context_tokens"),
        "tokens_discarded": row_mean(rows, "tokens_discarded"),
        "turns": row_mean(rows, "turns"),
        "branches": row_mean(rows, "branches"),
        "summaries": row_mean(rows, "summaries"),
        "stopped_by_budget": 100.0 * row_mean(rows, "stop_context_budget"),
        "num_tasks": float(n),
    }


def evaluate_context(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                     seed: int, **labels: Any) -> dict[str, dict[str, float]]:
    """The context demo's held-out protocol (memrl.recipes.context): {"greedy": summary, "sampled": summary},
    one trajectory per task each (sampled at `temperature`, top_p 1, no top-k), both seeded with `seed`; each
    summary is `context_summary` plus the evaluation's `seconds`. `labels`: the rows' (evaluate_rows)."""
    return greedy_and_sampled(rollout, replace(wf_cfg, top_p=1.0, top_k=-1), tasks, temperature, seed,
                              context_summary, bucket="all", **labels)


# ---------------------------------------------------------------- reading agents (MemAgent / InfMem)


def outcome(row: Row) -> float:
    """A reading agent's exact-match outcome (memrl.workflows.boxed_em_outcome): InfMem's reward mixes it with its
    early-stop and format terms and reports it as the metric infmem_outcome; MemAgent's reward is the outcome."""
    return row["metrics"].get("infmem_outcome", row["reward"])


def reading_summary(rows: Sequence[Row], seconds: float = 0.0) -> dict[str, float]:
    """A MemAgent / InfMem evaluation's rows in the terms of the InfMem demo (memrl.recipes.infmem): accuracy (%,
    the exact-match `outcome`, whatever the workflow's training reward mixes in) and its SE over tasks (each
    task's mean over its samples, ddof 1); per trajectory the means of model calls, chunks read (memory calls),
    the document's chunks, retrievals and tokens read (the workflows' metrics); the share that stopped early (%)
    and the mean stop step of those that did (0 when none did)."""
    if not rows:
        raise ValueError("reading_summary: no rows")
    acc, se = accuracy(rows, 1, outcome)
    stopped = [r for r in rows if r["metrics"].get("stopped", 0.0)]
    return {
        "accuracy": acc,
        "accuracy_se": se,
        "model_calls": row_mean(rows, "model_calls"),
        "chunks_read": row_mean(rows, "memory_steps"),
        "chunks": row_mean(rows, "num_chunks"),
        "retrievals": row_mean(rows, "retrievals"),
        "tokens_read": row_mean(rows, "tokens_read"),
        "stop_rate": 100.0 * len(stopped) / len(rows),
        "stop_step": row_mean(stopped, "stop_step") if stopped else 0.0,
        "num_tasks": float(len(per_task(rows))),
        "seconds": seconds,
    }


def evaluate_reading(rollout: Rollout, wf_cfg: Any, tasks_by_length: dict[int, list[Task]], temperature: float,
                     seed: int, **labels: Any) -> dict[str, dict[str, dict[str, float]]]:
    """The InfMem demo's held-out protocol (memrl.recipes.infmem): {length (str): {"greedy": summary, "sampled":
    summary}}, one trajectory per task each (sampled at `temperature`, top_p 1, no top-k), both seeded with
    `seed`, the length the rows' bucket; each summary is `reading_summary`. `labels`: the rows' (evaluate_rows)."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for length, tasks in tasks_by_length.items():
        out[str(length)] = greedy_and_sampled(rollout, base, tasks, temperature, seed, reading_summary, bucket=length,
                                              **labels)
        print(f"  {length} chunks: " + ", ".join(f"{m} {s['accuracy']:.1f} ± {s['accuracy_se']:.1f}%, "
                                                 f"{s['model_calls']:.1f} calls" for m, s in out[str(length)].items()))
    return out


# ---------------------------------------------------------------- MEM1


def mem1_summary(rows: Sequence[Row]) -> dict[str, float]:
    """One trajectory per task: accuracy (all objectives right, %) and its SE over tasks (sample std), the
    objectives' mean accuracy (%), the per-task means of the peak context (the workflow's
    peak_context_tokens: the longest prompt + reply) and of the mean prompt length over the task's calls
    (mean_context_tokens), turns, the share answered (%), and the number of tasks."""
    n = one_per_task(rows, "mem1_summary")
    acc, se = accuracy(rows, 1, lambda r: r["metrics"].get("multiq_all_correct", 0.0))
    return {
        "accuracy": acc, "accuracy_se": se,
        "objective_accuracy": 100.0 * row_mean(rows, "multiq_subq_accuracy"),
        "peak_context_tokens": row_mean(rows, "peak_context_tokens"),
        "mean_context_tokens": row_mean(rows, "mean_context_tokens"),
        "turns": row_mean(rows, "turns"),
        "answered": 100.0 * row_mean(rows, "answered"),
        "num_tasks": float(n),
    }


def evaluate_mem1(rollout: Rollout, wf_cfg: Any, tasks: dict[int, list[Task]], temperature: float,
                  seed: int, **labels: Any) -> dict[str, dict[str, dict[str, float]]]:
    """The MEM1 demo's held-out protocol (memrl.recipes.mem1): {"greedy": {k: summary}, "sampled": {k: summary}}
    over the tasks of each objective count k (one trajectory per task each; sampled at `temperature`, top_p 1,
    no top-k; both seeded with `seed`); each summary is `mem1_summary` plus the evaluation's `seconds`.
    `labels`: the rows' (evaluate_rows; the bucket is k)."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    out: dict[str, dict[str, dict[str, float]]] = {"greedy": {}, "sampled": {}}
    for k, ts in tasks.items():
        for mode, s in greedy_and_sampled(rollout, base, ts, temperature, seed, mem1_summary, bucket=k,
                                          **labels).items():
            out[mode][str(k)] = s
    return out
