"""Throughput of HFEngine's micro-batching on MemAgent rollouts with the tiny model (CPU by default).

For each concurrency C in --concurrency, runs C MemAgent trajectories at once (C tasks x 1 sample) and
reports generated tokens/s, wall time and the engine's batching counters. Every trajectory has the
same shape (fixed context length, chunk size and generation budgets), so the work per trajectory is
constant and tokens/s compares directly across C. Goal (issue 2): C=64 reaches >= 6x the tokens/s of C=1.

    .venv/bin/python benchmarks/engine_batching.py [--model DIR] [--threads N] [--concurrency 1 8 32 64]

Tokens/s counts generated tokens only; prompt prefill time is included in the wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Row:
    concurrency: int
    trajectories: int
    calls: int
    generated_tokens: int
    prompt_tokens: int
    wall_s: float
    forward_calls: int
    mean_batch: float
    max_batch: int

    @property
    def tokens_per_s(self) -> float:
        return self.generated_tokens / self.wall_s if self.wall_s > 0 else 0.0


def make_tasks(tokenizer, n: int, context_tokens: int, seed: int = 0) -> list:
    """n tasks whose contexts are `context_tokens` tokens of synthetic text (different text per task)."""
    from memrl.models.tiny import synthetic_corpus
    from memrl.types import Task

    ids: list[int] = []
    for block in synthetic_corpus(seed, num_blocks=100_000, num_names=500):
        ids += tokenizer.encode(block + "\n\n", add_special_tokens=False)
        if len(ids) >= n * context_tokens:
            break
    tasks = []
    for i in range(n):
        piece = ids[i * context_tokens : (i + 1) * context_tokens]
        tasks.append(Task(task_id=f"b{i}", question=f"Who founded the town in document {i}?",
                          context=tokenizer.decode(piece), answers=["unknown"]))
    return tasks


def measure(runtime, tasks, concurrency: int) -> Row:
    engine = runtime.engine
    engine.stats.reset()
    t0 = time.perf_counter()
    groups = runtime.sample(tasks, 1, seed=concurrency, concurrency=concurrency, score=True)
    wall = time.perf_counter() - t0
    segs = [s for g in groups for s in g.segments()]
    st = engine.stats
    return Row(concurrency, len(tasks), len(segs), sum(len(s.response_ids) for s in segs),
               sum(len(s.prompt_ids) for s in segs), wall, st.forward_calls, st.mean_batch_size,
               st.max_batch_size)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="model directory (default: the cached tiny preset)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    p.add_argument("--context-tokens", type=int, default=384, help="context length of every task")
    p.add_argument("--chunk-tokens", type=int, default=128)
    p.add_argument("--memory-tokens", type=int, default=64, help="max_memory_tokens")
    p.add_argument("--final-tokens", type=int, default=32, help="max_final_tokens")
    p.add_argument("--max-wait-ms", type=float, default=20.0)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)

    import torch

    from memrl.engines.hf import HFEngine
    from memrl.models.tiny import cached_tiny_model
    from memrl.runtime import RolloutRuntime
    from memrl.workflows import get_workflow

    if args.threads:
        torch.set_num_threads(args.threads)
    model = Path(args.model) if args.model else cached_tiny_model("tiny")
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=args.chunk_tokens, max_memory_tokens=args.memory_tokens,
                          max_final_tokens=args.final_tokens, temperature=1.0)
    engine = HFEngine(model, device=args.device, max_batch_size=max(args.concurrency), max_wait_ms=args.max_wait_ms,
                      seed=0, deterministic=False)
    chunks = -(-args.context_tokens // args.chunk_tokens)
    print(f"model {model} | device {args.device} | torch threads {torch.get_num_threads()} | "
          f"context {args.context_tokens} tok = {chunks} chunks of {args.chunk_tokens} | "
          f"memory {args.memory_tokens} / final {args.final_tokens} tokens | temperature 1.0")

    with RolloutRuntime(engine, spec, cfg) as runtime:  # closes the engine at the end
        warm = make_tasks(engine.tokenizer, 2, args.context_tokens, seed=99)
        measure(runtime, warm, 2)  # first-call allocations, kernel set-up
        rows = [measure(runtime, make_tasks(engine.tokenizer, c, args.context_tokens), c) for c in args.concurrency]
    base = rows[0].tokens_per_s if rows else 0.0
    print(f"{'concurrent':>10} {'calls':>6} {'gen tok':>8} {'prompt tok':>10} {'wall s':>7} {'gen tok/s':>9} "
          f"{'speedup':>7} {'fwd calls':>9} {'mean batch':>10} {'max batch':>9}")
    for r in rows:
        print(f"{r.concurrency:>10} {r.calls:>6} {r.generated_tokens:>8} {r.prompt_tokens:>10} {r.wall_s:>7.2f} "
              f"{r.tokens_per_s:>9.0f} {r.tokens_per_s / base if base else 0:>6.1f}x {r.forward_calls:>9} "
              f"{r.mean_batch:>10.1f} {r.max_batch:>9}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
