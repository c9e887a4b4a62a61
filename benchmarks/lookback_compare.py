"""MemAgent vs ReMemR1 on the look-back synthetic task: both arms of `memrl demo --agent lookback`
(memrl.recipes.lookback) over training seeds, then one table of both with the paired gaps and the goals.

    .venv/bin/python benchmarks/lookback_compare.py --out runs/lb3 --seeds 0,1,2 [demo overrides ...]
    .venv/bin/python benchmarks/lookback_compare.py --out runs/lb3 --seeds 0,1,2 --aggregate-only

For each arm: `memrl demo --agent lookback --out OUT/<arm> --seeds SEEDS method=<arm> OVERRIDES` (memrl.recipes.
seeds: one run per seed in OUT/<arm>/native/seed<k>, resumable; its table OUT/<arm>/seeds_results.md). Both
arms' cold starts are the same checkpoint per seed (memrl.recipes.lookback). Then OUT/compare.md and .json:
accuracy (%) mean ± sd over the seeds per policy and length, recall and callback hit rates (pooled over
lengths), the gaps paired per seed (rl_rememr1 - rl_rememr1_norecall, rl_rememr1 - rl_memagent) and the goals,
all read from the two sweeps' cells (memrl.recipes.seeds.cells: their per-seed values are in seed order).

docs/results/rememr1.md's tables: `--out runs/lb3 --seeds 0,1,2 eval.num_tasks=96 sft.copy_warmup_steps=1000
sft.oversample_recall=4 sft.epochs=3 train.trainer.steps=40` (the method's defaults are the old script's,
old_defaults=true included: engine.hf.kv_cache=padded and trainer.prefix_sharing=never).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ARMS = ("memagent", "rememr1")
ROWS = (("oracle_memagent", "memagent", "oracle"), ("oracle_rememr1", "rememr1", "oracle"),
        ("sft_memagent", "memagent", "sft"), ("sft_rememr1", "rememr1", "sft"),
        ("rl_memagent", "memagent", "rl"), ("rl_rememr1", "rememr1", "rl"),
        ("rl_rememr1_norecall", "rememr1", "rl_norecall"))
"""(row, arm, policy) of the table."""
MODES = ("greedy", "sampled")


def compare(sweeps: dict[str, dict], lengths: list[str]) -> dict:
    """{"seeds", "runs": {row: {mode: {"em": {N: cell}, "recall_rate", "callback_hit_rate"}}}, "gaps", "goals"}
    from each arm's seeds_results.json (`sweeps`: arm -> its one capability's entry)."""
    from memrl.eval.stats import EMPTY, stat
    from memrl.recipes.tables import cell_of

    seeds = {arm: e["seeds"] for arm, e in sweeps.items()}
    if len({tuple(s) for s in seeds.values()}) > 1:
        raise SystemExit(f"the arms finished different seeds ({seeds}); the gaps pair them per seed")
    out: dict = {"seeds": next(iter(seeds.values())), "runs": {}, "gaps": {}, "goals": {}}
    for row, arm, pol in ROWS:
        for mode in MODES:
            e = sweeps[arm]
            if f"{pol}_accuracy" not in e["cells"].get(mode, {}).get("all", {}):
                continue
            out["runs"].setdefault(row, {})[mode] = {
                "em": {n: cell_of(e, mode, n, f"{pol}_accuracy") for n in lengths},
                **{f: cell_of(e, mode, "all", f"{pol}_{f}") for f in ("recall_rate", "callback_hit_rate")}}

    def gap(a: str, b: str, mode: str, n: str) -> dict | None:
        ca, cb = (out["runs"].get(r, {}).get(mode, {}).get("em", {}).get(n, EMPTY) for r in (a, b))
        if not ca["n"] or ca["n"] != cb["n"]:
            return None
        return stat([x - y for x, y in zip(ca["values"], cb["values"], strict=True)])

    for mode in MODES:
        g = {}
        for n in lengths:
            g[f"ablation_drop_N{n}"] = gap("rl_rememr1", "rl_rememr1_norecall", mode, n)
            g[f"rememr1_minus_memagent_N{n}"] = gap("rl_rememr1", "rl_memagent", mode, n)
        out["gaps"][mode] = g
        rl = out["runs"].get("rl_rememr1", {}).get(mode)
        goals = {}
        if rl is not None:
            rr, hr = rl["recall_rate"]["mean"], rl["callback_hit_rate"]["mean"]
            goals["recall rate > 0"] = (rr, rr is not None and rr > 0)
            goals["callback hit rate > 0.5"] = (hr, hr is not None and hr > 0.5)
        for n in ("8", "16"):
            d = g.get(f"ablation_drop_N{n}")
            if d is not None:
                goals[f"recall off drops accuracy >= 10 at N={n}"] = (d["mean"], d["mean"] >= 10)
        d = g.get("rememr1_minus_memagent_N16")
        if d is not None:
            goals["RL ReMemR1 - RL MemAgent >= 10 at N=16"] = (d["mean"], d["mean"] >= 10)
        out["goals"][mode] = goals
    return out


def _fmt(c: dict | None, digits: int = 1, sign: bool = False) -> str:
    """memrl.eval.stats.cell (mean ± sd), with "n/a" for a cell no seed had (no recalls, a missing run)."""
    from memrl.eval.stats import cell

    return "n/a" if c is None or c["mean"] is None else cell(c, digits, sign, spread="sd")


def markdown(agg: dict, lengths: list[str], command: str = "") -> str:
    """The table: accuracy (%) mean ± sd over training seeds per row, length and decoding, the recall and callback
    hit rates, the gaps and the goals (met / missed, with the value reached)."""
    seeds = ", ".join(map(str, agg["seeds"]))
    lines = [f"`{command}`", ""] if command else []
    lines += [f"Mean ± sd over training seeds {seeds} (n = {len(agg['seeds'])}); the evaluation tasks are the same "
              "for every seed.", ""]
    for mode in MODES:
        if not any(mode in v for v in agg["runs"].values()):
            continue
        lines += [f"{mode}:", "", "| run | " + " | ".join(f"N={n}" for n in lengths) + " | recall rate | "
                  "callback hit rate |", "|---|" + "---:|" * len(lengths) + "---:|---:|"]
        for name, arm, _ in ROWS:
            c = agg["runs"].get(name, {}).get(mode)
            if c is None:
                continue
            accs = " | ".join(_fmt(c["em"][n]) for n in lengths)
            rr = _fmt(c["recall_rate"], 3) if arm == "rememr1" else "-"
            hr = _fmt(c["callback_hit_rate"], 3) if arm == "rememr1" else "-"
            n = c["em"][lengths[0]]["n"]
            label = name if n == len(agg["seeds"]) else f"{name} (n = {n})"  # e.g. eval.oracle=false in some
            lines.append(f"| {label} | {accs} | {rr} | {hr} |")
        g = agg["gaps"].get(mode, {})
        lines += ["", "| gap (points, paired per seed) | " + " | ".join(f"N={n}" for n in lengths) + " |",
                  "|---|" + "---:|" * len(lengths)]
        for label, key in (("rl_rememr1 - rl_rememr1_norecall", "ablation_drop"),
                           ("rl_rememr1 - rl_memagent", "rememr1_minus_memagent")):
            lines.append(f"| {label} | " + " | ".join(_fmt(g.get(f"{key}_N{n}"), sign=True) for n in lengths) + " |")
        lines += ["", "| goal | reached (mean over seeds) | status |", "|---|---:|---|"]
        for goal, (val, ok) in agg["goals"].get(mode, {}).items():
            v = "n/a" if val is None else f"{val:.3f}" if "rate" in goal else f"{val:+.1f}"
            lines.append(f"| {goal} | {v} | {'met' if ok else 'MISSED'} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="`memrl demo --agent lookback` overrides")
    p.add_argument("--out", default="runs/lookback")
    p.add_argument("--seeds", default="0", help="comma-separated training seeds (0: the one-seed run)")
    p.add_argument("--aggregate-only", action="store_true", help="start nothing, compare the finished runs")
    args = p.parse_args(argv)
    from memrl.recipes.seeds import parse_seeds, run_sweep

    out, seeds = Path(args.out), parse_seeds(args.seeds)
    command = "python benchmarks/lookback_compare.py " + " ".join(sys.argv[1:] if argv is None else argv)
    sweeps = {}
    for arm in ARMS:
        run_sweep("lookback", out / arm, seeds, ["native"], [f"method={arm}", *args.overrides],
                  aggregate_only=args.aggregate_only, command=command)
        sweeps[arm] = json.loads((out / arm / "seeds_results.json").read_text(encoding="utf-8"))["capabilities"]["native"]
    lengths = [b for b in sweeps["rememr1"]["buckets"] if b != "all"]
    agg = compare(sweeps, lengths)
    text = markdown(agg, lengths, command)
    (out / "compare.md").write_text(text, encoding="utf-8")
    (out / "compare.json").write_text(json.dumps({**agg, "command": command}, indent=1) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
