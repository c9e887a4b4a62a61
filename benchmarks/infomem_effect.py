"""InfoMem's model-scored reward against the outcome reward alone, on the CPU demo's RL recipe (issue 45).

    PYTHONPATH=$PWD python benchmarks/infomem_effect.py --from runs/demo --out runs/infomem_effect \
        [--seeds 0,1,2] [--arms outcome,infomem] [--jobs 2] [--threads 1] [KEY=VALUE ...]
    PYTHONPATH=$PWD python benchmarks/infomem_effect.py --out runs/infomem_effect --aggregate-only

--from: a finished `memrl demo` directory; its SFT checkpoint (sft/) is the start of every run, and its
results.json's summary rows of policy sft give the SFT row of the table. Each (arm, seed) run is the demo's RL stage (preset demo_cpu,
as `memrl demo` runs it) from that checkpoint, then the demo's held-out evaluation of the trained model (the
protocol of `memrl.recipes.memagent`, fixed before any run: eval.seed 987654, 128 tasks at 1x/4x/16x the
training length, greedy and 4 samples at temperature 1). Arms:
- outcome: `algorithm.model_reward=none` (the demo's own RL);
- infomem: `algorithm.model_reward=infomem` (defaults: coef 0.5, minmax over a group's successful
  trajectories), scored by the trainer's model in one batched pass per step.
Training seed k shifts the RL stage's seeds (train.data.seed, the task stream; train.trainer.seed, the
sampling) by k; the SFT checkpoint is shared, so the seeds vary the RL stage only. Runs go `--jobs` at a
time, each in its own process with `--threads` torch threads; a finished run (its result.json) is not run
again. Writes OUT/results.md (printed) and OUT/results.json: per arm and length, mean +- standard error over
seeds of greedy and sampled accuracy, the paired difference infomem - outcome, per-seed rows, and each arm's
RL time and the model-scored reward's share of it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from memrl.eval.stats import cell, group_stats, stat
from memrl.recipes.seeds import cells as group_cells
from memrl.recipes.seeds import view_rows

ARMS = {"sft": "train.algorithm.model_reward=none", "outcome": "train.algorithm.model_reward=none",
        "infomem": "train.algorithm.model_reward=infomem"}
"""arm -> its override; "sft" trains nothing: the start, evaluated on this machine (run it with seed 0 only)."""
SEED_KEYS = ("train.data.seed", "train.trainer.seed")


def run_one(src: Path, out: Path, arm: str, seed: int, overrides: list[str]) -> dict[str, Any]:
    """One arm and seed: the demo's RL stage from src/sft, then its held-out evaluation; writes result.json."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.recipes.memagent import RECIPE, evaluate_lengths, heldout_tasks
    from memrl.recipes.parts import engine_eval
    from memrl.recipes.pipeline import load_recipe
    from memrl.recipes.seeds import base_seeds
    from memrl.training.assemble import assemble
    from memrl.training.checkpoints.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    shutil.copytree(src / "sft", out / "sft")
    base = base_seeds("memagent", overrides)
    shifted = [f"{key}={base[key] + seed}" for key in SEED_KEYS]
    run = load_recipe(RECIPE, [*overrides, ARMS[arm], "train.trainer.progress=false", *shifted], out)
    cfg, tcfg, out = run.cfg, run.tcfg, run.out
    run.tokenizer = AutoTokenizer.from_pretrained(out / "sft")
    t0 = time.perf_counter()
    history: list[dict[str, float]] = []
    if arm == "sft":
        model, model_dir = AutoModelForCausalLM.from_pretrained(out / "sft"), out / "sft"
    else:
        trainer = Trainer(assemble(tcfg, workflow=(run.spec, run.wf_cfg)))
        history = trainer.fit()
        model, model_dir = trainer.model, latest_checkpoint(trainer.ckpt_root) or ""
    rl_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    rl = engine_eval(evaluate_lengths, run, model, model_dir, heldout_tasks(cfg, tcfg), cfg.eval, log=print)
    got = {"arm": arm, "seed": seed, "data_seed": tcfg.data.seed, "trainer_seed": tcfg.trainer.seed,
           "rl": rl, "rl_s": rl_s, "eval_s": time.perf_counter() - t0,
           "model_reward_s": sum(h.get("time/model_reward_s", 0.0) for h in history),
           "reward": [h.get("reward/mean", 0.0) for h in history],
           "accuracy": [h.get("reward/accuracy", 0.0) for h in history],
           "outcome_reward": [h.get("traj/outcome_reward", h.get("reward/mean", 0.0)) for h in history]}
    (out / "result.json").write_text(json.dumps(got, indent=1))
    return got


def start_rows(src: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """{(length, decoding): summary row} of the --from demo's SFT evaluation (its results.json's summary rows of
    policy sft; the one results layout); {} when it has no results.json."""
    path = src / "results.json"
    if not path.is_file():
        return {}
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))["summary"]
        return {(str(r["bucket"]), r["decoding"]): r for r in summary if r["policy"] == "sft"}
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"--from {src}: results.json has no summary rows ({e}); scripts/migrate_results.py "
                         "converts an older one") from None


