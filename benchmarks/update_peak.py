"""The update's throughput against the CPU's matmul peak, float32 and mixed precision, side by side.

  .venv/bin/python benchmarks/update_peak.py [--models tiny,small] [--smollm2 DIR] [--threads 1]
      [--rows 8] [--prompt 192] [--response 64] [--reps 5]

One micro-batch of `rows` rows (`prompt` prompt tokens + `response` trained tokens each, right padded as
memrl.training.update.packing.collate pads them) goes through the update's forward and backward exactly as a
worker runs it (memrl.training.update.policy.ppo_micro_loss, PPO's clipped loss, token-mean weights), in float32
and under bfloat16 autocast over float32 weights (model.compute_dtype=bfloat16, memrl.precision). The two
alternate rep by rep, so load on the machine falls on both; the median of `reps` timings is kept.

The work is counted as the matmuls a transformer update does: forward = 2 x (weights of every linear layer)
x tokens + the attention scores and their values (2 x 2 x L^2/2 x hidden per layer and row: causal, half
the square) + the vocabulary projection on the positions that get logits (from the micro-batch's first
trained token on, as token_logprobs does); the backward is twice the forward. Softmax, norms and the other
elementwise work are not counted, so the share of peak is a lower bound of how busy the matmul units are.
The peaks are the best of 20 n x n products (n = 1024) at the same thread count, float32 and bfloat16.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_compare import measure_peak  # noqa: E402  (the engine page's peak, in either dtype)


def build(name: str, smollm2: str) -> torch.nn.Module:
    """A tiny preset's model with random weights (its vocabulary as the demo's tokenizers have it), or
    SmolLM2 from its converted directory."""
    if name == "smollm2":
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32, attn_implementation="sdpa")
    from transformers import Qwen2ForCausalLM

    from memrl.models.tiny import PRESETS, qwen2_config

    torch.manual_seed(0)
    cfg = qwen2_config(name, PRESETS[name].vocab_size, eos_token_id=0, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return Qwen2ForCausalLM(cfg)


def flops(model: torch.nn.Module, rows: int, prompt: int, response: int) -> float:
    """Matmul FLOPs of one forward + backward over the micro-batch (the module docstring's count)."""
    c = model.config
    seq = prompt + response
    tokens = rows * seq
    head = model.get_output_embeddings().weight.numel()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear)) - head
    fwd = 2 * linear * tokens + 2 * 2 * (seq * seq / 2) * c.hidden_size * c.num_hidden_layers * rows
    fwd += 2 * head * rows * (response + 1)  # logits from the first trained position on
    return 3 * fwd


def micro_batch(vocab: int, rows: int, prompt: int, response: int):
    from memrl.training.update.packing import collate
    from memrl.types import Segment

    g = torch.Generator().manual_seed(1)
    segs = []
    for i in range(rows):
        ids = torch.randint(1, vocab, (prompt + response,), generator=g).tolist()
        segs.append(Segment(prompt_ids=ids[:prompt], response_ids=ids[prompt:], response_logprobs=[-1.0] * response,
                            advantage=1.0 if i % 2 else -1.0, trajectory_id=f"t{i}"))
    n = rows * response
    return collate(segs, [1.0 / n] * rows)


def time_update(model: torch.nn.Module, mb, mixed: bool) -> float:
    from memrl.training.update.policy import ppo_micro_loss

    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=mixed):
        parts = ppo_micro_loss(model, mb, temperature=1.0, loss_kwargs={"clip_low": 0.2, "clip_high": 0.28})
    parts.loss.backward()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny,small")
    p.add_argument("--smollm2", default="", help="a converted SmolLM2 directory: adds the real model")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rows", type=int, default=8)
    p.add_argument("--prompt", type=int, default=192)
    p.add_argument("--response", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    args = p.parse_args(argv)
    peak = {"float32": measure_peak(args.threads, n=1024), "bfloat16": measure_peak(args.threads, n=1024,
                                                                                     dtype=torch.bfloat16)}
    print(f"# {args.threads} thread(s); matmul peak float32 {peak['float32'] / 1e9:.1f} GFLOP/s, bfloat16 "
          f"{peak['bfloat16'] / 1e9:.1f} GFLOP/s; {args.rows} rows x ({args.prompt} + {args.response}) tokens")
    names = [m for m in args.models.split(",") if m] + (["smollm2"] if args.smollm2 else [])
    print("| model | parameters | compute | update s | tokens/s | GFLOP/s | % float32 peak | % bfloat16 peak |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for name in names:
        model = build(name, args.smollm2)
        mb = micro_batch(model.config.vocab_size, args.rows, args.prompt, args.response)
        work = flops(model, args.rows, args.prompt, args.response)
        times: dict[bool, list[float]] = {False: [], True: []}
        for mixed in (False, True):  # warm-up: one-time costs (allocations, kernels picked)
            time_update(model, mb, mixed)
        for _ in range(args.reps):
            for mixed in (False, True):
                times[mixed].append(time_update(model, mb, mixed))
        params = sum(t.numel() for t in model.parameters())
        for mixed in (False, True):
            s = statistics.median(times[mixed])
            rate = work / s
            print(f"| {name} | {params / 1e6:.1f}M | {'bfloat16 autocast' if mixed else 'float32'} | {s:.3f} | "
                  f"{mb.num_tokens / s:,.0f} | {rate / 1e9:.1f} | {100 * rate / peak['float32']:.0f}% | "
                  f"{100 * rate / peak['bfloat16']:.0f}% |")
        del model


if __name__ == "__main__":
    main()
