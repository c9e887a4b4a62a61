"""Peak memory of one update (forward + backward + AdamW step) on one long row, full logits vs
trainer.logits_chunk_tokens, for a Qwen2-shaped model with Qwen2.5's 151,936-entry vocabulary (built
locally, random weights).

    PYTHONPATH=$PWD python benchmarks/long_rows.py [--lengths 2048,8192,32768] [--chunk 256]
    PYTHONPATH=$PWD python benchmarks/long_rows.py --device cuda --lengths 32768,65536 --shape qwen2.5-0.5b \
        --dtype bfloat16 --gradient-checkpointing --chunk 1024

Each configuration runs in a fresh process. The row is 1 prompt token + L-1 trained tokens (every
position gets logits: the worst case; a MemAgent row trains only its response). `reference` is the same
update with a loss on the final hidden states instead of the logits: weights + gradients + AdamW state +
activations without logits, the figure the goal compares against (chunked peak below 2x it). Memory on
CPU: the process's peak RSS (ru_maxrss) less its RSS after imports; on CUDA: torch.cuda.max_memory_allocated.
A full-logits run whose estimate (the reference plus the logits' bytes per token measured at the first
length) exceeds --max-gb is not run: the table prints the estimate, marked "est.".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from memrl.training.update.packing import collate
from memrl.training.update.policy import ppo_micro_loss
from memrl.types import Segment

VOCAB = 151_936
SHAPES = {  # hidden, intermediate, layers, heads, kv heads
    "tiny": (64, 256, 2, 2, 1),
    "qwen2.5-0.5b": (896, 4864, 24, 14, 2),
}
MODES = ("reference", "full", "chunked")
GIB = 1024**3
GOAL_TOKENS = 32768


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(mode: str, length: int, args: argparse.Namespace) -> dict[str, float]:
    """One update in this process; its peak memory above the process's floor, and its seconds."""
    cuda = args.device == "cuda"
    floor = 0 if cuda else _rss_bytes()
    hidden, inter, layers, heads, kv = SHAPES[args.shape]
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=length,
                      tie_word_embeddings=True, use_cache=False)
    with torch.device(args.device):  # initialized where it runs (a 0.5B model's random init on a CPU is slow)
        model = Qwen2ForCausalLM(cfg).to(dtype=getattr(torch, args.dtype)).train()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    ids = torch.randint(0, VOCAB, (length,), generator=torch.Generator().manual_seed(1)).tolist()
    row = Segment(ids[:1], ids[1:], [-1.0] * (length - 1), loss_mask=[1] * (length - 1), advantage=1.0,
                  trajectory_id="t")
    mb = collate([row], [1.0 / (length - 1)]).to(args.device)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    try:
        if mode == "reference":
            h = model.model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).last_hidden_state
            loss = h.float().square().mean() + 0.0 * model.lm_head.weight.sum()  # every parameter gets a gradient
        else:
            loss = ppo_micro_loss(model, mb, args.temperature, chunk_tokens=args.chunk if mode == "chunked" else 0).loss
        loss.backward()
        opt.step()
    except torch.OutOfMemoryError:  # the figure is then "more than the device holds"
        return {"peak": float("inf"), "seconds": time.perf_counter() - t0, "floor": floor,
                "device_gib": torch.cuda.get_device_properties(0).total_memory / GIB if cuda else 0.0}
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - floor
    return {"peak": peak, "seconds": time.perf_counter() - t0, "floor": floor}


