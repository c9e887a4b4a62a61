"""Where the hf engine's time goes in the CPU demo's held-out evaluation, for one KV-cache layout (issue 47).

    PYTHONPATH=$PWD taskset -c 1 python benchmarks/demo_eval_prefill.py --sft runs/demo/sft --layout slots \
        [--out /tmp/demo_eval_prefill] [KEY=VALUE ...]

The demo's evaluation protocol (greedy and sampled) on its held-out tasks, with the model of --sft (a
finished demo's SFT checkpoint, copied into --out/sft), `engine.hf.kv_cache=--layout`,
`eval.multipliers=[1]` and `threads=1` (pin the process to one core for comparable timings) plus KEY=VALUE
in `memrl demo`'s spelling. Printed: the accuracy lines, the wall time of the evaluation and the engine's
counters (`HFEngine.stats`: prefill passes, positions computed, padding, prefix-cache hits, seconds).
Run one layout at a time: the figures of two processes sharing cores are not comparable.
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.eval.evaluator import EngineRollout, model_engine
from memrl.recipes.memagent import RECIPE, evaluate_lengths, heldout_tasks
from memrl.recipes.pipeline import load_recipe


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sft", type=Path, required=True, help="a finished demo's SFT checkpoint directory")
    ap.add_argument("--layout", choices=("padded", "slots"), required=True)
    ap.add_argument("--out", type=Path, default=Path("/tmp/demo_eval_prefill"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args(argv)
    if not (args.sft / "config.json").is_file():
        raise SystemExit(f"--sft {args.sft}: no config.json (not a model checkpoint)")
    out = args.out / args.layout
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    shutil.copytree(args.sft, out / "sft")
    overrides = [f"engine.hf.kv_cache={args.layout}", "eval.multipliers=[1]", "threads=1", *args.overrides]
    run = load_recipe(RECIPE, overrides, out)
    cfg, tcfg, out, spec, wf = run.cfg, run.tcfg, run.out, run.spec, run.wf_cfg
    tasks = heldout_tasks(cfg, tcfg)
    tok = AutoTokenizer.from_pretrained(out / "sft")
    model = AutoModelForCausalLM.from_pretrained(out / "sft")
    with model_engine(model, tok, tcfg.engine, out / "sft") as engine:
        t0 = time.perf_counter()
        evaluate_lengths(EngineRollout(engine, spec), wf, tasks, cfg.eval, log=print)
        wall = time.perf_counter() - t0
        st = engine.stats
    print(f"layout {args.layout}: wall {wall:.1f} s")
    for name in ("requests", "prompt_tokens", "generated_tokens", "prefill_calls", "prefill_tokens",
                 "prefix_hit_tokens", "decode_steps", "padded_positions", "prefill_s", "decode_s", "sample_s",
                 "cache_s", "generate_seconds"):
        v = getattr(st, name)
        print(f"  {name}: {v:.2f}" if isinstance(v, float) else f"  {name}: {v}")


if __name__ == "__main__":
    main()
