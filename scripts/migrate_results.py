"""Convert a demo's results.json written before the one results layout into that layout.

  python scripts/migrate_results.py runs/demo/results.json --method memagent -o runs/demo/results.new.json
  python scripts/migrate_results.py runs/lookback/rememr1/results.json --method lookback   # prints it

The one layout is memrl.recipes.pipeline.results': {"recipe", "method", "config", "train", "facts",
"timings", "losses": {"sft", "copy_warmup"}, "history", "num_parameters", "vocab_size", "heldout_sha256",
"summary": [{"policy", "decoding", "bucket", <field>: value, ...}]}. The old layouts (each method's own nesting
of policy, decoding and bucket, its renamed keys and roots) live here only, one function per method in
`MIGRATE`. An old file holds only part of the demo config and of the RL config: the converted file holds that
part ("config", "train"), and the summary rows hold the fields the old file recorded. A file that cannot be
read, or lacks what its method's layout had, fails in one line naming it.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _rows(by_policy: dict[str, Any], nesting: str, flat: Callable[[dict[str, Any]], dict[str, Any]] = dict
          ) -> list[dict[str, Any]]:
    """Summary rows from {policy: evaluation} nested as `nesting` ("decoding", "decoding/bucket",
    "bucket/decoding"), in the old file's order; each summary through `flat`, "seconds" dropped."""
    out = []
    for policy, ev in by_policy.items():
        if nesting == "decoding":
            items = [(mode, "all", s) for mode, s in ev.items()]
        elif nesting == "decoding/bucket":
            items = [(mode, b, s) for mode, by in ev.items() for b, s in by.items()]
        else:
            items = [(mode, b, s) for b, modes in ev.items() for mode, s in modes.items()]
        out += [{"policy": policy, "decoding": mode, "bucket": str(b),
                 **{k: v for k, v in flat(s).items() if k != "seconds"}} for mode, b, s in items]
    return out


def _record(rec: dict[str, Any]) -> dict[str, Any]:
    """memrl.eval.evaluator.eval_record's old shape, flat (memrl.recipes.memagent.FIELDS): temperature dropped
    (the config's), the metrics at the top."""
    return {"accuracy": rec["accuracy"], "se": rec["se"], "num_tasks": rec["num_tasks"], "samples": rec["samples"],
            **rec["metrics"], "per_task": rec["per_task"]}


def memagent(old: dict[str, Any]) -> dict[str, Any]:
    """The MemAgent demo's old layout: recipe {p_aware, train_chunks, min_chunks, chunk_words, sft, rl_steps,
    eval}, lengths, stages {policy: {length: {decoding: eval_record}}}, timings, sft_losses, rl_reward."""
    r = old["recipe"]
    return {
        "recipe": "memagent", "method": "memagent", "config": {"sft": r["sft"], "eval": r["eval"]},
        "train": {"data": {"synthetic": {"num_chunks": r["train_chunks"], "min_chunks": r["min_chunks"],
                                         "chunk_words": r["chunk_words"]}}, "trainer": {"steps": r["rl_steps"]}},
        "facts": {"lengths": old["lengths"]}, "timings": old["timings"],
        "losses": {"sft": old["sft_losses"], "copy_warmup": []},
        "history": [{"reward/mean": v} for v in old["rl_reward"]],
        "summary": _rows(old["stages"], "bucket/decoding", _record)}


def _tail(old: dict[str, Any]) -> dict[str, Any]:
    """The entries parts.HEAD and parts.TAIL declared (method, workflow, algorithm, timings, model size, losses,
    RL's reward and rows), in the one layout."""
    hist = old.get("rl_history", {})
    steps = max((len(v) for v in hist.values()), default=0)
    return {"method": old["method"], "train": {"workflow": old["workflow"], "algorithm": {"name": old["algorithm"]}},
            "timings": old["timings"], "num_parameters": old["num_parameters"], "vocab_size": old["vocab_size"],
            "losses": {"sft": old["sft_losses"], "copy_warmup": old["copy_warmup_losses"]},
            "history": [{k: v[i] for k, v in hist.items()} for i in range(steps)]}


def lookback(old: dict[str, Any]) -> dict[str, Any]:
    """The look-back demo's old layout: HEAD, lengths, eval, streams, heldout_sha256 (of its held-out files),
    oracle / rl_norecall / sft / rl {decoding: {length or "all": summary}}, demonstrator, TAIL."""
    policies = {p: old[p] for p in ("oracle", "sft", "rl", "rl_norecall") if p in old}
    return {"recipe": "lookback", **_tail(old), "config": {"eval": old["eval"]},
            "facts": {"streams": old["streams"], "cold_start": old["demonstrator"]},
            "summary": _rows(policies, "decoding/bucket")}


def _cold_start(summary: dict[str, Any]) -> dict[str, Any]:
    """A scripted cold-start agent's old summary as its summary row (policy cold_start, greedy, bucket all)."""
    return {"policy": "cold_start", "decoding": "greedy", "bucket": "all",
            **{k: v for k, v in summary.items() if k != "seconds"}}


