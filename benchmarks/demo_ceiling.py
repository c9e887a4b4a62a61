"""What can the demo's model represent? Supervised training on the OPTIMAL policy's traces.

`memrl demo` asks RL to discover question-dependent retention (keep the fact whose key is the question's)
from a question-blind cold start. This script trains the same freshly initialised model, with the same
SFT budget, on traces of `memrl.demonstrators.QuestionAwareDemonstrator` (the optimal one-hop policy, 100% by
construction; the demo's mixture demonstrator at p_aware = 1) and evaluates it greedily on the demo's
held-out tasks. If even full supervision stays near the
question-blind level, the demo's RL goal is limited by the model, not by the RL algorithm.

    .venv/bin/python benchmarks/demo_ceiling.py --out runs/ceiling [demo overrides, e.g. hidden_size=192]
    .venv/bin/python benchmarks/demo_ceiling.py --out runs/ceiling train.data.synthetic.num_keys=4
    .venv/bin/python benchmarks/demo_ceiling.py --out runs/oft --start-from runs/demo/sft sft.epochs=1

`--start-from DIR` trains an existing checkpoint (e.g. the demo's question-blind cold start, `DIR/sft`)
instead of a fresh model: how many supervised steps on the optimal policy does it take to leave the
question-blind policy? (docs/results/demo.md, round 3). Give it the same task overrides the checkpoint was
trained with.

Overrides are `memrl demo`'s (`train.*` go to the demo_cpu training preset). Prints the oracle's own
accuracy, then one table row: parameters, SFT seconds and the SFT model's held-out greedy accuracy per
length.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from memrl.recipes.memagent import RECIPE, evaluate_lengths, heldout_tasks
from memrl.recipes.parts import engine_eval
from memrl.recipes.pipeline import cold_start, load_recipe


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--out", default="runs/demo_ceiling")
    ap.add_argument("--start-from", default=None, metavar="DIR",
                    help="HF checkpoint to fine-tune (default: a fresh model, as `memrl demo` inits it)")
    args = ap.parse_args()
    run = load_recipe(RECIPE, ["train.trainer.progress=false", *args.overrides], args.out)
    cfg = run.cfg = replace(run.cfg, sft=replace(run.cfg.sft, p_aware=1.0),
                            eval=replace(run.cfg.eval, samples=0, greedy=True))
    t0 = time.perf_counter()
    if args.start_from:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        run.tokenizer = AutoTokenizer.from_pretrained(args.start_from)
        run.model = AutoModelForCausalLM.from_pretrained(args.start_from)
    else:
        RECIPE.init(run)
    cold_start(run, RECIPE.demonstrations(run)[0], tensorboard=run.tcfg.trainer.tensorboard)
    sft_s = time.perf_counter() - t0
    tasks = heldout_tasks(cfg, run.tcfg)
    lengths = list(tasks)
    res = {int(n): r["greedy"] for n, r in
           engine_eval(evaluate_lengths, run, run.model, run.out / "sft", tasks, cfg.eval, log=print).items()}
    params = sum(p.numel() for p in run.model.parameters())
    print("| overrides | params | SFT s | " + " | ".join(f"{n} chunks" for n in lengths) + " |")
    print("|---|---:|---:|" + "---:|" * len(lengths))
    cells = " | ".join(f"{res[n]['accuracy']:.1f}" for n in lengths)
    label = " ".join(args.overrides) or "(defaults)"
    if args.start_from:
        label = f"from {args.start_from}: {label}"
    print(f"| {label} | {params / 1e6:.2f}M | {sft_s:.0f} | {cells} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
