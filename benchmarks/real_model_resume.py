"""`--resume` exactness on a real model: SmolLM2-135M-Instruct RL (preset smollm2_memagent_cpu, LoRA, bfloat16
compute) killed with SIGKILL in the middle of a step's rollout, resumed, and compared with an uninterrupted run.

  .venv/bin/python benchmarks/real_model_resume.py --model SFT_DIR/merged --data runs/rl58/train_2.json \
      [--steps 3] [--kill-after 1] [--out runs/resume58]

Both runs use the same settings (`--steps` steps of 2 questions x 4 samples, the token-F1 reward published_box_f1 so that most steps
train something, a checkpoint every step, one
intra-op thread so that the two runs' arithmetic is the same); the interrupted one is killed a few seconds
after step `--kill-after` is logged (during the next step's rollout), then `memrl train --resume` finishes it.
Prints, for every step, the logged reward, loss and data position of both runs and whether they are equal,
and the sha256 of the final LoRA adapter and optimizer state of each run; exits 1 where anything differs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = ("reward/mean", "loss/total", "data/position", "train/tokens", "rollout/generated_tokens")


def train_cmd(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, "-m", "memrl.cli", "train", "--preset", "smollm2_memagent_cpu",
            f"model.path={args.model}", f"data.path={args.data}", f"out_dir={out}", f"trainer.steps={args.steps}",
            "trainer.batch_size=2", "algorithm.n=4", "workflow.reward=published_box_f1", "trainer.save_every=1", f"trainer.keep_checkpoints={args.steps}",
            "trainer.progress=false", "threads.intra_op=1", "trainer.seed=0", "data.seed=0", "engine.seed=0"]


def metrics(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def digest(out: Path, steps: int) -> dict[str, str]:
    """sha256 (16 hex) of the final LoRA adapter file and of the optimizer's tensors and param groups as
    memrl reads them back (the DCP files' own metadata differs between two saves of equal tensors)."""
    from memrl.training.checkpoints.checkpoint import read_optimizer

    ckpt = out / "checkpoints" / f"step_{steps:06d}"
    opt = read_optimizer(ckpt)
    h = hashlib.sha256(json.dumps(opt["param_groups"], sort_keys=True, default=str).encode())
    for name in sorted(opt["state"]):
        for key in sorted(opt["state"][name]):
            t = opt["state"][name][key]
            h.update(f"{name}/{key}".encode())
            h.update(t.float().numpy().tobytes() if hasattr(t, "numpy") else repr(t).encode())
    return {"adapter_model.safetensors": hashlib.sha256((ckpt / "adapter_model.safetensors").read_bytes()).hexdigest()[:16],
            "optimizer state": h.hexdigest()[:16]}


def run(cmd: list[str], log: Path) -> float:
    t = time.time()
    with log.open("a") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}), see {log}: {' '.join(cmd)}")
    return time.time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kill-after", type=int, default=1)
    ap.add_argument("--kill-delay", type=float, default=5.0, help="seconds after step --kill-after is logged")
    ap.add_argument("--out", default="runs/resume58")
    args = ap.parse_args()
    if not 1 <= args.kill_after < args.steps:
        raise SystemExit(f"--kill-after must be in 1..{args.steps - 1}, got {args.kill_after}")
    out = Path(args.out).resolve()
    ref, cut = out / "uninterrupted", out / "interrupted"
    out.mkdir(parents=True, exist_ok=True)
    if not (ref / "checkpoints" / f"step_{args.steps:06d}").is_dir():
        print(f"uninterrupted run: {run(train_cmd(args, ref), out / 'uninterrupted.log'):.0f} s", flush=True)
    if not (cut / "checkpoints" / f"step_{args.steps:06d}").is_dir():
        with (out / "interrupted.log").open("w") as f:
            proc = subprocess.Popen(train_cmd(args, cut), cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            while len(metrics(cut)) < args.kill_after and proc.poll() is None:
                time.sleep(0.5)
            time.sleep(args.kill_delay)
            if proc.poll() is not None:
                raise SystemExit(f"the run ended before it could be killed (rc {proc.returncode}): see {out}")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        latest = (cut / "checkpoints" / "latest").read_text().strip()
        print(f"killed with SIGKILL {args.kill_delay:.0f} s after step {args.kill_after} was logged "
              f"(checkpoints/latest: {latest}, metrics rows: {[r['step'] for r in metrics(cut)]})", flush=True)
        print(f"resumed run: {run([*train_cmd(args, cut), '--resume'], out / 'interrupted.log'):.0f} s", flush=True)
    a, b = metrics(ref), metrics(cut)
    same = [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, args.steps + 1))
    print("| step | " + " | ".join(KEYS) + " | equal |")
    print("|---:|" + "---|" * len(KEYS) + "---|")
    for x, y in zip(a, b, strict=False):
        eq = all(x.get(k) == y.get(k) for k in KEYS)
        same &= eq
        cells = [f"{x.get(k)} / {y.get(k)}" if x.get(k) != y.get(k) else f"{x.get(k)}" for k in KEYS]
        print(f"| {x['step']} | " + " | ".join(cells) + f" | {'yes' if eq else 'NO'} |")
    da, db = digest(ref, args.steps), digest(cut, args.steps)
    for name in da:
        print(f"{name}: uninterrupted {da[name]}  resumed {db[name]}  {'equal' if da[name] == db[name] else 'DIFFERENT'}")
        same &= da[name] == db[name]
    print("resume exact" if same else "resume NOT exact")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
