"""MemAgent-workflow throughput of the transformers (hf) and vLLM engines, and the framework overhead.

For each engine x model preset x concurrency C: C MemAgent trajectories run at once through
`memrl.workflows.rollouts.rollout` (one task each, sampled at temperature 1 with fixed seeds). Reported:

- tokens/s   = generated tokens / wall time of the rollout;
- overhead   = wall time of the rollout / time the engine was generating (at least one `generate` call
               in flight). 1.0 means the workflow code never kept the engine idle. Goal: < 1.10 at C = 64.

Engine start-up and one warm-up rollout are excluded. Needs vllm for the vllm rows (use .venv-vllm):

    .venv-vllm/bin/python benchmarks/engine_throughput.py                       # full grid
    .venv-vllm/bin/python benchmarks/engine_throughput.py --engines hf --presets tiny --concurrency 1 16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from memrl.engines.base import Completion, SamplingParams


class TimedEngine:
    """Wraps an engine; measures the time at least one generate() is in flight, and generated tokens."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.in_flight = 0
        self.busy_s = 0.0
        self.tokens = 0
        self.calls = 0
        self._since = 0.0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        if self.in_flight == 0:
            self._since = time.perf_counter()
        self.in_flight += 1
        try:
            out = await self.inner.generate(prompt_ids, sampling)
        finally:
            self.in_flight -= 1
            if self.in_flight == 0:
                self.busy_s += time.perf_counter() - self._since
        self.tokens += len(out.token_ids)
        self.calls += 1
        return out

    def reset(self) -> None:
        self.busy_s, self.tokens, self.calls = 0.0, 0, 0

    def update_weights(self, weights: Any) -> None:
        self.inner.update_weights(weights)

    async def close(self) -> None:
        await self.inner.close()


@dataclass
class Row:
    engine: str
    preset: str
    concurrency: int
    trajectories: int
    model_calls: int
    generated_tokens: int
    wall_s: float
    engine_busy_s: float
    tokens_per_s: float
    overhead: float


def make_engine(kind: str, path: str, max_batch: int, eager: bool) -> Any:
    if kind == "hf":
        from memrl.engines.hf import HFEngine

        return HFEngine(path, device="cpu", dtype="float32", max_batch_size=max_batch, seed=0, deterministic=False)
    if kind == "vllm":
        from memrl.engines.vllm import VLLMEngine

        return VLLMEngine(model=path, dtype="float32", max_model_len=4096, enforce_eager=eager, kv_cache_gib=1.0,
                          max_num_seqs=max(max_batch, 64), seed=0)
    raise ValueError(f"unknown engine {kind!r}; use hf or vllm")


def run_one(engine: TimedEngine, tasks: list, cfg: Any, concurrency: int, seed: int) -> tuple[float, int]:
    from memrl.runtime import RolloutRuntime
    from memrl.workflows import get_workflow

    engine.reset()
    t0 = time.perf_counter()
    with RolloutRuntime(engine, get_workflow("memagent"), cfg, concurrency=concurrency, close_engine=False) as rt:
        groups = rt.sample(tasks[:concurrency], 1, seed)
    wall = time.perf_counter() - t0
    return wall, sum(len(t.segments) for g in groups for t in g.trajectories)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=["hf", "vllm"])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--chunks", type=int, default=3, help="context chunks per task (+1 final call)")
    ap.add_argument("--chunk-tokens", type=int, default=64)
    ap.add_argument("--max-memory-tokens", type=int, default=48)
    ap.add_argument("--max-final-tokens", type=int, default=16)
    ap.add_argument("--no-eager", action="store_true", help="let vLLM compile (slow start on CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="also write the rows here")
    args = ap.parse_args(argv)

    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks
    from memrl.models.tiny import cached_tiny_model
    from memrl.workflows.memagent import MemAgentConfig

    cmax = max(args.concurrency)
    tasks = make_lookback_tasks(LookbackConfig(num_chunks=args.chunks * 2, chunk_words=24), cmax, seed=args.seed)
    cfg = MemAgentConfig(chunk_tokens=args.chunk_tokens, max_memory_tokens=args.max_memory_tokens,
                         max_final_tokens=args.max_final_tokens, max_chunks=args.chunks, temperature=1.0)
    rows: list[Row] = []
    for preset in args.presets:
        path = str(cached_tiny_model(preset))
        for kind in args.engines:
            try:
                t0 = time.perf_counter()
                inner = make_engine(kind, path, cmax, eager=not args.no_eager)
            except Exception as e:  # noqa: BLE001 - report and go on with the other rows
                print(f"# {kind}/{preset}: engine unavailable: {e}", file=sys.stderr)
                continue
            print(f"# {kind}/{preset}: started in {time.perf_counter() - t0:.1f}s", file=sys.stderr)
            eng = TimedEngine(inner)
            try:
                run_one(eng, tasks, cfg, min(4, cmax), args.seed + 999)  # warm-up
                for c in args.concurrency:
                    wall, calls = run_one(eng, tasks, cfg, c, args.seed)
                    row = Row(kind, preset, c, c, calls, eng.tokens, round(wall, 3), round(eng.busy_s, 3),
                              round(eng.tokens / wall, 1), round(wall / eng.busy_s, 4) if eng.busy_s else float("nan"))
                    rows.append(row)
                    print(f"# {row}", file=sys.stderr)
            finally:
                asyncio.run(eng.close())

    print(f"{'engine':<6} {'model':<6} {'conc':>5} {'calls':>6} {'tokens':>7} {'wall_s':>8} {'busy_s':>8} "
          f"{'tok/s':>8} {'overhead':>9}")
    for r in rows:
        print(f"{r.engine:<6} {r.preset:<6} {r.concurrency:>5} {r.model_calls:>6} {r.generated_tokens:>7} "
              f"{r.wall_s:>8.2f} {r.engine_busy_s:>8.2f} {r.tokens_per_s:>8.1f} {r.overhead:>9.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in rows], f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
