"""The context-management family at one working-context budget, on the CPU lookup task (issue 44).

    .venv/bin/python benchmarks/context_management.py                 # 40 held-out tasks, the full table
    .venv/bin/python benchmarks/context_management.py --dry-run       # 2 tasks, to check that it runs

The task (memrl.data.synthetic_memact with `padding_words`): each task asks `--sub-questions` facts, each
search result costs about 2 x `--padding` filler words, so the unmanaged context passes `--budget` tokens
before the last fact is found, while an agent that folds (branch/return) or summarizes stays inside it.
The held-out tasks are fixed before any run (seed `--heldout-seed`, 901: no other split uses it).

Policies: the SCRIPTED agents of the cold start (memrl.demonstrators.context; flawless, late_prob 0) played
through the real workflows with the tiny models' tokenizer. They isolate what each management rule does to a
competent policy at the budget; they are not trained models.

The trained comparison (docs/results/context_management.md): per method a tiny model trained from scratch by
`memrl demo --agent context` (memrl.recipes.context: cold start on these agents, then GRPO, or FoldGRPO for fold,
with and without its process rewards), 3 training seeds, greedy and sampled on held-out tasks of seed 901, at
3 facts per task and 40 filler words:

    C="task.sub_questions=[3] sft.num_tasks=1000 eval.num_tasks=200 rl_tasks=1000 train.trainer.steps=20 threads=1 train.engine.hf.kv_cache=padded train.trainer.prefix_sharing=never"
    memrl demo --agent context --out runs/ctx/react --seeds 0,1,2 method=react $C sft.epochs=6
    memrl demo --agent context --out runs/ctx/window --seeds 0,1,2 method=window $C sft.epochs=6 sft.max_rows=4000
    memrl demo --agent context --out runs/ctx/summarize --seeds 0,1,2 method=summarize $C sft.epochs=6 \\
        workflow.summary_fraction=0.5
    memrl demo --agent context --out runs/ctx/fold --seeds 0,1,2 method=fold $C sft.epochs=12
    memrl demo --agent context --out runs/ctx/fold_no_process --seeds 0,1,2 method=fold_no_process $C \\
        sft.epochs=12 sft_from=runs/ctx/fold
    .venv/bin/python benchmarks/context_management.py --trained runs/ctx

The process-reward ablation from a flawed cold start (the scripted folding agent searches one fact in the
main thread with probability 0.2), 60 RL steps:

    L="task.sub_questions=[3] sft.num_tasks=1000 eval.num_tasks=200 rl_tasks=1000 train.trainer.steps=60 threads=1 train.engine.hf.kv_cache=padded train.trainer.prefix_sharing=never"
    memrl demo --agent context --out runs/ctx_late/fold --seeds 0,1,2 method=fold $L sft.epochs=12 sft.late_prob=0.2
    memrl demo --agent context --out runs/ctx_late/fold_no_process --seeds 0,1,2 method=fold_no_process $L \\
        sft.epochs=12 sft.late_prob=0.2 sft_from=runs/ctx_late/fold
    .venv/bin/python benchmarks/context_management.py --trained runs/ctx_late

`--trained ROOT` reads ROOT/<method>/seed<k>/results.json (or ROOT/<method>/<capability>/seed<k>/, the
layout of --seeds) and prints, per decoding, each method's SFT and SFT+RL rows: mean +- standard error over
the training seeds (sd with ddof 1 / sqrt(seeds)) of each run's held-out accuracy and context metrics, and
the peak as a share of the unbounded scripted ReAct agent's peak on the same tasks (each run's summary row of
policy react_unbounded, in its own tokens); then FoldGRPO's process rewards on vs off, fold minus
fold_no_process after RL, paired by seed (the two share a cold start through `sft_from`).

Rows: ReAct without management at the budget (sliding_window, window_turns=0) and unbounded; the sliding
window (window_turns 2); summarize; fold. Columns: accuracy (all sub-questions right) with its standard error
over tasks, mean peak and mean working context, peak as a share of the unbounded ReAct peak, tokens
discarded, turns, branches, summaries per task, and the runs stopped by the budget.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.eval.fields import one
from memrl.eval.stats import cell, group_stats, nest, stat
from memrl.recipes.context import RECIPE
from memrl.recipes.seeds import run_rows
from memrl.recipes.seeds import trained_runs as seed_runs

HELDOUT_SEED = 901


@dataclass(frozen=True)
class Method:
    name: str
    workflow: dict[str, Any]
    agent: str  # search | fold | summary
    unbounded: bool = False


METHODS = (
    Method("react (unbounded)", {"name": "sliding_window", "window_turns": 0}, "search", unbounded=True),
    Method("react", {"name": "sliding_window", "window_turns": 0}, "search"),
    Method("sliding_window k=2", {"name": "sliding_window", "window_turns": 2}, "search"),
    Method("summarize", {"name": "summarize", "summary_fraction": 0.8}, "summary"),
    Method("fold", {"name": "fold"}, "fold"),
)


def run_method(method: Method, tasks: list[Any], tokenizer: Any, budget: int, max_turns: int) -> list[Any]:
    """The trajectories of `method`'s scripted agent on `tasks` (one each)."""
    from memrl.demonstrators.stages import context_demonstrations, context_demonstrator
    from memrl.workflows import parse_workflow

    section = {**method.workflow, "retriever_scope": "task", "max_turn_tokens": 96, "temperature": 0.0,
               "system_template": "Answer the questions by searching.", "max_assistant_turns": max_turns,
               "answer_instruction": "End with FINAL_ANSWER: a JSON object of the answers.",
               "max_context_tokens": 10**7 if method.unbounded else budget}
    spec, cfg = parse_workflow(section)
    groups = context_demonstrations(tasks, tokenizer, spec.name, cfg, context_demonstrator(method.agent))
    return [g.trajectories[0] for g in groups]