def aggregate(out: Path, src: Path | None) -> str:
    """results.md text (also written, with results.json) from the finished runs under `out`: per arm, length
    and decoding the accuracy's mean +- SE over seeds (each seed's long rows, memrl.recipes.seeds.view_rows,
    grouped by memrl.recipes.seeds.cells), and the paired difference infomem - outcome over the seeds both arms
    finished (one row per seed, length and decoding, grouped by length and decoding)."""
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("*/seed*/result.json"))]
    if not runs:
        return "no finished run"
    arms = [a for a in ARMS if any(r["arm"] == a for r in runs)]
    by = {a: {r["seed"]: r for r in runs if r["arm"] == a} for a in arms}
    lengths = sorted({int(n) for r in runs for n in r["rl"]})
    modes = ("greedy", "sampled")
    acc = group_cells([row for s in sorted({s for a in arms for s in by[a]}) for row in view_rows(
        {a: {mode: {str(n): by[a][s]["rl"][str(n)][mode] for n in lengths} for mode in modes} for a in arms if s in by[a]},
        ("accuracy",), seed=s)])
    lines = [f"SFT+RL on the demo's held-out tasks, accuracy % (mean ± s.e. over seeds "
             f"{', '.join(f'{a}: {sorted(by[a])}' for a in arms)})", "",
             "| arm | length | greedy | sampled | RL s | model-scored reward s |", "|---|---:|---:|---:|---:|---:|"]
    sft = start_rows(src) if src and "sft" not in arms else {}
    for n in lengths:
        if all((str(n), m) in sft for m in modes):
            lines.append(f"| SFT (start, from --from) | {n} | {sft[str(n), 'greedy']['accuracy']:.1f} | "
                         f"{sft[str(n), 'sampled']['accuracy']:.1f} | | |")
        for a in arms:
            text = {mode: cell(acc[mode][str(n)][f"{a}_accuracy"], bare=True) for mode in modes}
            lines.append(f"| {a} | {n} | {text['greedy']} | {text['sampled']} | "
                         f"{stat([r['rl_s'] for r in by[a].values()])['mean']:.0f} | "
                         f"{stat([r['model_reward_s'] for r in by[a].values()])['mean']:.1f} |")
    if {"outcome", "infomem"} <= set(arms):
        both = sorted(set(by["outcome"]) & set(by["infomem"]))
        lines += ["", f"paired difference infomem - outcome over seeds {both}, percentage points:", "",
                  "| length | greedy | sampled |", "|---:|---:|---:|"]
        diff = group_stats([{"bucket": str(n), "decoding": m, "value": by["infomem"][s]["rl"][str(n)][m]["accuracy"]
                             - by["outcome"][s]["rl"][str(n)][m]["accuracy"]}
                            for s in both for n in lengths for m in modes], ("bucket", "decoding"))
        for n in lengths:
            d = [cell(diff[str(n), mode], bare=True) for mode in modes] if both else []
            lines.append(f"| {n} | {d[0]} | {d[1]} |" if both else f"| {n} | | |")
    lines += ["", "per seed (greedy / sampled at each length):", ""]
    for a in arms:
        for s in sorted(by[a]):
            r = by[a][s]
            cells = ", ".join(f"{n}: {r['rl'][str(n)]['greedy']['accuracy']:.1f} / "
                              f"{r['rl'][str(n)]['sampled']['accuracy']:.1f}" for n in lengths)
            lines.append(f"- {a} seed {s} (data.seed {r['data_seed']}, trainer.seed {r['trainer_seed']}): {cells}")
    text = "\n".join(lines) + "\n"
    (out / "results.md").write_text(text)
    (out / "results.json").write_text(json.dumps({"runs": runs}, indent=1))
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from", dest="src", help="a finished memrl demo directory (has sft/ and results.json)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--arms", default="outcome,infomem", help="of sft, outcome, infomem (sft runs seed 0 only)")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="torch threads per run (0 = torch's default)")
    ap.add_argument("--aggregate-only", action="store_true")
    ap.add_argument("--one", nargs=2, metavar=("ARM", "SEED"), help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="demo overrides, as memrl demo takes them")
    args = ap.parse_args(argv)
    out = Path(args.out)
    src = Path(args.src) if args.src else None
    if args.aggregate_only:
        print(aggregate(out, src))
        return 0
    if src is None or not (src / "sft" / "config.json").is_file():
        print(f"infomem_effect: --from {src} has no sft/ checkpoint (memrl demo --out DIR writes one)", file=sys.stderr)
        return 2
    overrides = [*args.overrides, *([f"threads={args.threads}"] if args.threads else [])]
    if args.one:
        arm, seed = args.one[0], int(args.one[1])
        run_one(src, out / arm / f"seed{seed}", arm, seed, overrides)
        return 0
    arms = [a for a in args.arms.split(",") if a]
    bad = [a for a in arms if a not in ARMS]
    if bad:
        print(f"infomem_effect: --arms {bad[0]} is not one of {', '.join(ARMS)}", file=sys.stderr)
        return 2
    todo = [(a, int(s)) for s in args.seeds.split(",") if s for a in arms
            if not (out / a / f"seed{s}" / "result.json").is_file() and (a != "sft" or int(s) == 0)]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads or os.cpu_count() or 1)}
    running: list[tuple[subprocess.Popen, tuple[str, int]]] = []
    failed = []
    while todo or running:
        while todo and len(running) < args.jobs:
            a, s = todo.pop(0)
            (out / a).mkdir(parents=True, exist_ok=True)
            log = open(out / a / f"seed{s}.log", "w")  # noqa: SIM115 (closed with the process)
            cmd = [sys.executable, __file__, "--from", str(src), "--out", str(out), "--one", a, str(s), *overrides]
            running.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env), (a, s)))
            print(f"started {a} seed {s}", flush=True)
        time.sleep(2)
        for p, key in list(running):
            if p.poll() is not None:
                running.remove((p, key))
                print(f"finished {key[0]} seed {key[1]} (exit {p.returncode})", flush=True)
                if p.returncode:
                    failed.append(key)
    print(aggregate(out, src))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
