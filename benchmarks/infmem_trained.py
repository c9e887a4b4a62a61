"""The trained InfMem vs MemAgent table: mean +- SE over training seeds of finished `memrl demo --agent infmem`
runs (memrl.recipes.infmem).

    .venv/bin/python benchmarks/infmem_trained.py --trained runs/infmem

ROOT holds ROOT/<method>/seed<k>/results.json (or ROOT/<method>/<capability>/seed<k>/, as `--seeds` writes
them; one capability per method), method infmem and/or memagent. Per method, policy (SFT, SFT + RL),
decoding and held-out length: accuracy, model calls and chunks read, mean +- SE over the seeds (SE = sd
with ddof 1 / sqrt(seeds); n/a for one seed), and "calls vs MemAgent": per seed, this run's model calls /
the MemAgent run's of the same seed at the same policy, decoding and length, minus 1 (in %; negative =
fewer calls), mean +- SE over the seeds both methods finished; all read from the runs' summary rows
(results.json's "summary", one row per policy, decoding and length). Fails on runs that evaluated other
held-out tasks (their heldout_sha256 differ), or on a run whose method is not its directory's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from memrl.eval.fields import one
from memrl.eval.stats import cell, group_stats
from memrl.recipes.infmem import RECIPE
from memrl.recipes.seeds import run_rows
from memrl.recipes.seeds import trained_runs as seed_runs

METHODS = ("infmem", "memagent")
FIELDS = ("accuracy", "model_calls", "chunks_read")


def trained_runs(root: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """{method: [(run dir, results.json)]} of the finished runs under ROOT/<method>/[<capability>/]seed<k>
    (memrl.recipes.seeds.trained_runs over METHODS); fails when two evaluated other held-out tasks."""
    out = seed_runs(root, METHODS)
    digests = {(m, d.name): tuple(r.get("heldout_sha256") or ()) for m, rs in out.items() for d, r in rs}
    if len(set(digests.values())) > 1:
        first = next(iter(digests))
        other = next(k for k, v in digests.items() if v != digests[first])
        raise SystemExit(f"--trained: {other[0]}/{other[1]} evaluated other held-out tasks than "
                         f"{first[0]}/{first[1]} (heldout_sha256 differs)")
    return out


def _calls(res: dict[str, Any], policy: str, mode: str, length: str) -> float:
    row = one(res["summary"], policy=policy, decoding=mode, bucket=str(length))
    if row is None:
        raise SystemExit(f"--trained: a {res.get('method')} run has no summary row of {policy}, {mode}, length {length}")
    return row["model_calls"]


def trained_aggregate(runs: dict[str, list[tuple[Path, dict[str, Any]]]]) -> list[dict[str, Any]]:
    """One row per method, policy, decoding and length: {"method", "policy", "decoding", "length", "seeds",
    field: stat for FIELDS, "vs_memagent": stat of the paired call ratio - 1 in % (the seeds both methods
    finished) or None}: the runs' long rows (memrl.recipes.seeds.run_rows, plus a "vs_memagent" row per seed
    that has a MemAgent run) grouped by (method, policy, decoding, length, field), memrl.eval.stats.stat each."""
    base = {d.name: r for d, r in runs.get("memagent", [])}
    keys = {m: [(p, mode, n) for p in ("sft", "rl") for mode in ("greedy", "sampled")
                for n in rs[0][1]["facts"]["lengths"]]
            for m, rs in runs.items()}
    rows = [{**row, "method": method} for method, rs in runs.items() for row in run_rows(RECIPE, rs, FIELDS)]
    rows += [{"method": method, "policy": k[0], "decoding": k[1], "bucket": str(k[2]), "field": "vs_memagent",
              "value": 100.0 * (_calls(r, *k) / _calls(base[d.name], *k) - 1.0)}
             for method, rs in runs.items() for d, r in rs if d.name in base for k in keys[method]]
    agg = group_stats(rows, ("method", "policy", "decoding", "bucket", "field"))
    return [{"method": method, "policy": p, "decoding": mode, "length": n, "seeds": len(runs[method]),
             **{f: agg[method, p, mode, str(n), f] for f in FIELDS},
             "vs_memagent": agg.get((method, p, mode, str(n), "vs_memagent"))}
            for method, ks in keys.items() for p, mode, n in ks]


def trained_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| method | policy | decoding | length (chunks) | seeds | accuracy (%) | model calls | chunks read "
             "| calls vs MemAgent (%) |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        label = "SFT" if r["policy"] == "sft" else "SFT + RL"
        lines.append(f"| {r['method']} | {label} | {r['decoding']} | {r['length']} | {r['seeds']} "
                     f"| {cell(r['accuracy'])} | {cell(r['model_calls'], 2)} | {cell(r['chunks_read'], 2)} "
                     f"| {cell(r['vs_memagent'], 1, sign=True)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trained", type=Path, required=True, metavar="ROOT",
                    help="the finished runs ROOT/<method>/[<capability>/]seed<k>/results.json")
    a = ap.parse_args(argv)
    runs = trained_runs(a.trained)
    if not runs:
        raise SystemExit(f"--trained: no finished run under {a.trained}/<method>/seed<k>/results.json "
                         f"(method: {', '.join(METHODS)})")
    first = next(iter(runs.values()))[0][1]
    print(f"InfMem vs MemAgent, trained (memrl demo --agent infmem): {first['config']['eval']['num_tasks']} held-out "
          f"tasks per length, training length {first['train']['data']['synthetic']['num_chunks']} chunks; mean ± SE "
          "over training seeds\n")
    print(trained_table(trained_aggregate(runs)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
