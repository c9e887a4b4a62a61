"""The trained MEM1 vs full-history table (issue 45): mean +- SE over training seeds of `memrl demo --agent mem1`
runs (memrl.recipes.mem1), per method, policy, decoding and objective count k.

    .venv/bin/python benchmarks/mem1_trained.py --trained runs/mem1 [--json]

`--trained ROOT` reads ROOT/<method>/[<capability>/]seed<k>/results.json for method mem1
(`workflow.context=latest_state`) and full_history, e.g. the two sweeps

    memrl demo --agent mem1 --out runs/mem1/mem1 --seeds 0,1,2 method=mem1
    memrl demo --agent mem1 --out runs/mem1/full_history --seeds 0,1,2 method=full_history

and prints, per method, policy (SFT, SFT + RL) and decoding (greedy, sampled), at each held-out objective
count k: accuracy (all objectives right, %), the objectives' accuracy (share of objectives right, %) and the
mean peak context (tokens per task), each mean +- SE over the seeds (SE = sd with ddof 1 / sqrt(n); n/a for
one seed); then the peak's growth from the smallest to the largest k (each seed's peak at k_max / its peak at
k_min, then mean +- SE) and its slope (each seed's least-squares slope of the peak over all held-out k, in
tokens per objective, then mean +- SE), all read from the runs' summary rows (results.json's "summary", one row
per policy, decoding and objective count). It refuses runs that evaluated other held-out tasks (results.json's
heldout_sha256, or other config.eval.objectives), that trained on other objective counts (config.task.
sub_questions), or whose directory names another method. The figures are the runs' as measured; nothing here trains.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from memrl.eval.fields import one
from memrl.eval.stats import cell, group_stats
from memrl.recipes.mem1 import RECIPE
from memrl.recipes.seeds import run_rows
from memrl.recipes.seeds import trained_runs as seed_runs

METHODS = ("mem1", "full_history")
FIELDS = ("accuracy", "objective_accuracy", "peak_context_tokens")


def trained_runs(root: Path) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """{method: [(run dir, results.json)]} of the finished runs under ROOT/<method>/[<capability>/]seed<k>
    (memrl.recipes.seeds.trained_runs over METHODS)."""
    return seed_runs(root, METHODS)


def slope(ks: list[float], ys: list[float]) -> float:
    """The least-squares slope of ys over ks: sum((k - mean k)(y - mean y)) / sum((k - mean k)^2)."""
    kb, yb = sum(ks) / len(ks), sum(ys) / len(ys)
    return sum((k - kb) * (y - yb) for k, y in zip(ks, ys, strict=True)) / sum((k - kb) ** 2 for k in ks)


def evaluated(res: dict[str, Any]) -> dict[str, Any]:
    """What must be equal across the runs for their tables to be comparable: their held-out digests, objective
    counts and training mixture (results.json's heldout_sha256 and config)."""
    cfg = res["config"]
    return {"heldout_sha256": res.get("heldout_sha256"), "objectives": cfg["eval"]["objectives"],
            "train_objectives": cfg["task"]["sub_questions"], "eval_tasks": cfg["eval"]["num_tasks"]}


def peak(res: dict[str, Any], policy: str, mode: str, k: str) -> float:
    """A run's mean peak context of `policy`, decoding `mode`, objective count `k` (its summary row)."""
    row = one(res["summary"], policy=policy, decoding=mode, bucket=k)
    if row is None:
        raise SystemExit(f"--trained: a {res.get('method')} run has no summary row of {policy}, {mode}, {k} objectives")
    return float(row["peak_context_tokens"])


def trained_aggregate(runs: dict[str, list[tuple[Path, dict[str, Any]]]]) -> dict[str, Any]:
    """{method: {"seeds", policy: {decoding: {"k": {k: {field: (mean, se)}}, "growth": (mean, se),
    "slope": (mean, se)}}}}; fails in one line when two runs evaluated different held-out tasks or objective
    counts, or trained on different objective counts."""
    first: tuple[Path, dict[str, Any]] | None = None
    for rs in runs.values():
        for d, res in rs:
            ev = evaluated(res)
            if first is None:
                first = (d, ev)
            for key in ("heldout_sha256", "objectives"):
                if ev[key] != first[1][key]:
                    raise SystemExit(f"--trained: {d / 'results.json'} evaluated other held-out tasks than "
                                     f"{first[0] / 'results.json'} ({key} differs)")
            if ev["train_objectives"] != first[1]["train_objectives"]:
                raise SystemExit(f"--trained: {d / 'results.json'} trained on objective counts "
                                 f"{ev['train_objectives']}, {first[0] / 'results.json'} on "
                                 f"{first[1]['train_objectives']}; compare runs of one training mixture")
    rows = [{**row, "method": method} for method, rs in runs.items() for row in run_rows(RECIPE, rs, FIELDS)]
    for method, rs in runs.items():  # per seed: the peak's growth from the smallest k to the largest, its slope
        ks = [str(k) for k in evaluated(rs[0][1])["objectives"]]
        for _, r in rs:
            for policy in ("sft", "rl"):
                for mode in ("greedy", "sampled"):
                    peaks = [peak(r, policy, mode, k) for k in ks]
                    rows += [{"method": method, "policy": policy, "decoding": mode, "bucket": "all", "field": f,
                              "value": v} for f, v in (("growth", peaks[-1] / peaks[0]),
                                                       ("slope", slope([float(k) for k in ks], peaks)))]
    agg = group_stats(rows, ("method", "policy", "decoding", "bucket", "field"))
    out: dict[str, Any] = {}
    for method, rs in runs.items():
        ev = evaluated(rs[0][1])
        ks = [str(k) for k in ev["objectives"]]
        out[method] = {"seeds": [d.name for d, _ in rs], "objectives": ks, "eval_tasks": ev["eval_tasks"],
                       "train_objectives": ev["train_objectives"],
                       **{policy: {mode: {"k": {k: {f: agg[method, policy, mode, k, f] for f in FIELDS} for k in ks},
                                          **{f: agg[method, policy, mode, "all", f] for f in ("growth", "slope")}}
                                   for mode in ("greedy", "sampled")} for policy in ("sft", "rl")}}
    return out


def trained_table(agg: dict[str, Any]) -> str:
    lines = ["| method | policy | decoding | seeds | objectives | accuracy (%) | objectives right (%) "
             "| peak context (tokens) |", "|---|---|---|---|---:|---|---|---|"]
    growth = ["| method | policy | decoding | peak growth (x) | peak slope (tokens / objective) |",
              "|---|---|---|---|---|"]
    for method, e in agg.items():
        for policy, label in (("sft", "SFT"), ("rl", "SFT + RL")):
            for mode in ("greedy", "sampled"):
                r = e[policy][mode]
                for k in e["objectives"]:
                    c = r["k"][k]
                    lines.append(f"| {method} | {label} | {mode} | {len(e['seeds'])} | {k} | {cell(c['accuracy'])} "
                                 f"| {cell(c['objective_accuracy'])} | {cell(c['peak_context_tokens'], 0)} |")
                growth.append(f"| {method} | {label} | {mode} | {cell(r['growth'], 2)} | {cell(r['slope'])} |")
    ks = next(iter(agg.values()))["objectives"]
    return "\n".join(lines) + f"\n\nPeak context at {ks[-1]} objectives / at {ks[0]}, and its least-squares slope over " \
        f"k = {', '.join(ks)} (per seed, then mean ± SE):\n\n" + "\n".join(growth) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trained", type=Path, required=True, metavar="ROOT",
                    help="the finished runs ROOT/<method>/[<capability>/]seed<k>/results.json")
    ap.add_argument("--json", action="store_true", help="print the aggregate as JSON instead of the table")
    a = ap.parse_args(argv)
    runs = trained_runs(a.trained)
    if not runs:
        raise SystemExit(f"--trained: no finished run under {a.trained}/<method>/seed<k>/results.json "
                         f"(methods {', '.join(METHODS)})")
    agg = trained_aggregate(runs)
    if a.json:
        print(json.dumps(agg, indent=1))
    else:
        e = next(iter(agg.values()))
        print(f"MEM1 vs full history, trained (memrl demo --agent mem1) on {e['train_objectives']} objectives: "
              f"{e['eval_tasks']} held-out tasks per objective count; mean ± SE over training seeds")
        print(trained_table(agg))
    return 0


if __name__ == "__main__":
    sys.exit(main())
