"""One RL step of each seed method's loop on one device, by model family: a MemAgent GRPO step and a MemAct
DCPO step, each on a random Qwen2.5-0.5B-shaped Qwen2 and a random Qwen3-0.6B-shaped Qwen3
(memrl.models.tiny.random_model: the tiny tokenizers, tiny-qwen3's thinking template for Qwen3), in bf16,
rolled out by the transformers engine (no Ray, no vLLM). Prints one row per (model, method) with the
step's rollout / update seconds, tokens generated and trained, and the device's peak memory.

    PYTHONPATH=$PWD python benchmarks/gpu_steps.py [--device cuda] [--json out.json]
    PYTHONPATH=$PWD python benchmarks/gpu_steps.py --dry-run     # CPU, same vocabulary, 2-layer shapes

The models are random (no hub downloads here): the figures are the machinery's cost at that shape (the
151,936-entry vocabulary included; the tiny tokenizer only ever names its first few thousand ids, and a
random policy samples any id, which decodes to nothing), not a learning result. Each step is the first of
its run, so it includes the engine's first calls; each runs in a process of its own. "left GiB": the
device memory the process still holds once the run is closed and torch's cache emptied.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from memrl.config import load_config
from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks, write_tasks
from memrl.models.tiny import SHAPES, random_model
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

# the dry run keeps each shape's vocabulary, architecture and head layout, with two thin layers
DRY = {"qwen2.5-0.5b": replace(SHAPES["qwen2.5-0.5b"], hidden_size=56, intermediate_size=112, num_hidden_layers=2),
       "qwen3-0.6b": replace(SHAPES["qwen3-0.6b"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16)}


COMMON = ["trainer.steps=1", "trainer.save_every=0", "trainer.progress=false", "trainer.tensorboard=false",
          "trainer.dump_every=0", "model.dtype=bfloat16", "engine.name=hf", "engine.dtype=bfloat16",
          "algorithm.kl_coef=0.0", "optim.lr=1e-6", "optim.warmup_steps=0",
          # a random policy earns uniform rewards (zero advantages): train every row anyway, so the update
          # costs what a learning step costs; the old log-probabilities recomputed, as the *_official presets do
          "trainer.skip_zero_advantage=false", "algorithm.old_logprobs=trainer",
          # log-probabilities 1024 tokens' logits at a time: with the full logits (152K-entry vocabulary, fp32,
          # several copies) the first MemAgent update reached 114 GiB on an H200 and the next run ran out
          "trainer.logits_chunk_tokens=1024"]


def memagent_overrides(model: str, out: Path, device: str, dry: bool) -> list[str]:
    """GRPO on synthetic documents: 4 tasks x 4 samples, 4 chunks of 256 tokens, 128-token memory."""
    n, chunk, mem = (2, 32, 8) if dry else (4, 256, 128)
    return ["workflow.name=memagent", "algorithm.name=grpo", f"algorithm.n={n}", f"trainer.batch_size={n}",
            f"workflow.chunk_tokens={chunk}", f"workflow.max_memory_tokens={mem}", "workflow.max_final_tokens=16",
            "data.synthetic.num_chunks=4", f"data.synthetic.chunk_words={chunk // 2}", f"model.path={model}",
            f"model.device={device}", f"out_dir={out}", "trainer.token_budget=32768", *COMMON]


def memact_overrides(model: str, out: Path, device: str, dry: bool) -> list[str]:
    """DCPO on the CPU MemAct tasks (memact_dcpo_cpu): 4 tasks x 4 trajectories, up to 4 turns of 64 tokens."""
    n = 2 if dry else 4
    tasks = out.parent / f"{out.name}_tasks.jsonl"
    write_tasks(tasks, make_tasks(MemActTaskConfig(), n, 7, "rl"))
    return ["--preset", "memact_dcpo_cpu", f"algorithm.n={n}", f"trainer.batch_size={n}",
            "workflow.max_assistant_turns=4", "workflow.max_turn_tokens=64", "workflow.max_context_tokens=2000",
            f"data.path={tasks}", f"model.path={model}", f"model.device={device}", f"out_dir={out}", *COMMON]


def one_step(overrides: list[str], device: str) -> dict[str, float]:
    preset = []
    if overrides[:1] == ["--preset"]:
        preset, overrides = [overrides[1]], overrides[2:]
    cfg = load_config(TrainConfig, overrides, preset=preset[0] if preset else None)
    seen: dict[str, float] = {}
    if device == "cuda":
        gc.collect()  # the previous run's models and engine
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = Trainer(assemble(cfg), on_step=lambda step, m: seen.update(m))
    try:
        trainer.fit()
    finally:
        trainer.close()
    wall = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")
    left = float("nan")
    if device == "cuda":  # what the closed run still holds on the device, inside and outside torch's allocator
        del trainer
        gc.collect()
        torch.cuda.empty_cache()
        free, total = torch.cuda.mem_get_info()
        left = (total - free) / 2**30
    return {"rollout_s": seen.get("time/rollout_s", float("nan")), "update_s": seen.get("time/update_s", float("nan")),
            "wall_s": wall, "gen_tokens": seen.get("rollout/generated_tokens", float("nan")),
            "train_tokens": seen.get("train/tokens", float("nan")), "peak_gib": peak, "left_gib": left}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dry-run", action="store_true", help="CPU, 2-layer models of the same vocabulary")
    ap.add_argument("--models", default=",".join(DRY), help=f"comma-separated: {', '.join(DRY)}")
    ap.add_argument("--json", default="")
    ap.add_argument("--child", nargs=3, metavar=("MODEL_DIR", "METHOD", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # one step in this process; its figures as the last line
        path, method, out = args.child
        build = memagent_overrides if method == "memagent-grpo" else memact_overrides
        print(json.dumps(one_step(build(path, Path(out), args.device, args.dry_run), args.device)))
        return
    device = "cpu" if args.dry_run else args.device
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu_steps.py: --device cuda needs a CUDA device (use --dry-run on a CPU)")
    names = [m for m in args.models.split(",") if m]
    unknown = [m for m in names if m not in DRY]
    if unknown:
        raise SystemExit(f"benchmarks/gpu_steps.py: unknown --models {unknown}; known: {', '.join(DRY)}")
    print(f"device: {torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}, torch {torch.__version__}"
          f"{' (dry run: 2-layer shapes)' if args.dry_run else ''}")
    print("| model | method | rollout s | update s | wall s | gen tokens | train tokens | peak GiB | left GiB |")
    print("|---|---|---|---|---|---|---|---|---|")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            path = str(random_model(Path(tmp) / name, DRY[name] if args.dry_run else name))
            for method in ("memagent-grpo", "memact-dcpo"):  # each step in a process of its own
                cmd = [sys.executable, os.path.abspath(__file__), "--device", device, "--child", path, method,
                       str(Path(tmp) / f"{name}_{method}")] + (["--dry-run"] if args.dry_run else [])
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    sys.stderr.write(proc.stderr[-4000:])
                    raise SystemExit(f"benchmarks/gpu_steps.py: {name} {method} failed (exit {proc.returncode})")
                r = json.loads(proc.stdout.strip().splitlines()[-1])
                results[f"{name}/{method}"] = r
                print(f"| {name} | {method} | {r['rollout_s']:.2f} | {r['update_s']:.2f} | {r['wall_s']:.1f} | "
                      f"{r['gen_tokens']:.0f} | {r['train_tokens']:.0f} | {r['peak_gib']:.2f} | {r['left_gib']:.2f} |",
                      flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main()
