"""Does ATEN_CPU_CAPABILITY change the numbers on this machine? The same seeded computation in one subprocess
per capability, each printing what torch reports (`torch.backends.cpu.get_cpu_capability()`) and its floats.

  python benchmarks/cpu_capability.py                       # avx2 and avx512
  python benchmarks/cpu_capability.py --caps default,avx2,avx512 --steps 20

Per capability: (1) ATen's vectorized kernels on fixed float32 inputs (a sum over 1M values, softmax, exp,
SiLU, GELU, layer norm, a matrix product; each printed as the float64 sum of its float32 outputs and the
SHA-256 of their bytes, so any rounding difference shows); (2) a few training
steps of a Qwen2 shaped like the MemAgent demo's micro model (hidden 128, 4 layers; random token batches,
AdamW lr 1e-3, one torch thread), printing every step's loss. Then, per pair, which numbers differ (this machine's: docs/results/demo.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys


def measure(steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1_000_000, generator=g)
    m = torch.randn(256, 512, generator=g)
    ops = {
        "sum": x.sum().reshape(1),
        "row_sums": m.sum(dim=-1),
        "softmax": torch.softmax(m, dim=-1),
        "log_softmax": torch.log_softmax(m, dim=-1),
        "exp": torch.exp(m),
        "silu": torch.nn.functional.silu(m),
        "gelu": torch.nn.functional.gelu(m),
        "layer_norm": torch.nn.functional.layer_norm(m, (512,)),
        "matmul": m @ m.T,
    }
    out = {"capability": torch.backends.cpu.get_cpu_capability(),
           "ops": {k: f"{float(v.double().sum()):.17g} sha256:{hashlib.sha256(v.numpy().tobytes()).hexdigest()[:12]}"
                   for k, v in ops.items()}}

    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      tie_word_embeddings=True)
    model = Qwen2ForCausalLM(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, 512, (8, 48), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(f"{loss.item():.9g}")
    out["losses"] = losses
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caps", default="avx2,avx512", help="comma-separated ATEN_CPU_CAPABILITY values")
    ap.add_argument("--steps", type=int, default=10, help="training steps of the micro model")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.steps)))
        return 0
    res = {}
    for cap in args.caps.split(","):
        env = {**os.environ, "ATEN_CPU_CAPABILITY": cap}
        proc = subprocess.run([sys.executable, __file__, "--child", "--steps", str(args.steps)], env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(f"ATEN_CPU_CAPABILITY={cap}: failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
            return 1
        res[cap] = json.loads(proc.stdout.strip().splitlines()[-1])
        r = res[cap]
        print(f"ATEN_CPU_CAPABILITY={cap}: torch reports {r['capability']}")
        for k, v in r["ops"].items():
            print(f"  {k:10s} {v}")
        print(f"  losses     {' '.join(r['losses'])}")
    caps = list(res)
    for i, a in enumerate(caps):
        for b in caps[i + 1:]:
            ops = [k for k in res[a]["ops"] if res[a]["ops"][k] != res[b]["ops"][k]]
            first = next((s for s, (u, v) in enumerate(zip(res[a]["losses"], res[b]["losses"], strict=True))
                          if u != v), None)
            print(f"{a} vs {b}: ops that differ: {', '.join(ops) or 'none'}; training losses "
                  + (f"differ from step {first}" if first is not None else "identical"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
