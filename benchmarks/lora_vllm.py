"""LoRA on in-process vLLM: merged weights vs vLLM's own LoRA support (engine.vllm.lora_sync).

  .venv-vllm/bin/python benchmarks/lora_vllm.py [--shapes tiny,small] [--rank 16] [--syncs 5]
                                                [--batch 32] [--prompt 64] [--tokens 64] [--repeats 3]
                                                [--order merged,adapter]

For each memrl.models.tiny shape (float32, enforce_eager) a PEFT adapter (rank --rank, alpha 2 * rank, every
linear layer) stands in for the trained policy; before each sync its B matrices get new seeded values, as
an update would. Two engines, one after the other:

- merged: a plain VLLMEngine; a sync is the trainer's merge (memrl.training.update.lora.merged_state: W + scaling
  * B A for every adapted weight) and `update_weights(state dict)` (safetensors blob through vLLM's RPC,
  in-place reload, prefix cache reset);
- adapter: a VLLMEngine built with enable_lora (max_lora_rank = rank); a sync writes the adapter in PEFT's
  format to a new directory (model.save_pretrained, as memrl.training.sync.adapter_sync does) and
  `load_adapter(dir)` (a new LoRARequest, added to the engine at once, the previous one removed).

Per sync: the median seconds of each part over --syncs syncs (the first sync untimed: warm-up). Generation:
--batch concurrent greedy requests of --prompt random prompt tokens, up to --tokens new tokens each, after
the last sync; tokens/s = generated tokens / wall seconds, median of --repeats batches. The two engines'
greedy tokens are compared (they serve the same weights: W + scaling * B A) and the largest logprob
difference printed.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _peft_model(path: Path, rank: int):  # noqa: ANN202
    import peft
    import torch
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    conf = peft.LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=TARGETS, bias="none",
                           task_type="CAUSAL_LM")
    torch.manual_seed(0)
    return peft.get_peft_model(base, conf)


def _update(pm, version: int) -> None:  # noqa: ANN001
    """New B values (A keeps PEFT's init): what an optimizer step changes in a LoRA policy."""
    import torch

    g = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)


def _batch(engine, prompts: list[list[int]], tokens: int) -> tuple[float, list]:  # noqa: ANN001
    from memrl.engines.base import SamplingParams

    sampling = SamplingParams(temperature=0.0, max_tokens=tokens)

    async def run() -> list:
        return list(await asyncio.gather(*(engine.generate(p, sampling) for p in prompts)))

    t0 = time.perf_counter()
    out = asyncio.run(run())
    return time.perf_counter() - t0, out


def _measure(kind: str, path: Path, pm, args: argparse.Namespace, prompts: list[list[int]], tmp: Path) -> dict:  # noqa: ANN001
    from memrl.engines.vllm import VLLMEngine
    from memrl.training.update.lora import merged_state

    t0 = time.perf_counter()
    eng = VLLMEngine(model=str(path), dtype="float32", enforce_eager=True, max_model_len=args.prompt + args.tokens + 8,
                     kv_cache_gib=1.0, seed=0, max_num_seqs=args.batch,
                     max_lora_rank=args.rank if kind == "adapter" else 0)
    start_s = time.perf_counter() - t0
    parts: dict[str, list[float]] = {}
    try:
        for v in range(args.syncs + 1):
            _update(pm, v)
            t0 = time.perf_counter()
            if kind == "merged":
                state = merged_state(pm)
                t1 = time.perf_counter()
                eng.update_weights(state)
            else:
                d = tmp / f"{kind}-{args.rank}-{v}"
                pm.save_pretrained(str(d), safe_serialization=True)
                t1 = time.perf_counter()
                eng.load_adapter(str(d))
            t2 = time.perf_counter()
            if v:  # the first sync warms up
                for k, x in (("prepare", t1 - t0), ("deliver", t2 - t1), ("total", t2 - t0)):
                    parts.setdefault(k, []).append(x)
        _batch(eng, prompts[:4], 4)  # warm-up
        walls, outs = [], []
        for _ in range(args.repeats):
            wall, outs = _batch(eng, prompts, args.tokens)
            walls.append(wall)
        generated = sum(len(c.token_ids) for c in outs)
    finally:
        eng.shutdown()
    wall = statistics.median(walls)
    return {"kind": kind, "start_s": start_s, **{k: statistics.median(x) for k, x in parts.items()},
            "generated": generated, "wall_s": wall, "tok_s": generated / wall, "outs": outs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="tiny,small")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--syncs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--order", default="merged,adapter", help="which engine runs first (a loaded machine drifts)")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    import random

    from memrl.models.tiny import cached_tiny_model

    print(f"{time.strftime('%Y-%m-%d %H:%M')} rank {args.rank} (alpha {2 * args.rank}, {len(TARGETS)} linear layers per block), float32, "
          f"median of {args.syncs} syncs; batch {args.batch} x ({args.prompt} prompt + <= {args.tokens} new) "
          f"greedy, median of {args.repeats}; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'shape':6} {'sync':8} {'start s':>8} {'prepare s':>10} {'deliver s':>10} {'sync s':>8} "
          f"{'tokens':>7} {'batch s':>8} {'tok/s':>7}")
    for shape in args.shapes.split(","):
        path = cached_tiny_model(shape)
        pm = _peft_model(path, args.rank)
        rng = random.Random(0)
        vocab = pm.config.vocab_size
        prompts = [[rng.randrange(3, vocab) for _ in range(args.prompt)] for _ in range(args.batch)]
        rows = {}
        with tempfile.TemporaryDirectory(prefix="lora_vllm") as tmp:
            for kind in args.order.split(","):
                if kind not in ("merged", "adapter"):
                    raise SystemExit(f"--order: {kind!r} is not merged or adapter")
                r = _measure(kind, path, pm, args, prompts, Path(tmp))
                rows[kind] = r
                print(f"{shape:6} {kind:8} {r['start_s']:>8.1f} {r['prepare']:>10.4f} {r['deliver']:>10.4f} "
                      f"{r['total']:>8.4f} {r['generated']:>7} {r['wall_s']:>8.2f} {r['tok_s']:>7.0f}", flush=True)
        a, b = rows["merged"]["outs"], rows["adapter"]["outs"]
        same = sum(x.token_ids == y.token_ids for x, y in zip(a, b, strict=True))
        diff = max((abs(p - q) for x, y in zip(a, b, strict=True) if x.token_ids == y.token_ids
                    for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=float("nan"))
        print(f"{shape:6} greedy tokens equal in {same}/{len(a)} requests; largest logprob difference {diff:.2e}")


if __name__ == "__main__":
    main()
