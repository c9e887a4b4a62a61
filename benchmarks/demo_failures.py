"""Where a demo policy's memory loses the asked fact: every memory call classified (memrl.recipes.retention).

    .venv/bin/python benchmarks/demo_failures.py --run runs/demo --chunks 32 eval.seed=24680

Evaluates RUN/sft and RUN/rl's latest checkpoint (or each --checkpoint DIR, a HF directory) on
`eval.num_tasks` tasks of --chunks pieces from `eval.seed`, sampled (`eval.samples` per task at
`eval.temperature`; with --demonstrator also the scripted mixture), and prints per policy the accuracy, the per-rewrite loss rate of a held fact, the capture
rate, the count of each event and a few examples of each kind of loss. Give the run's own overrides
(task / workflow settings must match); use a dev seed, not the held-out one, when choosing a recipe.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from memrl.eval.stats import cell, recorded


def main() -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.synthetic import at_length, make_tasks
    from memrl.demonstrators import ScriptedEngine
    from memrl.eval.evaluator import EngineRollout, accuracy, evaluate_rows, model_engine
    from memrl.recipes.memagent import RECIPE, demonstrator
    from memrl.recipes.pipeline import load_recipe
    from memrl.recipes.retention import EVENTS, RetentionCounter
    from memrl.training.checkpoints.checkpoint import latest_checkpoint

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    ap.add_argument("--run", required=True, help="a finished `memrl demo --out` directory (its tokenizer)")
    ap.add_argument("--chunks", type=int, default=32)
    ap.add_argument("--checkpoint", action="append", default=None,
                    help="a HF model directory (repeatable; default: RUN/sft and RUN/rl's latest checkpoint)")
    ap.add_argument("--examples", type=int, default=3)
    ap.add_argument("--demonstrator", action="store_true", help="also the scripted mixture demonstrator")
    args = ap.parse_args()
    run = Path(args.run)
    demo = load_recipe(RECIPE, args.overrides, run / "failures_tmp")
    cfg, tcfg, spec, wf_cfg = demo.cfg, demo.tcfg, demo.spec, demo.wf_cfg
    syn = at_length(tcfg.data.synthetic, args.chunks)
    tasks = make_tasks(syn, cfg.eval.num_tasks, seed=cfg.eval.seed)
    tok = AutoTokenizer.from_pretrained(run / "sft")
    paths = args.checkpoint or [str(run / "sft"), str(latest_checkpoint(run / "rl" / "checkpoints"))]
    for path in paths:
        if not (Path(path) / "config.json").is_file():
            raise SystemExit(f"--checkpoint {path}: not a HuggingFace model directory (no config.json)")
    rows = []

    def score(label: str, engine) -> None:  # noqa: ANN001
        counter = RetentionCounter(sep=syn.fact_sep, keep_examples=args.examples)
        res = evaluate_rows(EngineRollout(engine, spec), wf_cfg, tasks, cfg.eval.samples, cfg.eval.temperature,
                            cfg.eval.seed, on_trajectory=counter.add)
        rows.append((label, accuracy(res), counter))

    if args.demonstrator:
        rule = demonstrator(cfg, tcfg, wf_cfg, seed=cfg.eval.seed)
        score(f"demonstrator (p_aware {cfg.sft.p_aware})", ScriptedEngine(rule, tokenizer=tok))
    for path in paths:
        with model_engine(AutoModelForCausalLM.from_pretrained(path), tok, tcfg.engine, path) as engine:
            score(path, engine)
    print(f"{len(tasks)} tasks x {cfg.eval.samples} samples at T={cfg.eval.temperature}, {args.chunks} chunks, "
          f"seed {cfg.eval.seed}\n")
    print("| policy | acc % | loss rate / rewrite % | capture % | " + " | ".join(EVENTS) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(EVENTS))
    for path, (acc, se), c in rows:
        print(f"| {path} | {cell(recorded(acc, se))} | {100 * c.loss_rate:.2f} | {100 * c.capture_rate:.1f} | "
              + " | ".join(str(c.events[e]) for e in EVENTS) + " |")
    for path, _, c in rows:
        print(f"\n{path}: examples (previous memory | section | new memory)")
        for ev, exs in c.examples.items():
            for prev, sec, new in exs:
                print(f"  {ev}: {prev!r} | {sec.strip()!r} | {new!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
