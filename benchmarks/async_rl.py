"""Synchronous vs asynchronous RL (`rollout.max_staleness`) on the CPU demo recipe (docs/guides/async.md).

  .venv/bin/python benchmarks/async_rl.py [--sft DIR] [--steps 120] [--threshold 0.9] [--window 10]
                                          [--modes inproc,ray-sync,ray-async] [--out DIR] [demo overrides...]

The RL stage of `memrl demo` (preset demo_cpu, 120 steps) from the demo's SFT model (`--sft`: a demo run's
`sft/` directory; without it the demo's own init + SFT stages build one in `<out>/sft` first, ~10 min), run
three ways with the same seed and step count, each in a fresh subprocess:

  inproc     today's default: one process, the hf engine sharing the trained module, synchronous
  ray-sync   Ray: the trainer (one rank, in the driver, 1 torch thread) and one hf engine replica (a Ray
             actor with 1 CPU, at the driver's priority: RAY_worker_niceness=0 unless set): the placement
             of a cluster, trainer and rollout on separate devices; rollout.max_staleness=0
  ray-async  the same placement, rollout.max_staleness=1 (the next step's rollouts run during the update)

Printed per mode: steps/hour of the RL stage, the wall time until the mean reward over `--window` steps
first reaches `--threshold` (from the start of fit()), the engine's idle share (perf/engine_idle_share:
time the engine generated nothing), the trainer's idle share (time waiting for rollouts / step time),
the train/inference mismatch (mismatch/hf/*), and the final policy's held-out accuracy, greedy and
sampled, as `memrl demo` measures it (its held-out tasks; demo overrides such as `eval.samples=2` or
`eval.multipliers=[1,4]` shorten it). Results: <out>/<mode>.json and <out>/table.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from memrl.eval.stats import cell, recorded

ROOT = Path(__file__).resolve().parents[1]

MODES = {
    "inproc": [],
    "ray-sync": ["trainer.num_workers=1", "rollout.num_engines=1", "rollout.engine=hf", "rollout.cpus_per_engine=1",
                 "rollout.max_staleness=0"],
    "ray-async": ["trainer.num_workers=1", "rollout.num_engines=1", "rollout.engine=hf",
                  "rollout.cpus_per_engine=1", "rollout.max_staleness=1"],
}


def build_sft(out: Path, demo_overrides: list[str]) -> Path:
    """The demo's init + cold-start stages (memrl.recipes.memagent), once: <out>/sft."""
    from memrl.recipes.memagent import RECIPE
    from memrl.recipes.pipeline import cold_start, load_recipe

    run = load_recipe(RECIPE, demo_overrides, out)
    RECIPE.init(run)
    cold_start(run, RECIPE.demonstrations(run)[0], tensorboard=run.tcfg.trainer.tensorboard)
    return run.out / "sft"


def pin_placement() -> None:
    """--pin: every thread of this process (trainer, rollout loop) on CPU 0, every engine replica process
    (Ray's `ray::_EngineActor` workers) on CPU 1: each side its own core, as on separate devices."""
    import psutil

    me = psutil.Process()
    for t in me.threads():
        os.sched_setaffinity(t.id, {0})
    found = 0
    for p in psutil.process_iter(["cmdline"]):
        if any("_EngineActor" in part for part in (p.info["cmdline"] or [])):
            p.cpu_affinity([1])
            found += 1
    print(f"pinned: this process to CPU 0, {found} engine replica process(es) to CPU 1", flush=True)


