"""Evaluate a finished `memrl demo` run again, under the protocol its overrides give (e.g. another seed).

Training is seeded and independent of the evaluation, so a run trained once can be scored on a dev seed
(to choose a recipe) and then on the held-out seed (to report it) without training twice:

    .venv/bin/python benchmarks/demo_eval.py --run runs/dev_p0.7 --out runs/heldout_p0.7 [the run's overrides]

Give the run's own overrides (the task / demonstrator settings must match; `eval.*` may differ). Reads
RUN/sft and RUN/rl's latest checkpoint, evaluates the demonstrator, SFT and SFT+RL like `memrl demo`,
and writes results.md / results.json (the demo's one layout: summary rows of this evaluation's rows) / plots
to --out (timings, SFT losses and the model's size copied from RUN/results.json, RL's per-step metrics read
from RUN/rl/metrics.jsonl; the evaluation times are this script's).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.recipes.memagent import RECIPE, evaluate_demonstrator, evaluate_lengths, heldout_tasks
    from memrl.recipes.parts import engine_eval
    from memrl.recipes.pipeline import load_recipe, results, write
    from memrl.training.checkpoints.checkpoint import latest_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--run", required=True, help="a finished `memrl demo --out` directory")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run = Path(args.run)
    demo = load_recipe(RECIPE, args.overrides, args.out)
    cfg, out = demo.cfg, demo.out
    old = json.loads((run / "results.json").read_text())
    tasks = heldout_tasks(cfg, demo.tcfg)
    demo.tokenizer = AutoTokenizer.from_pretrained(run / "sft")
    demo.facts["lengths"] = list(tasks)
    demo.timings, demo.sft_losses, demo.num_parameters = dict(old["timings"]), old["losses"]["sft"], old["num_parameters"]
    t0 = time.perf_counter()
    if cfg.eval.demonstrator:
        evaluate_demonstrator(demo, tasks, demo.rows)
    demo.timings["eval_scripted_s"] = time.perf_counter() - t0
    for stage, path in (("sft", run / "sft"), ("rl", latest_checkpoint(run / "rl" / "checkpoints"))):
        if path is None:
            raise SystemExit(f"{run}: no RL checkpoint under {run / 'rl' / 'checkpoints'}")
        t0 = time.perf_counter()
        print(f"{stage} ({path}), held-out:")
        model = AutoModelForCausalLM.from_pretrained(path)
        engine_eval(evaluate_lengths, demo, model, path, tasks, cfg.eval, log=print, rows=demo.rows, policy=stage)
        demo.timings[f"eval_{stage}_s"] = time.perf_counter() - t0
    demo.history = [json.loads(line) for line in (run / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    demo.timings["rl_s"] = sum(r.get("time/step_s", 0.0) for r in demo.history)
    demo.timings["total_s"] = sum(v for k, v in demo.timings.items() if k != "total_s")
    res = results(RECIPE, demo)
    print(write(RECIPE, res, out), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
