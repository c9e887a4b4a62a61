"""LoRA vs full fine-tuning: the trainer's peak memory and optimizer-step time on the CPU.

  .venv/bin/python benchmarks/lora.py [--shapes tiny,small] [--rank 16] [--rows 8] [--prompt 192]
                                      [--response 64] [--steps 3] [--kl 0.001] [--threads 1]

Each (shape, mode) runs in a fresh subprocess so its peak RSS is its own. One PolicyWorker (the code of
`memrl train` at world size 1; memrl.models.tiny shapes, float32) takes `--steps` timed optimizer steps
(after one untimed) on the same random rows: `--rows` rows of `--prompt` + `--response` tokens, the
whole batch one micro-batch. With `--kl` > 0 the full run loads a second model as the KL reference and
the LoRA run uses the policy with its adapters off (memrl.training.update.lora.BaseReference).

Columns: trainable parameters, the optimizer's state (Adam moments), RSS after the worker is built and
the process's peak RSS (ru_maxrss; both include Python, torch and transformers, ~the "imports" row), and
the median step time.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def one(shape: str, rank: int, args: argparse.Namespace) -> dict:
    import random

    import torch

    torch.set_num_threads(args.threads)
    from memrl.config import load_config
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.config import TrainConfig
    from memrl.training.ranks.workers import PolicyWorker
    from memrl.training.update.packing import weigh
    from memrl.types import Segment

    path = cached_tiny_model(shape)
    imports_mb = _rss_mb()
    cfg = load_config(TrainConfig, [f"model.path={path}", f"algorithm.kl_coef={args.kl}", "optim.lr=1e-5",
                                    "optim.warmup_steps=0", "trainer.token_budget=1000000",
                                    f"model.lora.rank={rank}", f"model.lora.alpha={2 * rank or 16}"])
    worker = PolicyWorker(cfg)
    built_mb = _rss_mb()
    vocab = worker.model.config.vocab_size
    rng = random.Random(0)
    rows = weigh([Segment(prompt_ids=[rng.randrange(3, vocab) for _ in range(args.prompt)],
                          response_ids=[rng.randrange(3, vocab) for _ in range(args.response)],
                          response_logprobs=[-8.0] * args.response, loss_mask=[1] * args.response,
                          advantage=1.0 if i % 2 else -1.0, trajectory_id=f"t{i}") for i in range(args.rows)],
                 cfg.algorithm.loss_agg)  # one weight per row, as the trainer weighs a mini-batch
    times = []
    for s in range(args.steps + 1):
        t0 = time.perf_counter()
        worker.train_rows(rows)
        if s:
            times.append(time.perf_counter() - t0)
    trainable = sum(p.numel() for p in worker.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in worker.model.parameters())
    opt_bytes = sum(t.numel() * t.element_size() for st in worker.opt.state.values() for t in st.values()
                    if torch.is_tensor(t))
    return {"shape": shape, "mode": f"lora r={rank}" if rank else "full", "params": total, "trainable": trainable,
            "optim_mb": opt_bytes / 2**20, "imports_mb": imports_mb, "built_mb": built_mb,
            "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "step_s": statistics.median(times), "steps": args.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=192)
    ap.add_argument("--response", type=int, default=64)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--kl", type=float, default=0.001)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", nargs=2, metavar=("SHAPE", "RANK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args)))
        return
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    passed = [a for a in sys.argv[1:]]
    print(f"rows {args.rows} x ({args.prompt} prompt + {args.response} response) tokens, kl_coef {args.kl}, "
          f"{args.threads} thread(s), median of {args.steps} steps")
    print(f"{'shape':6} {'mode':10} {'params':>9} {'trainable':>10} {'optim MiB':>9} {'imports MiB':>11} "
          f"{'built MiB':>9} {'peak MiB':>9} {'step s':>7}")
    for shape in args.shapes.split(","):
        for rank in (0, args.rank):
            proc = subprocess.run([sys.executable, __file__, *passed, "--one", shape, str(rank)], env=env,
                                  capture_output=True, text=True)
            if proc.returncode:
                print(f"{shape} rank {rank}: failed\n{proc.stderr[-2000:]}")
                continue
            r = json.loads(proc.stdout.strip().splitlines()[-1])
            print(f"{r['shape']:6} {r['mode']:10} {r['params']:>9,} {r['trainable']:>10,} {r['optim_mb']:>9.1f} "
                  f"{r['imports_mb']:>11.0f} {r['built_mb']:>9.0f} {r['peak_mb']:>9.0f} {r['step_s']:>7.2f}")


if __name__ == "__main__":
    main()
