"""What an optimizer step with no gradient does to the weights: `optim.zero_grad_steps=take` (the published
trainers) against `skip`, side by side on the same rows.

  .venv/bin/python benchmarks/zero_grad_steps.py [--model DIR] [--small 4] [--zero 8] [--lr 1e-4]

Two PolicyWorkers from the same model (memrl's tiny preset unless --model) train the same sequence, as in the
collapse of docs/results/health.md: `--small` steps whose rows have small advantages (|A| <= 0.05), one step whose
rows have large advantages (|A| = 1: the update that breaks a run), then `--zero` steps whose rows all have
advantage 0 (a group whose samples all scored alike). Printed per step: the gradient norm and how far the weights
moved (L2 norm of the change, and the largest change of one weight in learning rates), for both settings.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cli_startup import cpu_name  # noqa: E402  (the benchmarks' CPU line)


def rows(vocab: int, scale: float, seed: int) -> list:
    from memrl.types import Segment

    rng = random.Random(seed)
    out = []
    for _ in range(8):
        p, n = rng.randint(8, 24), rng.randint(4, 12)
        adv = rng.choice((-1, 1)) * scale
        out.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                           [-rng.uniform(0.5, 9.0) for _ in range(n)], advantage=adv, trajectory_id="t"))
    return out


def worker(model: str, out: str, lr: float, mode: str):
    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.ranks.workers import PolicyWorker

    torch.manual_seed(0)
    cfg = load_config(TrainConfig, [f"model.path={model}", f"out_dir={out}", "algorithm.kl_coef=0", f"optim.lr={lr}",
                                    "optim.warmup_steps=0", "trainer.token_budget=512", "trainer.progress=false",
                                    f"optim.zero_grad_steps={mode}"])
    return PolicyWorker(cfg)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--small", type=int, default=4)
    ap.add_argument("--zero", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-4)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoConfig

    from memrl.models.tiny import cached_tiny_model
    from memrl.training.update.packing import weigh

    model = args.model or str(cached_tiny_model("tiny"))
    vocab = AutoConfig.from_pretrained(model).vocab_size
    plan = [("small", 0.05)] * args.small + [("large", 1.0)] + [("zero", 0.0)] * args.zero
    with tempfile.TemporaryDirectory() as tmp:
        ws = {m: worker(model, f"{tmp}/{m}", args.lr, m) for m in ("take", "skip")}
        print(f"model {model}, lr {args.lr}, AdamW betas (0.9, 0.999), weight decay 0.01; CPU: {cpu_name()}")
        print("| step | rows | grad norm | take: L2 moved | take: max moved (lr) | skip: L2 moved | skip: max moved (lr) |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        total = {m: 0.0 for m in ws}
        for i, (kind, scale) in enumerate(plan, 1):
            batch = weigh(rows(vocab, scale, seed=i), "token-mean")
            cells, gn = [], 0.0
            for m, w in ws.items():
                before = [p.detach().clone() for p in w.model.parameters()]
                metrics = w.train_rows(batch)
                gn = metrics["train/grad_norm"]
                d = [(p.detach() - b) for p, b in zip(w.model.parameters(), before, strict=True)]
                l2 = float(torch.sqrt(sum((x.double() ** 2).sum() for x in d)))
                mx = max(float(x.abs().max()) for x in d) / args.lr
                if kind == "zero":
                    total[m] += l2
                cells += [f"{l2:.4g}", f"{mx:.2f}"]
            print(f"| {i} | {kind} | {gn:.3g} | " + " | ".join(cells) + " |")
        print(f"\nweights moved over the {args.zero} zero-gradient steps (sum of L2): take {total['take']:.4g}, "
              f"skip {total['skip']:.4g}")


if __name__ == "__main__":
    main()
