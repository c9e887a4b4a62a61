"""Mixed precision on the CPU: float32 vs bfloat16 compute over float32 master weights, side by side.

  .venv/bin/python benchmarks/mixed_precision.py --smollm2 DIR [--steps 4] [--threads 1] [--out runs/bench_mp]
      [--models demo,smollm2] [--hqa runs/real/hqa/eval_2.json]

For each model, `memrl train` runs twice in fresh subprocesses with the same config, seed and data: once
in float32 (model.compute_dtype unset) and once mixed (model.compute_dtype=bfloat16: the update's
forward/backward under bfloat16 autocast, the hf engine on a bfloat16 copy of the policy). The two runs
alternate per round (float32, mixed, float32, mixed, ... with --rounds), so background load falls on both.
Per run, from metrics.jsonl, the median over the steps after the first (the first pays one-time costs):
step, rollout and update seconds, rollout tokens/s (generated), update tokens/s (trained), and the
train/inference mismatch the trainer logs (mean |trainer - engine| log-prob over trained tokens, KL k3).

Models: demo = the CPU demo's model (the MemAgent demo's init: a ~0.8M-parameter Qwen2 on the synthetic
task, preset demo_cpu, its batch); smollm2 = SmolLM2-135M-Instruct (`memrl model fetch
smollm2-135m-instruct`) on real HotpotQA questions (2 documents, 512-token chunks), LoRA rank 8 (the
real-model preset's), 2 questions x 4 samples per step, micro-batches of 4096 tokens whose logits are taken
1024 tokens at a time (trainer.logits_chunk_tokens; whole, they took 22 GB and the process was killed).
Both models run with engine.hf.kv_cache=padded and trainer.prefix_sharing=never (OLD_DEFAULTS: the settings
docs/results/real_model.md's table was recorded with).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEYS = (("time/step_s", "step s"), ("time/rollout_s", "rollout s"), ("time/update_s", "update s"),
        ("perf/rollout_tokens_per_s", "rollout tok/s"), ("perf/train_tokens_per_s", "update tok/s"),
        ("mismatch/hf/abs_logprob_diff_mean", "|dlogp|"), ("mismatch/hf/kl_k3", "KL k3"))


def demo_model(out: Path) -> Path:
    """The CPU demo's initial model (random weights; the timing does not depend on them)."""
    from memrl.recipes.memagent import RECIPE
    from memrl.recipes.pipeline import load_recipe

    if (out / "init" / "config.json").is_file():
        return out / "init"
    RECIPE.init(load_recipe(RECIPE, [], out))
    return out / "init"


OLD_DEFAULTS = ["engine.hf.kv_cache=padded", "trainer.prefix_sharing=never"]
"""The defaults before 2026-11-28, with which docs/results/real_model.md's table was recorded."""


def overrides(model: str, path: Path, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """(preset args, overrides) of one model's runs."""
    if model == "demo":
        return (["--preset", "demo_cpu"], [f"model.path={path}", f"trainer.steps={args.steps}", "trainer.save_every=0",
                                          "trainer.val_every=0", *OLD_DEFAULTS])
    return ([], [*OLD_DEFAULTS, f"model.path={path}", "data.name=file", f"data.path={args.hqa}", "workflow=memagent",
                 "workflow.chunk_tokens=512", "workflow.max_memory_tokens=64", "workflow.max_final_tokens=32",
                 "trainer.batch_size=2", "algorithm.n=4", f"trainer.steps={args.steps}", "trainer.save_every=0",
                 "model.lora.rank=8", "model.lora.alpha=16", "optim.lr=1e-4", "trainer.token_budget=4096",
                 # the 49,152-entry vocabulary's logits of a whole micro-batch at once do not fit beside the rest
                 "trainer.logits_chunk_tokens=1024"])


def run(model: str, path: Path, mixed: bool, out: Path, args: argparse.Namespace) -> dict[str, float]:
    pre, ov = overrides(model, path, args)
    if mixed:
        ov.append("model.compute_dtype=bfloat16")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    cmd = [sys.executable, "-m", "memrl.cli", "train", *pre, f"out_dir={out}", *ov]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        errs = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.strip() and not ln.startswith("rl:")]
        raise SystemExit(f"{' '.join(cmd)} failed:\n" + "\n".join(errs[-20:]))
    rows = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    rows = [r for r in rows if "time/step_s" in r][1:]  # the first step pays one-time costs
    res = {k: statistics.median(r[k] for r in rows if k in r) for k, _ in KEYS if any(k in r for r in rows)}
    res["wall_s"] = time.perf_counter() - t0
    res["steps"] = len(rows)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="demo,smollm2")
    ap.add_argument("--smollm2", default="", help="SmolLM2 directory (memrl model fetch smollm2-135m-instruct)")
    ap.add_argument("--hqa", default="runs/real/hqa/eval_2.json", help="HotpotQA eval file (2 documents)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="runs/bench_mixed_precision")
    args = ap.parse_args()
    out = Path(args.out)
    from memrl.precision import cpu_has_bf16

    print(f"CPU bfloat16 instructions: {cpu_has_bf16()}; threads {args.threads}; load average {os.getloadavg()}")
    table = []
    for model in args.models.split(","):
        path = demo_model(out / "demo_model") if model == "demo" else Path(args.smollm2)
        if model == "smollm2" and not (path / "config.json").is_file():
            raise SystemExit("--smollm2 DIR: give the imported SmolLM2 directory (memrl model fetch smollm2-135m-instruct)")
        for r in range(args.rounds):
            for mixed in (False, True):
                name = f"{model}/{'mixed' if mixed else 'float32'}/r{r}"
                res = run(model, path, mixed, out / name, args)
                table.append((model, "bf16 mixed" if mixed else "float32", r, res))
                print(name, json.dumps({k: round(v, 4) for k, v in res.items()}), flush=True)
    print()
    print("| model | precision | round | " + " | ".join(h for _, h in KEYS) + " |")
    print("|---|---|---:|" + "---:|" * len(KEYS))
    for model, prec, r, res in table:
        cells = [f"{res[k]:.4g}" if k in res else "-" for k, _ in KEYS]
        print(f"| {model} | {prec} | {r} | " + " | ".join(cells) + " |")
    print()
    for model in dict.fromkeys(m for m, *_ in table):
        f = [res for m, p, _, res in table if m == model and p == "float32"]
        m = [res for mm, p, _, res in table if mm == model and p != "float32"]
        for k, h in KEYS[:5]:
            a = statistics.median(x[k] for x in f)
            b = statistics.median(x[k] for x in m)
            ratio = b / a if "tok/s" in h else a / b
            print(f"{model}: {h} float32 {a:.4g}, mixed {b:.4g}: mixed {ratio:.2f}x as fast")


if __name__ == "__main__":
    main()