def memact(old: dict[str, Any]) -> dict[str, Any]:
    """The MemAct demo's old layout (indent 2): sft / dcpo {decoding: summary}, demonstrator (the scripted agent's
    summary), timings, num_parameters, vocab_size, sft_losses, copy_warmup_losses, rl {metric: per-step values},
    budget {max_context_tokens, eval_tasks}."""
    rl = old["rl"]
    steps = max((len(v) for v in rl.values()), default=0)
    return {"recipe": "memact", "method": "memact", "timings": old["timings"],
            "num_parameters": old["num_parameters"], "vocab_size": old["vocab_size"],
            "losses": {"sft": old["sft_losses"], "copy_warmup": old["copy_warmup_losses"]},
            "history": [{k: v[i] for k, v in rl.items()} for i in range(steps)],
            "facts": {"budget": old["budget"], "cold_start": {"summary": _cold_start(old["demonstrator"])}},
            "summary": _rows({"sft": old["sft"], "rl": old["dcpo"]}, "decoding")}


def context(old: dict[str, Any]) -> dict[str, Any]:
    """The context demo's old layout: HEAD, process_rewards, scripted {greedy: summary} (its SFT tasks), sft / rl
    {decoding: summary}, reference {react_unbounded: summary}, demonstrator (the cold start's row counts), TAIL,
    budget {max_context_tokens, eval_tasks}, sft_from."""
    policies = {"react_unbounded": {"greedy": old["reference"]["react_unbounded"]}, "scripted": old["scripted"],
                "sft": old["sft"], "rl": old["rl"]}
    return {"recipe": "context", **_tail(old), "config": {"sft_from": old["sft_from"]},
            "facts": {"budget": old["budget"], "process_rewards": old["process_rewards"],
                      "cold_start": old["demonstrator"]},
            "summary": _rows(policies, "decoding")}


def mem1(old: dict[str, Any]) -> dict[str, Any]:
    """The MEM1 demo's old layout: HEAD, objectives, train_objectives, eval_tasks, heldout_sha256 (of its held-out
    file), scripted / sft / rl {decoding: {objective count: summary}}, demonstrator (the cold start's statistics
    and its summary), positions, TAIL. The summary rows in evaluation order: each count's greedy, then sampled."""
    policies = {p: {b: {mode: old[p][mode][b] for mode in old[p] if b in old[p][mode]} for b in old[p]["greedy"]}
                for p in ("scripted", "sft", "rl")}
    demo = old["demonstrator"]
    return {"recipe": "mem1", **_tail(old),
            "config": {"eval": {"objectives": old["objectives"], "num_tasks": old["eval_tasks"]},
                       "task": {"sub_questions": old["train_objectives"]}},
            "facts": {"positions": old["positions"], "cold_start": {**demo, "summary": _cold_start(demo["summary"])}},
            "summary": _rows(policies, "bucket/decoding")}


def infmem(old: dict[str, Any]) -> dict[str, Any]:
    """The InfMem demo's old layout: HEAD, train_chunks, lengths, eval_tasks, eval (the demo config's eval section),
    heldout_sha256 (of its held-out file), scripted (the oracle's summary on its SFT tasks), sft / rl {length:
    {decoding: summary}}, demonstrator {rows, rows_per_task}, TAIL."""
    tail = _tail(old)
    return {"recipe": "infmem", **tail, "config": {"eval": old["eval"]},
            "train": {**tail["train"], "data": {"synthetic": {"num_chunks": old["train_chunks"]}}},
            "facts": {"lengths": old["lengths"],
                      "cold_start": {"summary": _cold_start(old["scripted"]), **old["demonstrator"]}},
            "summary": _rows({"sft": old["sft"], "rl": old["rl"]}, "bucket/decoding")}


MIGRATE: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "memagent": memagent, "lookback": lookback, "memact": memact, "context": context, "mem1": mem1, "infmem": infmem}
"""method -> its old layout's conversion."""


def migrate(old: dict[str, Any], method: str, where: str = "results.json") -> dict[str, Any]:
    """`old` (a results.json of `method`'s old layout) in the one layout; a one-line SystemExit naming `where`
    when it is not one."""
    if method not in MIGRATE:
        raise SystemExit(f"--method: one of {', '.join(MIGRATE)}, got {method!r}")
    if isinstance(old, dict) and "summary" in old:
        raise SystemExit(f"{where}: already in the one results layout")
    try:
        return MIGRATE[method](old)
    except (KeyError, TypeError, AttributeError, IndexError) as e:
        raise SystemExit(f"{where}: not a {method} demo result of the old layout (no {e.args[0] if e.args else e!s})"
                         ) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old", help="a results.json of the old layout")
    ap.add_argument("--method", required=True, help=f"its recipe method ({', '.join(MIGRATE)})")
    ap.add_argument("-o", "--out", default="", help="where to write the converted file (default: print it)")
    args = ap.parse_args(argv)
    try:
        old = json.loads(Path(args.old).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SystemExit(f"{args.old}: unreadable ({getattr(e, 'strerror', None) or e})") from None
    text = json.dumps(migrate(old, args.method, args.old), indent=1) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
