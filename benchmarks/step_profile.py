"""Where one RL step of the real-model preset spends its time, phase by phase, with the CPU named.

  .venv/bin/python benchmarks/step_profile.py --model DIR --hotpot FILE [--preset smollm2_memagent_cpu]
      [--steps 2] [--threads 2] [--out runs/step_profile] [--set KEY=VALUE ...]

One `memrl train` run (in this process, the preset as written plus --set overrides) for --steps steps on
HotpotQA questions at 2 documents (the preset's training length), built once from the dev file --hotpot
(seed 1, 16 questions), 4 questions x 8 samples a step, rewarded by `format_f1` (half for one box, half the reply's
token F1: the preset's boxed verifier pays nothing zero-shot, and the update would then train no row; --set
overrides both). The first step is reported apart (it pays the one-time costs: loading, the first
allocations); the table is the mean of the others. Timers are wrapped around the step's pieces without
changing them:

  rollout    the engine's own counters (memrl.engines.hf_scheduler.EngineStats): prefill forwards, decode
             forwards, sampling (token choice and logprobs), KV-cache bookkeeping; "engine other" is the rest
             of the engine worker's time (Python per decode step: scheduling, admission, stop checks); "workflow
             and runtime" is what the rollout stage took beyond the engine (prompt building, tokenising,
             scoring, the event loop)
  update     old log-probs (the trainer's recomputation pass), the reference pass (only with a KL term), the
             PPO forward, the backward, gradient clipping, the optimizer step, the weight sync to the engine
             and the rest of the stage (packing, advantages, metrics)

Achieved matmul rates count 2 x (weights of the linear layers a token passes through) per token (x3 for a
forward + backward; the vocabulary projection only where logits are taken), against the machine's fp32 and
bf16 matmul peaks measured at the same thread count (benchmarks/engine_compare.measure_peak). LoRA's share is
measured apart on one micro-batch: the forward with the adapters on against the same forward with them off.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# The step the issue timed: 4 questions x 8 samples. Zero-shot the model boxes no answer, so the preset's verifier
# pays 0 everywhere and the update would train nothing: the profile pays format_f1 (half for one box, half the
# reply's token F1), which differs within almost every group.
PROFILE_SET = ["trainer.batch_size=4", "workflow.reward=format_f1"]
ENGINE_FIELDS = ("prefill_s", "decode_s", "sample_s", "cache_s", "generate_seconds", "prompt_tokens",
                 "prefill_tokens", "generated_tokens", "decode_steps", "prefill_calls", "prefix_hit_tokens")


def cpu_line() -> str:
    """The CPU's model name and the ISA flags that decide matmul speed (present / absent)."""
    name, flags = "unknown", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and name == "unknown":
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
    return f"{name}; {os.cpu_count()} CPUs; " + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in wanted)


