"""RL training with dotted config overrides (typed: memrl.training.config.TrainConfig).

  memrl train --preset demo_cpu model.path=runs/demo/sft out_dir=runs/rl algorithm.n=8
  memrl train --preset memagent_grpo model.path=/models/qwen2.5-7b-instruct data.name=file data.path=train.parquet
  memrl train ... --resume          # continue from out_dir/checkpoints/latest, exactly
  memrl train ... --overwrite       # delete the run out_dir holds and start again from step 0

An out_dir holding a run is refused without --resume or --overwrite (memrl.training.checkpoints.run_dir); the
directory is locked while the run lasts (memrl.locks).

Overrides: `section.key=value`; `workflow=memagent` / `algorithm=grpo` / `engine=vllm` select by name;
workflow settings are `workflow.<field>` (checked against the workflow's config class), engine settings
`engine.<field>` / `engine.{hf,vllm,openai}.<field>` (memrl.engines.config), as in `memrl eval`.
"""

from __future__ import annotations

import argparse

from memrl.config import load_config, to_yaml
from memrl.locks import locked_dir
from memrl.threads import apply as apply_threads
from memrl.training.assemble import assemble, validate
from memrl.training.checkpoints.run_dir import prepare_run_dir
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.add_argument("--preset", default=None, help="preset name (memrl/configs/<name>.yaml) or YAML path")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in out_dir")
    parser.add_argument("--overwrite", action="store_true",
                        help="out_dir holds a run: delete its checkpoints and start again from step 0")
    parser.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(TrainConfig, args.overrides, preset=args.preset)
    workflow = validate(cfg)
    if args.print_config:
        print(to_yaml(cfg), end="")
        return 0
    with locked_dir(cfg.out_dir, "out_dir"):  # one process per out_dir
        prepare_run_dir(cfg.out_dir, args.resume, args.overwrite)
        apply_threads(cfg.threads, load_aware=False)  # before any model loads (and before Ray starts: its workers inherit it)
        trainer = Trainer(assemble(cfg, resume=args.resume, workflow=workflow))  # fails here, before any model loads
        history = trainer.fit()
    if history:
        last = history[-1]
        print(f"trained to step {trainer.step}: reward {last.get('reward/mean', float('nan')):.3f}; "
              f"checkpoints in {trainer.ckpt_root}")
    return 0
