"""InfMem's and MEM1's defining effects, measured with SCRIPTED ORACLE policies (no training) on CPU.

    .venv/bin/python benchmarks/infmem_mem1_effects.py [--part infmem|mem1|both] [--tasks 32]
        [--lengths 4,8,16,32] [--objectives 2,4,8,16] [--seed 0]

What it measures (the workflows' mechanics, with policies that act perfectly by rule, not learned ones):
- InfMem vs MemAgent on memrl's synthetic one-fact tasks (memrl.data.synthetic) of L pieces of 48 words
  (cut into chunks of 48 tokens): the same
  oracle reading rule (keep the asked fact when seen, answer from the memory) under `workflow=memagent`
  (reads every chunk) and `workflow=infmem` (the planner retrieves the asked key with top_k 1 and says
  STOP once the memory holds the fact): accuracy, model calls and tokens read per task.
- MEM1 vs a full-history agent on synthetic multi-objective tasks with k objectives
  (memrl.data.synthetic_memact's per-task fact sheets): one search per objective, the internal state
  carrying the answers found so far, then the answer; the peak context (longest prompt) per task under
  `context=latest_state` and `context=full_history`, and what the context carries beyond the first
  prompt (carried_tokens = peak - first; the first prompt itself lists the k questions).

Both policies answer every task right by construction: the accuracy column checks the plumbing (the
retriever finds the fact, the state carries it), not a model. The oracles are memrl.demonstrators.infmem.
ReadingDemonstrator and memrl.demonstrators.mem1.StateDemonstrator, the cold-start agents of the trained comparisons (3
training seeds, evaluation fixed before), which are not part of this script: `memrl demo --agent infmem`
(table: benchmarks/infmem_trained.py --trained ROOT) and `memrl demo --agent mem1` (benchmarks/mem1_trained.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys

from memrl.data.synthetic import SyntheticConfig, make_tasks
from memrl.data.synthetic_memact import MemActTaskConfig
from memrl.data.synthetic_memact import make_tasks as make_multi_tasks
from memrl.demonstrators.engine import ScriptedEngine
from memrl.demonstrators.infmem import ReadingDemonstrator
from memrl.demonstrators.mem1 import StateDemonstrator
from memrl.types import Task
from memrl.workflows import get_workflow, parse_workflow


def _rollout(spec_name: str, tasks: list[Task], tokenizer, script, overrides: dict) -> list:
    """(trajectory, score) per task of `script` (or, when None, the ReadingDemonstrator in the workflow's
    templates) played through `spec_name` configured by `overrides`."""
    spec = get_workflow(spec_name)
    _, cfg = parse_workflow({"name": spec_name, "temperature": 0.0, **overrides})
    script = script if script is not None else ReadingDemonstrator.for_config(spec_name, cfg)
    out = []
    for t in tasks:
        engine = ScriptedEngine(script, tokenizer)
        traj = asyncio.run(spec.run(t, engine, cfg, random.Random(0)))
        score = spec.reward(t, traj)
        out.append((traj, score))
    return out


def infmem_table(tasks_per_length: int, lengths: list[int], seed: int, tokenizer, chunk_words: int = 48) -> list[dict]:
    rows = []
    for n in lengths:
        tasks = make_tasks(SyntheticConfig(num_chunks=n, chunk_words=chunk_words, bridge_fraction=0.0),
                           tasks_per_length, seed)
        common = {"chunk_tokens": chunk_words, "max_memory_tokens": 64, "max_final_tokens": 16}
        for name, extra in (("memagent", {}), ("infmem", {"max_plan_tokens": 64,
                                                          "retrieve_passage_tokens": chunk_words // 2})):
            res = _rollout(name, tasks, tokenizer, None, {**common, **extra})
            acc = [float(t.final_answer == task.answers[0]) for (t, _), task in zip(res, tasks, strict=True)]
            rows.append({"workflow": name, "pieces": n,
                         "chunks": statistics.mean(t.metrics["num_chunks"] for t, _ in res), "tasks": len(tasks),
                         "accuracy": 100 * statistics.mean(acc),
                         "model_calls": statistics.mean(len(t.segments) for t, _ in res),
                         "tokens_read": statistics.mean(t.metrics["tokens_read"] for t, _ in res)})
    return rows


def mem1_table(tasks_per_k: int, ks: list[int], seed: int, tokenizer) -> list[dict]:
    rows = []
    for k in ks:
        cfg = MemActTaskConfig(num_names=max(16, k), entities_per_task=max(6, k), sub_questions=[k])
        tasks = make_multi_tasks(cfg, tasks_per_k, seed)
        for mode in ("latest_state", "full_history"):
            over = {"max_turns": k + 1, "max_turn_tokens": 400, "retriever_scope": "task", "topk": 1,
                    "context": mode, "hint_turns_left": "", "hint_last_turn": ""}
            res = _rollout("mem1", tasks, tokenizer, StateDemonstrator(), over)
            rows.append({"context": mode, "objectives": k, "tasks": len(tasks),
                         "accuracy": 100 * statistics.mean(s.metrics["multiq_all_correct"] for _, s in res),
                         "model_calls": statistics.mean(len(t.segments) for t, _ in res),
                         "peak_prompt_tokens": statistics.mean(max(x.info["context_tokens"] for x in t.segments)
                                                               for t, _ in res),
                         "prompt_tokens_first_call": statistics.mean(t.segments[0].info["context_tokens"]
                                                                     for t, _ in res)})
            rows[-1]["carried_tokens"] = rows[-1]["peak_prompt_tokens"] - rows[-1]["prompt_tokens_first_call"]
    return rows


def markdown(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(f"{v:.1f}" if isinstance(v, float) else str(v) for v in r.values()) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, list[dict]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=("infmem", "mem1", "both"), default="both")
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--lengths", default="4,8,16,32")
    ap.add_argument("--objectives", default="2,4,8,16")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of tables")
    a = ap.parse_args(argv)
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    out: dict[str, list[dict]] = {}
    if a.part in ("infmem", "both"):
        out["infmem"] = infmem_table(a.tasks, [int(x) for x in a.lengths.split(",")], a.seed, tok)
    if a.part in ("mem1", "both"):
        out["mem1"] = mem1_table(a.tasks, [int(x) for x in a.objectives.split(",")], a.seed, tok)
    if a.json:
        print(json.dumps(out, indent=1))
    else:
        print("Scripted oracle policies (no training): the workflows' mechanics, not learned behaviour.\n")
        for name, rows in out.items():
            print(f"## {name}\n\n{markdown(rows)}\n")
    return out


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