class Clock:
    """Seconds per named piece, accumulated; `wrap(obj, attr, name)` times every call of obj.attr."""

    def __init__(self) -> None:
        self.s: dict[str, float] = defaultdict(float)

    def wrap(self, obj: object, attr: str, name: str) -> None:
        fn = getattr(obj, attr)

        def timed(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.s[name] += time.perf_counter() - t0

        setattr(obj, attr, timed)


def build_data(hotpot: str, out: Path) -> Path:
    from memrl.cli import main as memrl

    data = out / "data"
    if not (data / "manifest.json").is_file():
        rc = memrl(["data", "build", "--kind", "hotpotqa", "--source", hotpot, "--docs", "2", "--num-questions", "16",
                    "--seed", "1", "--out", str(data)])
        if rc:
            raise SystemExit(f"data build failed ({rc})")
    files = sorted(data.glob("*2*.json*")) or sorted(p for p in data.iterdir() if p.name != "manifest.json")
    return files[0]


def linear_weights(model) -> tuple[int, int]:
    """(weights of the decoder's linear layers, weights of the vocabulary projection)."""
    import torch

    head = model.get_output_embeddings().weight
    lin = sum(m.weight.numel() for m in model.modules()
              if isinstance(m, torch.nn.Linear) and m.weight is not head and "lora_" not in type(m).__name__.lower())
    return lin, head.numel()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--hotpot", required=True, help="HotpotQA dev (distractor) file, .json or .json.xz")
    ap.add_argument("--preset", default="smollm2_memagent_cpu")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="runs/step_profile")
    ap.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE")
    ap.add_argument("--report", action="store_true", help="print the tables from --out's steps.json (no run)")
    args = ap.parse_args(argv)
    if args.steps < 2:
        ap.error("--steps must be at least 2 (the first step is reported apart)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print("CPU:", cpu_line(), flush=True)

    import torch

    if args.report:
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(args.threads)
        steps = json.loads((out / "steps.json").read_text())
        report(steps, AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32), args)
        return 0

    torch.set_num_threads(args.threads)

    from memrl.cli import main as memrl
    from memrl.engines import hf as hf_mod
    from memrl.training import trainer as trainer_mod
    from memrl.training.ranks import workers as workers_mod

    train = build_data(args.hotpot, out)
    clock = Clock()
    engines: list = []
    steps: list[dict] = []
    models: list = []

    init = hf_mod.HFEngine.__init__

    def grab(self, *a, **kw):
        init(self, *a, **kw)
        engines.append(self)

    hf_mod.HFEngine.__init__ = grab
    clock.wrap(workers_mod, "ppo_micro_loss", "ppo forward")
    clock.wrap(workers_mod, "token_logprobs", "reference pass")
    clock.wrap(torch.Tensor, "backward", "backward")
    clock.wrap(torch.nn.utils, "clip_grad_norm_", "grad clip")
    clock.wrap(torch.optim.AdamW, "step", "optimizer step")
    clock.wrap(trainer_mod.Trainer, "sync", "weight sync")

    step_fn = trainer_mod.Trainer.train_step

    def step(self):
        models[:] = [self.model]
        eng = [{f: getattr(e.stats, f) for f in ENGINE_FIELDS} for e in engines]
        before = dict(clock.s)
        t0, c0 = time.perf_counter(), time.process_time()
        metrics = step_fn(self)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        after = [{f: getattr(e.stats, f) for f in ENGINE_FIELDS} for e in engines]
        zero = dict.fromkeys(ENGINE_FIELDS, 0)
        delta = {f: sum(a[f] - (eng[i] if i < len(eng) else zero)[f] for i, a in enumerate(after)) for f in ENGINE_FIELDS}
        rec = {"wall_s": wall, "cpu_s": cpu, "engine": delta, "pieces": {k: clock.s[k] - before.get(k, 0.0) for k in clock.s},
               "metrics": {k: v for k, v in metrics.items() if k.startswith(("time/", "train/", "rollout/", "perf/"))}}
        steps.append(rec)
        print(f"step {len(steps)}: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
        return metrics

    trainer_mod.Trainer.train_step = step
    rc = memrl(["train", "--preset", args.preset, f"model.path={args.model}", f"data.path={train}",
                f"out_dir={out / 'run'}", f"trainer.steps={args.steps}", "trainer.save_every=0",
                f"threads.intra_op={args.threads}", *PROFILE_SET, *args.set])
    if rc:
        raise SystemExit(f"train failed ({rc})")
    (out / "steps.json").write_text(json.dumps(steps, indent=1))

    model = models[0]
    report(steps, model, args)
    lora_share(model, args.threads)
    return 0


def report(steps: list[dict], model, args: argparse.Namespace) -> None:
    """The two tables from the recorded steps (steps.json): time by phase, matmul rates against the peaks."""
    import torch
    from engine_compare import measure_peak

    later = steps[1:]

    def mean(get) -> float:
        return statistics.fmean(get(s) for s in later)

    piece = lambda k: mean(lambda s: s["pieces"].get(k, 0.0))  # noqa: E731
    eng = lambda k: mean(lambda s: s["engine"][k])  # noqa: E731
    met = lambda k: mean(lambda s: s["metrics"].get(k, 0.0))  # noqa: E731
    wall = mean(lambda s: s["wall_s"])
    rollout, update = met("time/rollout_s"), met("time/update_s")
    busy = eng("generate_seconds")
    parts = eng("prefill_s") + eng("decode_s") + eng("sample_s") + eng("cache_s")
    old = met("time/old_logprobs_s")
    upd_known = old + piece("ppo forward") + piece("backward") + piece("grad clip") + piece("optimizer step") \
        + piece("weight sync")
    rows = [
        ("rollout: prefill forwards", eng("prefill_s"), f"{eng('prefill_tokens'):.0f} tok"),
        ("rollout: decode forwards", eng("decode_s"), f"{eng('decode_steps'):.0f} steps, {eng('generated_tokens'):.0f} tok"),
        ("rollout: sampling", eng("sample_s"), ""),
        ("rollout: KV-cache bookkeeping", eng("cache_s"), ""),
        ("rollout: engine other (Python per step)", busy - parts, f"{1e3 * (busy - parts) / max(eng('decode_steps'), 1):.1f} ms/decode step"),
        ("rollout: workflow and runtime", rollout - busy, ""),
        ("update: old log-probs", old, ""),
        ("update: reference pass", piece("reference pass"), ""),
        ("update: PPO forward", piece("ppo forward") - piece("reference pass"), ""),
        ("update: backward", piece("backward"), ""),
        ("update: grad clip", piece("grad clip"), ""),
        ("update: optimizer step", piece("optimizer step"), ""),
        ("update: weight sync", piece("weight sync"), ""),
        ("update: other", update - upd_known, ""),
    ]
    print(f"\n{args.preset}, {args.threads} threads; steps 2..{len(steps)} mean (first step {steps[0]['wall_s']:.1f} s)")
    print("| phase | s | share | note |\n|---|---:|---:|---|")
    for name, s, note in rows:
        print(f"| {name} | {s:.1f} | {100 * s / wall:.0f}% | {note} |")
    cpu = mean(lambda s: s["cpu_s"])
    print(f"| **step** | {wall:.1f} | 100% | rollout {rollout:.1f} s, update {update:.1f} s; "
          f"{cpu:.1f} CPU s ({cpu / wall:.2f} cores busy) |")

    lin, head = linear_weights(model)
    p32 = measure_peak(args.threads, n=1024, dtype=torch.float32) / 1e9
    pbf = measure_peak(args.threads, n=1024, dtype=torch.bfloat16) / 1e9
    pre_f = 2 * lin * eng("prefill_tokens") + 2 * head * eng("prefill_calls")
    dec_f = (2 * lin + 2 * head) * eng("generated_tokens")
    trained, forwarded = met("train/tokens"), met("train/forwarded_tokens") or met("train/tokens")
    upd_f = 3 * (2 * lin + 2 * head) * forwarded  # prefix sharing forwards each shared prefix once
    old_f = (2 * lin + 2 * head) * forwarded
    print("\n| work | GFLOP/s | of fp32 peak | of bf16 peak |\n|---|---:|---:|---:|")
    for name, f, s in (("prefill", pre_f, eng("prefill_s")), ("decode", dec_f, eng("decode_s")),
                       ("old log-probs", old_f, old),
                       ("update fwd+bwd", upd_f, piece("ppo forward") + piece("backward"))):
        if s <= 0:
            print(f"| {name} | - | - | - |")
            continue
        rate = f / s / 1e9
        print(f"| {name} | {rate:.1f} | {100 * rate / p32:.0f}% | {100 * rate / pbf:.0f}% |")
    print(f"peaks at {args.threads} threads: fp32 {p32:.1f} GFLOP/s, bf16 {pbf:.1f} GFLOP/s; "
          f"trained tokens/step {trained:.0f} ({forwarded:.0f} forwarded), update {trained / max(update, 1e-9):.0f} tok/s")




def lora_share(model, threads: int) -> None:
    """One forward of 8 x 256 tokens with the LoRA adapters on, then off (no gradient): their share."""
    import torch

    if not hasattr(model, "disable_adapter"):
        print("LoRA: the model has no adapters")
        return
    ids = torch.randint(3, 1000, (8, 256))
    times = {"on": [], "off": []}
    with torch.no_grad():
        for _ in range(3):
            for mode in ("on", "off"):
                t0 = time.perf_counter()
                if mode == "on":
                    model(input_ids=ids)
                else:
                    with model.disable_adapter():
                        model(input_ids=ids)
                times[mode].append(time.perf_counter() - t0)
    on, off = min(times["on"]), min(times["off"])
    print(f"LoRA: forward of 8 x 256 tokens {on:.2f} s with the adapters, {off:.2f} s without: "
          f"{100 * (on - off) / on:.0f}% of the forward ({threads} threads)")


if __name__ == "__main__":
    raise SystemExit(main())