def summarize_rows(trajs: list[Any]) -> dict[str, Any]:
    n = len(trajs)

    def avg(key: str) -> float:
        return sum(t.metrics.get(key, 0.0) for t in trajs) / n

    return {"accuracy": stat(float(t.reward or 0.0) for t in trajs), "peak": avg("peak_context_tokens"), "mean_ctx": avg("mean_context_tokens"),
            "discarded": avg("tokens_discarded"), "turns": avg("turns"), "branches": avg("branches"),
            "summaries": avg("summaries"), "over_budget": avg("stop_context_budget"), "n": float(n)}


def table(rows: list[tuple[str, dict[str, float]]], budget: int) -> str:
    base = next((r["peak"] for name, r in rows if name == "react (unbounded)"), None)
    lines = ["| method | budget | accuracy | peak context | vs unbounded ReAct | mean context | tokens discarded "
             "| turns | branches | summaries | stopped by budget |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rows:
        share = f"{100 * r['peak'] / base:.0f}%" if base else "-"
        b = "none" if name == "react (unbounded)" else str(budget)
        lines.append(f"| {name} | {b} | {cell(r['accuracy'], scale=100)} | {r['peak']:.0f} | {share} "
                     f"| {r['mean_ctx']:.0f} | {r['discarded']:.0f} | {r['turns']:.1f} | {r['branches']:.2f} "
                     f"| {r['summaries']:.2f} | {100 * r['over_budget']:.0f}% |")
    return "\n".join(lines)


TRAINED_METHODS = ("react", "window", "summarize", "fold", "fold_no_process")
TRAINED_FIELDS = ("accuracy", "peak_context_tokens", "mean_context_tokens", "tokens_discarded", "turns", "branches",
                  "summaries", "stopped_by_budget")


def trained_runs(root: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """{method: [(run dir, results.json)]} of the finished runs under ROOT/<method>/[<capability>/]seed<k>
    (memrl.recipes.seeds.trained_runs over TRAINED_METHODS)."""
    return seed_runs(root, TRAINED_METHODS)


def summary_row(res: dict[str, Any], policy: str, mode: str) -> dict[str, Any]:
    """A run's summary row of `policy` and decoding `mode` (results.json's "summary"); fails in one line."""
    row = one(res["summary"], policy=policy, decoding=mode)
    if row is None:
        raise SystemExit(f"--trained: a {res.get('method')} run has no summary row of {policy}, {mode}")
    return dict(row)


def trained_aggregate(runs: dict[str, list[tuple[Path, dict[str, Any]]]]) -> dict[str, Any]:
    """{method: {"seeds", "eval_tasks", "budget", policy: {decoding: {field: (mean, se)}, "vs_unbounded"}}}:
    mean +- SE over the runs (seeds) of each run's held-out summary; "vs_unbounded" is the mean over runs of
    peak / the run's unbounded scripted ReAct peak. Fails when runs evaluated different numbers of tasks."""
    tasks = {res["facts"]["budget"]["eval_tasks"] for rs in runs.values() for _, res in rs}
    if len(tasks) > 1:
        raise SystemExit(f"--trained: runs evaluated different numbers of held-out tasks: {sorted(tasks)}")
    rows = [{**row, "method": method} for method, rs in runs.items() for row in run_rows(RECIPE, rs, TRAINED_FIELDS)]
    for method, rs in runs.items():  # per run: its budget, and its peak / its unbounded scripted ReAct peak
        for _, r in rs:
            rows.append({"method": method, "policy": "run", "decoding": "all", "bucket": "all", "field": "budget",
                         "value": float(r["facts"]["budget"]["max_context_tokens"])})
            unbounded = summary_row(r, "react_unbounded", "greedy")["peak_context_tokens"]
            rows += [{"method": method, "policy": policy, "decoding": mode, "bucket": "all", "field": "vs_unbounded",
                      "value": summary_row(r, policy, mode)["peak_context_tokens"] / unbounded}
                     for policy in ("sft", "rl") for mode in ("greedy", "sampled")]
    agg = group_stats(rows, ("method", "policy", "decoding", "bucket", "field"))
    return {method: {"seeds": [d.name for d, _ in rs], "eval_tasks": rs[0][1]["facts"]["budget"]["eval_tasks"],
                     "budget": agg[method, "run", "all", "all", "budget"],
                     **{policy: {mode: {f: agg[method, policy, mode, "all", f] for f in (*TRAINED_FIELDS, "vs_unbounded")}
                                 for mode in ("greedy", "sampled")} for policy in ("sft", "rl")}}
            for method, rs in runs.items()}


def trained_table(agg: dict[str, Any]) -> str:
    lines = []
    for mode in ("greedy", "sampled"):
        lines += [f"{mode}:", "", "| method | policy | seeds | accuracy | peak context | vs unbounded ReAct | mean context "
                  "| tokens discarded | turns | branches | summaries | stopped by budget |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for method, e in agg.items():
            for policy, label in (("sft", "SFT"), ("rl", "SFT + RL")):
                r = e[policy][mode]
                lines.append(f"| {method} | {label} | {len(e['seeds'])} | {cell(r['accuracy'])} "
                             f"| {cell(r['peak_context_tokens'], 0)} | {cell(r['vs_unbounded'], 0, scale=100)}% "
                             f"| {cell(r['mean_context_tokens'], digits=0)} | {cell(r['tokens_discarded'], digits=0)} "
                             f"| {cell(r['turns'])} | {cell(r['branches'], digits=2)} | {cell(r['summaries'], digits=2)} "
                             f"| {cell(r['stopped_by_budget'], digits=0)}% |")
        lines.append("")
    return "\n".join(lines)


def process_reward_ablation(runs: dict[str, list[tuple[Path, dict[str, Any]]]]) -> dict[str, Any] | None:
    """FoldGRPO's process rewards on vs off, paired by seed: for each seed with a fold and a fold_no_process run,
    fold minus fold_no_process after RL (accuracy points, peak context tokens, turns, branches, % stopped by the
    budget: the folding the process rewards aim at), per decoding, as mean +- SE over the seeds. None when no
    seed has both. Fails in one line when a pair does not share its cold start (the fold_no_process run's SFT
    evaluation must equal the fold run's, as `sft_from` makes it)."""
    fold = {d.name: r for d, r in runs.get("fold", [])}
    pairs = [(d.name, fold[d.name], r) for d, r in runs.get("fold_no_process", []) if d.name in fold]
    if not pairs:
        return None
    for k, on, off in pairs:
        if [s for s in on["summary"] if s["policy"] == "sft"] != [s for s in off["summary"] if s["policy"] == "sft"]:
            raise SystemExit(f"--trained: fold/{k} and fold_no_process/{k} do not share a cold start (their SFT "
                             "evaluations differ); run fold_no_process with sft_from=<the fold sweep's root>")
    fields = ("accuracy", "peak_context_tokens", "turns", "branches", "stopped_by_budget")
    rows = [{"decoding": mode, "field": f, "value": summary_row(on, "rl", mode)[f] - summary_row(off, "rl", mode)[f]}
            for _, on, off in pairs for mode in ("greedy", "sampled") for f in fields]
    return {"seeds": [k for k, _, _ in pairs], **nest(group_stats(rows, ("decoding", "field")))}


def ablation_lines(abl: dict[str, Any]) -> list[str]:
    lines = [f"FoldGRPO's process rewards on - off (fold - fold_no_process after RL, the same cold start, paired by "
             f"seed: {', '.join(abl['seeds'])}):", ""]
    for mode in ("greedy", "sampled"):
        r = abl[mode]
        lines.append(f"- {mode}: accuracy {cell(r['accuracy'], sign=True)} points, peak context "
                     f"{cell(r['peak_context_tokens'], digits=0, sign=True)} tokens, turns {cell(r['turns'], sign=True)}, "
                     f"branches {cell(r['branches'], digits=2, sign=True)}, stopped by the budget "
                     f"{cell(r['stopped_by_budget'], digits=0, sign=True)} points")
    return lines + [""]


def main_trained(root: Path) -> int:
    runs = trained_runs(root)
    if not runs:
        raise SystemExit(f"--trained: no finished run under {root}/<method>/seed<k>/results.json "
                         f"(methods {', '.join(TRAINED_METHODS)})")
    agg = trained_aggregate(runs)
    budgets = ", ".join(f"{m} {cell(e['budget'], digits=0)}" for m, e in agg.items())
    print(f"context management, trained (memrl demo --agent context): {next(iter(agg.values()))['eval_tasks']} "
          f"held-out tasks; mean ± SE over training seeds; budgets (tokens of each run's tokenizer): {budgets}")
    print(trained_table(agg))
    abl = process_reward_ablation(runs)
    if abl is not None:
        print("\n".join(ablation_lines(abl)))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=40, help="held-out tasks (default 40)")
    ap.add_argument("--heldout-seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--budget", type=int, default=2600, help="working-context budget in tokens (default 2600)")
    ap.add_argument("--padding", type=int, default=200, help="filler words per document (default 200)")
    ap.add_argument("--sub-questions", type=int, default=5, help="facts each task asks (default 5)")
    ap.add_argument("--max-turns", type=int, default=24)
    ap.add_argument("--dry-run", action="store_true", help="2 tasks: check that the script runs")
    ap.add_argument("--trained", type=Path, default=None, metavar="ROOT",
                    help="print the trained table of the finished runs ROOT/<method>/seed<k>/results.json instead")
    args = ap.parse_args(argv)
    if args.trained is not None:
        return main_trained(args.trained)
    if args.tasks < 2 or args.budget < 1 or args.padding < 0 or not 1 <= args.sub_questions <= 6:
        ap.error("--tasks must be >= 2, --budget >= 1, --padding >= 0, --sub-questions in 1..6")
    from transformers import AutoTokenizer

    from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks
    from memrl.models.tiny import cached_tiny_model

    n = 2 if args.dry_run else args.tasks
    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    tasks = make_tasks(MemActTaskConfig(sub_questions=[args.sub_questions], padding_words=args.padding), n,
                       seed=args.heldout_seed, prefix="heldout")
    rows = [(m.name, summarize_rows(run_method(m, tasks, tok, args.budget, args.max_turns))) for m in METHODS]
    print(f"context management on the CPU lookup task: {n} held-out tasks (seed {args.heldout_seed}), "
          f"{args.sub_questions} facts each, {args.padding} filler words per document, budget {args.budget} tokens; "
          "policy: the scripted cold-start agents (not trained)")
    print(table(rows, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
