"""The real-model RL step, old code against new, side by side in one run on one machine; prints the ratio.

  .venv/bin/python benchmarks/real_model_step.py --model DIR --hotpot FILE [--old 1799d4f^] [--steps 3]
      [--rounds 1] [--threads 1] [--out runs/real_model_step]

The step is the one issue 77 timed: `memrl train --preset smollm2_memagent_cpu`, 4 questions x 8 samples
(trainer.batch_size=4) of HotpotQA at 2 documents (16 dev questions, seed 1, built once from --hotpot), rewarded by
`format_f1` (zero-shot the preset's boxed verifier pays nothing, so no row would be trained). "old" is the package at git ref --old (default: the commit before
model.compute_dtype=auto), checked out as a detached git worktree under --out; "new" is this checkout. Each
round runs old then new, each a fresh `memrl train` of --steps steps in its own process with the same seed and
settings, under the same thread count (threads.intra_op, OMP_NUM_THREADS); a step's time is the run's logged
time/step_s. The first step of every run pays the one-time costs and is left out; the table is the median of the
other steps over all rounds, and their CPU seconds (the child's rusage over its run) beside the wall time.

The old code runs its preset as written where it can. If it refuses (its preset said bfloat16 compute, refused on
CPUs without bfloat16 instructions), the refusal is printed and old runs again with float32 compute
(model.compute_dtype=float32 engine.hf.compute_dtype=float32), the only setting it runs with there.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from step_profile import PROFILE_SET, cpu_line  # noqa: E402  (the same step and CPU line as the profile)

FLOAT32 = ["model.compute_dtype=float32", "engine.hf.compute_dtype=float32"]


def tree_for(ref: str, out: Path) -> Path:
    """A detached worktree of `ref` under `out` (kept between runs; moved when `ref` names another commit)."""
    sha = subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    tree = out / f"old-{sha[:10]}"
    if not (tree / "memrl").is_dir():
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), sha], cwd=ROOT, check=True,
                       capture_output=True)
    return tree


def run(tree: Path, args: argparse.Namespace, data: Path, run_dir: Path, extra: list[str]) -> tuple[int, str, float]:
    """One `memrl train` under `tree`'s package; (exit status, last stderr line, child CPU seconds)."""
    env = dict(os.environ, PYTHONPATH=str(tree), OMP_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-m", "memrl.cli", "train", "--preset", "smollm2_memagent_cpu", f"model.path={args.model}",
           f"data.path={data}", f"out_dir={run_dir}", f"trainer.steps={args.steps}", "trainer.save_every=0",
           f"threads.intra_op={args.threads}", *PROFILE_SET, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    last = next((ln for ln in reversed(proc.stderr.splitlines()) if ln.strip()), "")
    return proc.returncode, last, cpu


def step_times(run_dir: Path) -> list[float]:
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    return [float(r["time/step_s"]) for r in rows if "time/step_s" in r]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--hotpot", required=True)
    ap.add_argument("--old", default="1799d4f^")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/real_model_step")
    args = ap.parse_args(argv)
    args.model = str(Path(args.model).resolve())  # the old code runs from its own tree
    if args.steps < 2:
        ap.error("--steps must be at least 2 (each run's first step is left out)")
    out = (ROOT / args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    print("CPU:", cpu_line(), flush=True)
    from step_profile import build_data

    data = build_data(args.hotpot, out).resolve()
    old_tree = tree_for(args.old, out)
    old_extra: list[str] = []
    times: dict[str, list[float]] = {"old": [], "new": []}
    cpus: dict[str, list[float]] = {"old": [], "new": []}
    for r in range(args.rounds):
        for side, tree in (("old", old_tree), ("new", ROOT)):
            run_dir = out / f"{side}-{r}"
            if run_dir.exists():
                shutil.rmtree(run_dir)
            t0 = time.perf_counter()
            extra = old_extra if side == "old" else []
            rc, last, cpu = run(tree, args, data, run_dir, extra)
            if rc and side == "old" and not old_extra:
                print(f"old, preset as written: refused ({last})", flush=True)
                old_extra = FLOAT32
                rc, last, cpu = run(tree, args, data, run_dir, old_extra)
            if rc:
                raise SystemExit(f"{side} failed ({rc}): {last}")
            steps = step_times(run_dir)
            times[side] += steps[1:]
            cpus[side].append(cpu / max(len(steps), 1))
            print(f"round {r + 1} {side}: steps {', '.join(f'{s:.1f}' for s in steps)} s "
                  f"({time.perf_counter() - t0:.0f} s with start-up)", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nold = {args.old} ({' '.join(old_extra) or 'preset as written'}), new = this checkout; "
          f"{args.threads} thread(s); steps 2..{args.steps} of each run, {args.rounds} round(s)")
    cpu = {k: statistics.fmean(v) for k, v in cpus.items()}
    print("| code | step s (median) | wall ratio old/new | CPU s per step | CPU ratio old/new |\n|---|---:|---:|---:|---:|")
    for side in ("old", "new"):
        print(f"| {side} | {med[side]:.1f} | {med['old'] / med[side]:.2f}x | {cpu[side]:.1f} | {cpu['old'] / cpu[side]:.2f}x |")
    print("(CPU s per step: the run's CPU seconds, start-up included, over its steps; it moves far less than wall time "
          "when other jobs load the machine)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
