"""The CPU demo's rollout and evaluation time with each hf engine KV-cache layout, in one run (issue 47).

    PYTHONPATH=$PWD python benchmarks/demo_engine_time.py --from runs/demo --out runs/demo_engine_time
        [--modes padded,slots] [--rounds 1] [--stages eval_sft,rl,eval_rl] [--cores 0-3:4-7] [KEY=VALUE ...]

--from: a finished `memrl demo` directory (its sft/ checkpoint and demo_config.yaml overrides are not read:
the demo's defaults are used, plus KEY=VALUE in `memrl demo`'s spelling). For each layout in turn
(`engine.hf.kv_cache`), the stages of the demo that sample are run again from that SFT checkpoint, exactly
as `memrl demo` runs them: the SFT model's held-out evaluation (greedy and sampled, 1x/4x/16x), the RL run
(demo_cpu) and the SFT+RL model's held-out evaluation. Printed: each stage's wall time per layout, the RL
run's summed rollout time, and whether the layouts produced the same results (every evaluation table, every
RL metrics row apart from time/ and perf/ fields). The SFT stage does not sample and is not rerun.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.recipes.memagent import RECIPE, evaluate_lengths, heldout_tasks
from memrl.recipes.parts import engine_eval
from memrl.recipes.pipeline import load_recipe
from memrl.training.assemble import assemble
from memrl.training.checkpoints.checkpoint import latest_checkpoint
from memrl.training.trainer import Trainer

STAGES = ("eval_sft", "rl", "eval_rl")


def run_mode(src: Path, out: Path, mode: str, overrides: list[str], stages: list[str]) -> dict[str, Any]:
    """The demo's sampling `stages` from src/sft with engine.hf.kv_cache=mode; timings and results, written to
    out/result.json after every stage (a run stopped midway keeps the stages it finished)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(src / "sft", out / "sft")
    run = load_recipe(RECIPE, [*overrides, f"engine.hf.kv_cache={mode}", "train.trainer.progress=false"], out)
    cfg, tcfg, out = run.cfg, run.tcfg, run.out
    tasks = heldout_tasks(cfg, tcfg)
    run.tokenizer = AutoTokenizer.from_pretrained(out / "sft")
    got: dict[str, Any] = {"mode": mode, "timings": {}}

    def done(stage: str, t0: float) -> None:
        got["timings"][f"{stage}_s"] = time.perf_counter() - t0
        (out / "result.json").write_text(json.dumps(got, indent=1))

    if "eval_sft" in stages:
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_pretrained(out / "sft")
        got["sft"] = engine_eval(evaluate_lengths, run, model, out / "sft", tasks, cfg.eval, log=print)
        done("eval_sft", t0)
    if "rl" in stages or "eval_rl" in stages:
        t0 = time.perf_counter()
        trainer = Trainer(assemble(tcfg, workflow=(run.spec, run.wf_cfg)))
        history = trainer.fit()
        got["timings"]["rl_rollout_s"] = sum(h.get("time/rollout_s", 0.0) for h in history)
        got["rl_metrics"] = [{k: v for k, v in h.items() if not k.startswith(("time/", "perf/"))} for h in history]
        done("rl", t0)
    if "eval_rl" in stages:
        t0 = time.perf_counter()
        got["rl"] = engine_eval(evaluate_lengths, run, trainer.model, latest_checkpoint(trainer.ckpt_root) or "",
                                tasks, cfg.eval, log=print)
        done("eval_rl", t0)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", required=True, help="a finished memrl demo directory (has sft/)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--modes", default="padded,slots")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"of {', '.join(STAGES)} (default all)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds, each running every mode in turn")
    ap.add_argument("--cores", default="",
                    help="one taskset core list per mode, ':'-separated (0-3:4-7): the modes then run at the same "
                         "time, each in its own process on its own cores (side by side on a machine with the cores)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="demo overrides, as memrl demo takes them")
    args = ap.parse_args(argv)
    src, out = Path(args.src), Path(args.out)
    stages = [x for x in args.stages.split(",") if x]
    bad = [x for x in stages if x not in STAGES]
    if bad:
        print(f"demo_engine_time: --stages {bad[0]} is not one of {', '.join(STAGES)}", file=sys.stderr)
        return 2
    if not (src / "sft" / "config.json").is_file():
        print(f"demo_engine_time: --from {src} has no sft/ checkpoint (memrl demo --out {src} writes one)",
              file=sys.stderr)
        return 2
    modes = [m for m in args.modes.split(",") if m]
    if args.one:  # one mode and round, in a process of its own (--cores)
        mode, r = args.one.split(":")
        run_mode(src, out / f"{mode}{r}", mode, args.overrides, stages)
        return 0
    cores = [c for c in args.cores.split(":") if c]
    if cores and len(cores) != len(modes):
        print(f"demo_engine_time: --cores names {len(cores)} core lists for {len(modes)} modes", file=sys.stderr)
        return 2
    for r in range(args.rounds):
        if cores:
            print(f"round {r}: " + ", ".join(f"kv_cache={m} on cores {c}" for m, c in zip(modes, cores, strict=True)),
                  flush=True)
            procs = [subprocess.Popen(["taskset", "-c", c, sys.executable, __file__, "--from", str(src), "--out",
                                       str(out), "--stages", ",".join(stages), "--one", f"{m}:{r}", *args.overrides])
                     for m, c in zip(modes, cores, strict=True)]
            if any(p.wait() for p in procs):
                print("demo_engine_time: a run failed (its output is above)", file=sys.stderr)
                return 1
        else:
            for mode in modes:
                print(f"round {r}, engine.hf.kv_cache={mode}", flush=True)
                run_mode(src, out / f"{mode}{r}", mode, args.overrides, stages)
    runs = {m: [json.loads((out / f"{m}{r}" / "result.json").read_text()) for r in range(args.rounds)]
            for m in modes}
    (out / "results.json").write_text(json.dumps(runs, indent=1))
    cols = [f"{x}_s" for x in stages] + (["rl_rollout_s"] if "rl" in stages else [])
    print(f"\nthe demo's sampling stages from {src}/sft, {args.rounds} round(s)"
          f"{', side by side on cores ' + args.cores if cores else ''}; seconds (min over rounds)")
    print("| engine.hf.kv_cache | " + " | ".join(cols) + " | stages total |")
    print("|---|" + "---:|" * (len(cols) + 1))
    best = {m: {c: min(g["timings"][c] for g in runs[m]) for c in cols} for m in modes}
    for m in modes:
        total = sum(best[m][f"{x}_s"] for x in stages)
        print(f"| {m} | " + " | ".join(f"{best[m][c]:.1f}" for c in cols) + f" | {total:.1f} |")
    first = runs[modes[0]][0]
    for m in modes[1:]:
        other = runs[m][0]
        same = [f"evaluation of {name} {'identical' if untimed(other[k]) == untimed(first[k]) else 'DIFFERENT'}"
                for k, name in (("sft", "SFT"), ("rl", "SFT+RL")) if k in first]
        print(f"{m} vs {modes[0]}: " + ", ".join(same) + " (apart from seconds)")
        if "rl_metrics" in first:
            diffs = metric_diffs(first["rl_metrics"], other["rl_metrics"])
            exact = [k for k, d in diffs.items() if d == 0.0]
            print(f"  RL metrics: {len(exact)} of {len(diffs)} keys identical in every step; largest differences: "
                  + ", ".join(f"{k} {d:.2g}" for k, d in sorted(diffs.items(), key=lambda kv: -kv[1])[:4]))
    return 0


def untimed(x: Any) -> Any:
    """x without its "seconds" fields (wall time of an evaluation)."""
    if isinstance(x, dict):
        return {k: untimed(v) for k, v in x.items() if k != "seconds"}
    if isinstance(x, list):
        return [untimed(v) for v in x]
    return x


def metric_diffs(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, float]:
    """{metric: largest absolute difference over the steps} of two runs' metrics rows."""
    out: dict[str, float] = {}
    for ra, rb in zip(a, b, strict=True):
        for k in ra.keys() | rb.keys():
            va, vb = ra.get(k), rb.get(k)
            d = abs(va - vb) if isinstance(va, (int, float)) and isinstance(vb, (int, float)) else \
                float(va != vb)
            out[k] = max(out.get(k, 0.0), d)
    return out


if __name__ == "__main__":
    sys.exit(main())
