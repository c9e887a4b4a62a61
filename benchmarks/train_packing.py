"""Packing benchmark: padded tokens and update throughput of token-budget micro-batches vs padding
every row to the batch's longest row.

  .venv/bin/python benchmarks/train_packing.py [--rows 256] [--budget 4096] [--threads 1]

Rows mimic MemAgent segments of very different lengths (long memory-update prompts, short final calls).
"""

from __future__ import annotations

import argparse
import random
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from memrl.training.update.packing import collate, pack_rows, weigh
    from memrl.training.update.policy import ppo_micro_loss
    from memrl.types import Segment

    rng = random.Random(0)
    rows = []
    for i in range(args.rows):
        p = rng.choice([rng.randint(150, 200), rng.randint(20, 40)])  # memory call vs final call
        r = rng.randint(4, 30)
        rows.append(Segment([rng.randrange(5, 1000) for _ in range(p)], [rng.randrange(5, 1000) for _ in range(r)],
                            [-1.0] * r, advantage=rng.uniform(-1, 1), trajectory_id=f"t{i // 4}"))
    weights = weigh(rows, "token-mean").weights
    real = sum(r.num_tokens for r in rows)
    packed = pack_rows(rows, args.budget)
    packed_tokens = sum(len(b) * max(rows[i].num_tokens for i in b) for b in packed)
    naive_mb = max(1, args.budget // max(r.num_tokens for r in rows))
    naive = [list(range(i, min(i + naive_mb, len(rows)))) for i in range(0, len(rows), naive_mb)]
    naive_tokens = sum(len(b) * max(rows[i].num_tokens for i in b) for b in naive)
    cfg = Qwen2Config(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    for name, batches, tokens in (("token-budget packing", packed, packed_tokens), ("batch-max padding", naive,
                                                                                  naive_tokens)):
        t0 = time.perf_counter()
        model.zero_grad()
        for idx in batches:
            ppo_micro_loss(model, collate([rows[i] for i in idx], [weights[i] for i in idx]), 1.0).loss.backward()
        dt = time.perf_counter() - t0
        print(f"{name:22s} micro-batches {len(batches):3d}  padded tokens {tokens:7d} "
              f"({tokens / real:.2f}x real)  update {dt:.2f}s  {real / dt:,.0f} real tokens/s")


if __name__ == "__main__":
    main()