def child(mode: str, sft: Path, out: Path, steps: int, threshold: float, window: int,
          demo_overrides: list[str], pin: bool = False) -> dict:
    import torch

    from memrl.recipes.memagent import RECIPE, evaluate_lengths, heldout_tasks
    from memrl.recipes.parts import engine_eval
    from memrl.recipes.pipeline import load_recipe
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    torch.set_num_threads(1)  # the trainer's CPU; the engine replica is a Ray actor with its own
    run = out / mode
    train = [f"train.model.path={sft}", f"train.out_dir={run / 'rl'}", f"train.trainer.steps={steps}",
             "train.trainer.progress=false", "train.trainer.tensorboard=false",
             f"train.ray.temp_dir={Path('/tmp') / ('ray_async_' + mode)}", "train.ray.num_cpus=2",
             *[f"train.{o}" for o in MODES[mode]]]
    demo = load_recipe(RECIPE, [*demo_overrides, *train], run)
    cfg, tcfg, workflow = demo.cfg, demo.tcfg, (demo.spec, demo.wf_cfg)
    stamps: list[tuple[float, dict[str, float]]] = []
    t0 = time.perf_counter()
    trainer = Trainer(assemble(tcfg, workflow=workflow),
                      on_step=lambda step, m: stamps.append((time.perf_counter(), m)))
    if pin:
        pin_placement()
    t_fit = time.perf_counter()
    trainer.fit()
    t_end = time.perf_counter()
    rewards = [m.get("reward/mean", 0.0) for _, m in stamps]
    reached = None
    for i in range(window - 1, len(rewards)):
        if statistics.fmean(rewards[i - window + 1 : i + 1]) >= threshold:
            reached = stamps[i][0] - t_fit
            break

    def mean(key: str) -> float | None:
        vals = [m[key] for _, m in stamps if key in m]
        return statistics.fmean(vals) if vals else None

    step_s = sum(m["time/step_s"] for _, m in stamps)
    tasks = heldout_tasks(cfg, tcfg)
    t_eval = time.perf_counter()
    demo.tokenizer = trainer.parts.tokenizer
    ev = engine_eval(evaluate_lengths, demo, trainer.model, sft, tasks, cfg.eval, log=print)
    res = {
        "mode": mode, "steps": len(stamps), "setup_s": t_fit - t0, "fit_s": t_end - t_fit,
        "steps_per_hour": len(stamps) / (t_end - t_fit) * 3600, "threshold": threshold, "window": window,
        "time_to_threshold_s": reached,
        "engine_idle_share": mean("perf/engine_idle_share"),
        "trainer_idle_share": sum(m["time/rollout_s"] for _, m in stamps) / step_s if step_s else None,
        "mismatch_abs_logprob_diff_mean": mean("mismatch/hf/abs_logprob_diff_mean"),
        "mismatch_kl_k3": mean("mismatch/hf/kl_k3"),
        "mismatch_ratio_outside_share": mean("mismatch/hf/ratio_outside_share"),
        "staleness_mean": mean("async/staleness_mean"),
        "partial_trajectories": sum(m.get("async/partial_trajectories", 0.0) for _, m in stamps),
        "reward_first10": statistics.fmean(rewards[:10]) if rewards else None,
        "reward_last10": statistics.fmean(rewards[-10:]) if rewards else None,
        "eval_s": time.perf_counter() - t_eval,
        "heldout": {n: {m: {"accuracy": e["accuracy"], "se": e["se"]} for m, e in row.items()} for n, row in ev.items()},
    }
    return res


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
    lengths = list(rows[0]["heldout"]) if rows else []
    head = ["mode", "steps", "RL wall s", "steps/hour", "s to threshold", "engine idle", "trainer idle",
            "|dlogp| mean", "kl_k3", "staleness", "partial trajs"]
    head += [f"{n} chunks greedy / sampled" for n in lengths]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["mode"], str(r["steps"]), fmt(r["fit_s"], ".0f"), fmt(r["steps_per_hour"], ".0f"),
                 fmt(r["time_to_threshold_s"], ".0f"), fmt(r["engine_idle_share"], ".2f"),
                 fmt(r["trainer_idle_share"], ".2f"), fmt(r["mismatch_abs_logprob_diff_mean"], ".1e"),
                 fmt(r["mismatch_kl_k3"], ".1e"), fmt(r["staleness_mean"], ".2f"), fmt(r["partial_trajectories"], ".0f")]
        for n in lengths:
            h = r["heldout"][n]
            cells.append(" / ".join(cell(recorded(h[m]["accuracy"], h[m]["se"])) if m in h else "-"
                                    for m in ("greedy", "sampled")))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sft", default="", help="a demo run's sft/ directory (default: build one in <out>/sft)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--threshold", type=float, default=0.9)
    ap.add_argument("--window", type=int, default=10)
    ap.add_argument("--modes", default="inproc,ray-sync,ray-async")
    ap.add_argument("--out", default="runs/async_bench")
    ap.add_argument("--pin", action="store_true",
                    help="pin the trainer's process to CPU 0 and the engine replica to CPU 1 (Ray modes)")
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="demo overrides (e.g. eval.samples=2)")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.child:
        res = child(args.child, Path(args.sft), out, args.steps, args.threshold, args.window, args.overrides,
                    pin=args.pin)
        (out / f"{args.child}.json").write_text(json.dumps(res, indent=1), encoding="utf-8")
        return
    sft = Path(args.sft).resolve() if args.sft else out / "sft"
    if not (sft / "config.json").exists():
        print(f"building the demo's SFT model in {sft} ...", flush=True)
        sft = build_sft(out, [o for o in args.overrides if not o.startswith("eval.")])
    rows = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            raise SystemExit(f"--modes: unknown mode {mode!r} (known: {', '.join(MODES)})")
        print(f"== {mode}", flush=True)
        cmd = [sys.executable, __file__, "--child", mode, "--sft", str(sft), "--steps", str(args.steps),
               "--threshold", str(args.threshold), "--window", str(args.window), "--out", str(out),
               *(["--pin"] if args.pin else []), *args.overrides]
        # Ray starts its workers 15 nice levels below the driver: on one machine the replica would lose
        # every CPU it shares with the driver's threads. Same priority, as on separate devices.
        env = {"RAY_worker_niceness": "0", **os.environ, "PYTHONPATH": str(ROOT)}
        subprocess.run(cmd, check=True, env=env)
        rows.append(json.loads((out / f"{mode}.json").read_text(encoding="utf-8")))
        print(table(rows[-1:]), flush=True)
    md = table(rows)
    (out / "table.md").write_text(md + "\n", encoding="utf-8")
    print(md)
    by = {r["mode"]: r for r in rows}
    if "ray-sync" in by and "ray-async" in by:
        print(f"ray-async / ray-sync steps per hour: {by['ray-async']['steps_per_hour'] / by['ray-sync']['steps_per_hour']:.2f}x")


if __name__ == "__main__":
    main()
