"""Figures on one CUDA device (no Ray, no vLLM): the policy update, the transformers engine's generation
and the in-process weight sync, by model size (tiny, small, a Qwen2.5-0.5B-shaped random model).

    PYTHONPATH=$PWD python benchmarks/gpu_single.py [--skip-05b] [--json out.json]
    PYTHONPATH=$PWD python benchmarks/gpu_single.py --dry-run   # the tiny model once on the CPU (the code path)

Update: 16 rows x (96 prompt + 32 response) tokens, AdamW, KL to a reference model, one micro-batch
(token budget 4096); float32 master weights. Generation: HFEngine, greedy, 64 new tokens per request
from 32-token prompts, batch 16 and 64, with each KV-cache layout (engine.hf.kv_cache padded, then slots,
on the same prompts: how many requests' greedy tokens agree is printed). Sync: the gathered state dict loaded into an engine that holds
its own copy (engine.hf.share_weights=false), the path Ray replicas take in-process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scaleout import _random_05b  # noqa: E402  (same 0.5B-shaped model as the CPU benchmark)

from memrl.config import load_config  # noqa: E402
from memrl.training.config import TrainConfig  # noqa: E402
from memrl.training.update.packing import TrainBatch, weigh  # noqa: E402
from memrl.types import Segment  # noqa: E402

WARMUP, TIMED = 2, 5
DEVICE = "cuda"


def _rows(vocab: int, n: int = 16, prompt: int = 96, response: int = 32) -> TrainBatch:
    """`n` rows weighed over all of them (token-mean)."""
    rng = random.Random(0)
    return weigh([Segment([rng.randrange(vocab) for _ in range(prompt)], [rng.randrange(vocab) for _ in range(response)],
                          [-3.0] * response, advantage=rng.uniform(-1, 1), trajectory_id=f"t{i // 4}")
                  for i in range(n)], "token-mean")


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def update_figures(path: str, dtype: str) -> dict[str, float]:
    from transformers import AutoConfig

    from memrl.training.ranks.workers import PolicyWorker

    cfg = load_config(TrainConfig, [f"model.path={path}", f"model.device={DEVICE}", f"model.dtype={dtype}",
                                    "algorithm.kl_coef=0.001", "optim.lr=1e-5", "trainer.token_budget=4096"])
    w = PolicyWorker(cfg)
    rows = _rows(AutoConfig.from_pretrained(path).vocab_size)
    steps, gathers = [], []
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for i in range(WARMUP + TIMED):
        _sync()
        t0 = time.perf_counter()
        w.train_rows(rows)
        _sync()
        t1 = time.perf_counter()
        w.full_state()
        _sync()
        t2 = time.perf_counter()
        if i >= WARMUP:
            steps.append(t1 - t0)
            gathers.append(t2 - t1)
    peak = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else float("nan")
    w.close()
    del w
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for r in rows.segments)
    return {"step_s": statistics.fmean(steps), "train_tok_s": tokens / statistics.fmean(steps),
            "gather_s": statistics.fmean(gathers), "peak_gib": peak}


def engine_figures(path: str, dtype: str, kv_cache: str = "padded", sync: bool = True) -> dict[str, float]:
    """Generation tokens/s at batch 16 and 64 with engine.hf.kv_cache=`kv_cache` (the same prompts for every
    layout: `tokens_b{n}` keeps the greedy outputs for the comparison), and the weight sync when `sync`."""
    from transformers import AutoModelForCausalLM

    from memrl.engines import EngineConfig, build_engine
    from memrl.engines.base import SamplingParams

    out: dict[str, float] = {}
    eng = build_engine(load_config(EngineConfig, [f"model={path}", "max_batch_size=64", f"hf.device={DEVICE}",
                                                  f"dtype={dtype}", "hf.deterministic=false",
                                                  f"hf.kv_cache={kv_cache}"]))
    vocab = eng.tokenizer.vocab_size
    sp = SamplingParams(max_tokens=64, temperature=0.0, stop_token_ids=())

    async def batch(n: int, seed: int) -> list[list[int]]:
        rng = random.Random(seed)
        prompts = [[rng.randrange(vocab) for _ in range(32)] for _ in range(n)]
        done = await asyncio.gather(*(eng.generate(p, sp) for p in prompts))
        return [list(c.token_ids) for c in done]

    async def measure() -> None:  # one event loop for the engine's whole life
        for n in (16, 64):
            await batch(n, seed=n + 1)  # warm-up
            _sync()
            t0 = time.perf_counter()
            got = await batch(n, seed=n)
            _sync()
            out[f"gen_tok_s_b{n}"] = sum(map(len, got)) / (time.perf_counter() - t0)
            out[f"tokens_b{n}"] = got  # type: ignore[assignment]
        await eng.close()

    asyncio.run(measure())
    if not sync:
        return out
    src = AutoModelForCausalLM.from_pretrained(path).to(DEVICE)
    times = []
    for _ in range(5):
        _sync()
        t0 = time.perf_counter()
        eng.update_weights({k: v.detach() for k, v in src.state_dict().items()})
        _sync()
        times.append(time.perf_counter() - t0)
    out["sync_s"] = min(times)
    del src
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--skip-05b", action="store_true")
    ap.add_argument("--json", default="")
    ap.add_argument("--dry-run", action="store_true",
                    help="the tiny model once on the CPU (keeps the script from rotting; no figures worth reading)")
    args = ap.parse_args()
    global DEVICE, WARMUP, TIMED
    if args.dry_run:
        DEVICE, WARMUP, TIMED = "cpu", 0, 1
    elif not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_single.py needs a CUDA device (torch.cuda.is_available() is False); "
                         "--dry-run runs the tiny model on the CPU")
    from memrl.engines.base import SamplingParams  # noqa: F401  (fail early on a broken install)
    from memrl.models.tiny import cached_tiny_model

    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"device: {torch.cuda.get_device_name() if DEVICE == 'cuda' else 'cpu (dry run)'}, torch {torch.__version__}")
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        sizes = [("tiny", str(cached_tiny_model("tiny")), "float32")]
        if not args.dry_run:
            sizes.append(("small", str(cached_tiny_model("small")), "float32"))
        if not args.skip_05b and not args.dry_run:
            p = _random_05b(os.path.join(tmp, "m05"))
            sizes += [("0.5B-shaped", p, "float32"), ("0.5B-shaped", p, "bfloat16")]
        print("| model | dtype | update s | train tok/s | gather s | peak GiB | gen tok/s b16 | gen tok/s b64 "
              "| sync s | slots b16 | slots b64 | slots: same greedy tokens |")
        print("|---|---|---|---|---|---|---|---|---|---|---|---|")
        for name, path, dtype in sizes:
            u = update_figures(path, dtype)
            e = engine_figures(path, dtype)
            sl = engine_figures(path, dtype, kv_cache="slots", sync=False)
            same = [a == b for n in (16, 64) for a, b in zip(e.pop(f"tokens_b{n}"), sl.pop(f"tokens_b{n}"),
                                                             strict=True)]
            results[f"{name}/{dtype}"] = {**u, **e, **{f"slots_{k}": v for k, v in sl.items()},
                                          "slots_same_requests": sum(same), "requests": len(same)}
            print(f"| {name} | {dtype} | {u['step_s']:.3f} | {u['train_tok_s']:.0f} | {u['gather_s']:.4f} | "
                  f"{u['peak_gib']:.2f} | {e['gen_tok_s_b16']:.0f} | {e['gen_tok_s_b64']:.0f} | {e['sync_s']:.4f} | "
                  f"{sl['gen_tok_s_b16']:.0f} | {sl['gen_tok_s_b64']:.0f} | {sum(same)}/{len(same)} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