def measure(mode: str, length: int, args: argparse.Namespace) -> dict[str, float]:
    cmd = [sys.executable, __file__, "--child", mode, "--lengths", str(length), "--device", args.device,
           "--shape", args.shape, "--dtype", args.dtype, "--chunk", str(args.chunk),
           "--temperature", str(args.temperature)] + (["--gradient-checkpointing"] if args.gradient_checkpointing else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"long_rows: {mode} at {length} tokens failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(lengths: list[int], got: dict[tuple[str, int], dict[str, float]], est: dict[int, float]) -> list[str]:
    """The printed rows: GiB per mode, the full/chunked ratio, chunked/reference and the goal check (stated
    at 32K tokens: below that, one chunk's logits can outweigh a tiny model's activations)."""
    head = (f"{'tokens':>7} {'fp32 logits GiB':>16} {'reference GiB':>14} {'full logits GiB':>16} {'chunked GiB':>12} "
            f"{'full/chunked':>13} {'chunked/ref':>12} {'goal <2x ref':>13}")
    lines = [head]
    for n in lengths:
        ref, ch = got[("reference", n)]["peak"], got[("chunked", n)]["peak"]
        full = got[("full", n)]["peak"] if ("full", n) in got else est[n]
        mark = "" if ("full", n) in got else " est."
        if math.isinf(full):  # out of memory: more than the device holds
            full, mark = got[("full", n)]["device_gib"] * GIB, " OOM>"
        goal = ("yes" if ch < 2 * ref else "NO") if n >= GOAL_TOKENS else "-"
        lines.append(f"{n:>7} {(n - 1) * VOCAB * 4 / GIB:>16.2f} {ref / GIB:>14.2f} {full / GIB:>11.2f}{mark:<5} "
                     f"{ch / GIB:>12.2f} {full / ch:>12.1f}x {ch / ref:>11.2f}x {goal:>13}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--lengths", default="", help="row lengths in tokens, comma-separated "
                    "(default 2048,8192,32768 on cpu, 32768,65536 on cuda)")
    ap.add_argument("--chunk", type=int, default=256, help="trainer.logits_chunk_tokens of the chunked runs")
    ap.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--max-gb", type=float, default=16.0, help="full-logits runs estimated above this are not run")
    ap.add_argument("--json", default="", help="also write the figures here")
    ap.add_argument("--dry-run", action="store_true", help="one short row on the CPU (keeps the script from rotting)")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.dry_run:
        args.device, args.lengths, args.shape, args.chunk = "cpu", args.lengths or "512", "tiny", 64
    lengths = [int(x) for x in (args.lengths or ("32768,65536" if args.device == "cuda" else "2048,8192,32768"))
               .split(",")]
    if args.child:
        print(json.dumps(child(args.child, lengths[0], args)))
        return 0
    got: dict[tuple[str, int], dict[str, float]] = {}
    est: dict[int, float] = {}
    per_token = 0.0  # bytes the full logits add per trained token, from the first length measured
    for n in lengths:
        got[("reference", n)] = measure("reference", n, args)
        got[("chunked", n)] = measure("chunked", n, args)
        est[n] = got[("reference", n)]["peak"] + per_token * (n - 1)
        if not per_token or est[n] <= args.max_gb * GIB:
            got[("full", n)] = measure("full", n, args)
            if not per_token:
                per_token = (got[("full", n)]["peak"] - got[("reference", n)]["peak"]) / (n - 1)
        print(f"  {n} tokens: " + ", ".join(f"{m} {got[(m, n)]['seconds']:.1f}s" for m in MODES if (m, n) in got),
              file=sys.stderr, flush=True)
    floor = got[("reference", lengths[0])]["floor"] / GIB
    print(f"one update (forward + backward + AdamW) of one row, {args.shape} Qwen2 shape, vocab {VOCAB}, {args.dtype}, "
          f"{args.device}, chunk {args.chunk} tokens, T={args.temperature}"
          + (", gradient checkpointing" if args.gradient_checkpointing else "")
          + ("" if args.device == "cuda" else f"; peak RSS less the {floor:.2f} GiB process floor"))
    print("\n".join(table(lengths, got, est)))
    if est and any(("full", n) not in got for n in lengths):
        print(f"est.: not run (estimate above --max-gb {args.max_gb:g}): reference + "
              f"{per_token / 1024**2:.2f} MiB per trained token measured at {lengths[0]} tokens")
    if any(math.isinf(v["peak"]) for v in got.values()):
        print("OOM>: out of the device's memory (the figure is the device's total)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({f"{m}/{n}": v for (m, n), v in got.items()} | {f"estimate/{n}": v for n, v in est.items()},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
