"""The context-management family at one working-context budget, on the CPU lookup task (issue 44).

    .venv/bin/python benchmarks/context_management.py                 # 40 held-out tasks, the full table
    .venv/bin/python benchmarks/context_management.py --dry-run       # 2 tasks, to check that it runs

The task (memrl.data.synthetic_memact with `padding_words`): each task asks `--sub-questions` facts, each
search result costs about 2 x `--padding` filler words, so the unmanaged context passes `--budget` tokens
before the last fact is found, while an agent that folds (branch/return) or summarizes stays inside it.
The held-out tasks are fixed before any run (seed `--heldout-seed`, 901: no other split uses it).

Policies: the SCRIPTED agents of the cold start (memrl.demonstrators.context; flawless, late_prob 0) played
through the real workflows with the tiny models' tokenizer. They isolate what each management rule does to a
competent policy at the budget; they are not trained models. Training each workflow (SFT on these agents,
then GRPO / FoldGRPO, 3 seeds, greedy and sampled evaluation) is `memrl train workflow=... ` + `memrl eval`
(docs/guides/context_management.md); its table is not produced here.

Rows: ReAct without management at the budget (sliding_window, window_turns=0) and unbounded; the sliding
window (window_turns 2); summarize; fold. Columns: accuracy (all sub-questions right) with its standard error
over tasks, mean peak and mean working context, peak as a share of the unbounded ReAct peak, tokens
discarded, turns, branches, summaries per task, and the runs stopped by the budget.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from typing import Any

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
    from memrl.demonstrators import ScriptedEngine
    from memrl.demonstrators.context import FoldDemonstrator, SearchDemonstrator, SummaryDemonstrator
    from memrl.runtime import rollout_once
    from memrl.workflows import parse_workflow

    agent = {"search": SearchDemonstrator(), "fold": FoldDemonstrator(), "summary": SummaryDemonstrator()}[method.agent]
    section = {**method.workflow, "retriever_scope": "task", "max_turn_tokens": 96, "temperature": 0.0,
               "system_template": "Answer the questions by searching.", "max_assistant_turns": max_turns,
               "answer_instruction": "End with FINAL_ANSWER: a JSON object of the answers.",
               "max_context_tokens": 10**7 if method.unbounded else budget}
    spec, cfg = parse_workflow(section)
    groups = rollout_once(tasks, spec, ScriptedEngine(agent, tokenizer=tokenizer), cfg, n=1, concurrency=64, seed=0)
    return [g.trajectories[0] for g in groups]


def summarize_rows(trajs: list[Any]) -> dict[str, float]:
    n = len(trajs)
    acc = [float(t.reward or 0.0) for t in trajs]
    mean = sum(acc) / n
    se = math.sqrt(sum((a - mean) ** 2 for a in acc) / (n - 1) / n) if n > 1 else 0.0

    def avg(key: str) -> float:
        return sum(t.metrics.get(key, 0.0) for t in trajs) / n

    return {"accuracy": mean, "se": se, "peak": avg("peak_context_tokens"), "mean_ctx": avg("mean_context_tokens"),
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
        lines.append(f"| {name} | {b} | {100 * r['accuracy']:.1f} +- {100 * r['se']:.1f} | {r['peak']:.0f} | {share} "
                     f"| {r['mean_ctx']:.0f} | {r['discarded']:.0f} | {r['turns']:.1f} | {r['branches']:.2f} "
                     f"| {r['summaries']:.2f} | {100 * r['over_budget']:.0f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=40, help="held-out tasks (default 40)")
    ap.add_argument("--heldout-seed", type=int, default=HELDOUT_SEED)
    ap.add_argument("--budget", type=int, default=2600, help="working-context budget in tokens (default 2600)")
    ap.add_argument("--padding", type=int, default=200, help="filler words per document (default 200)")
    ap.add_argument("--sub-questions", type=int, default=5, help="facts each task asks (default 5)")
    ap.add_argument("--max-turns", type=int, default=24)
    ap.add_argument("--dry-run", action="store_true", help="2 tasks: check that the script runs")
    args = ap.parse_args(argv)
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
