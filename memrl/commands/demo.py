"""The CPU demo: a tiny model learns, with RL, which facts a MemAgent memory must keep.

  memrl demo --out runs/demo
  memrl demo --agent memact --out runs/memact   # MemAct: cold start + DCPO (memrl.recipes.memact)
  memrl demo --agent context --out runs/ctx/fold/seed0 method=fold   # fold/summarize/window/react (memrl.recipes.context)
  memrl demo --agent mem1 --out runs/mem1/mem1/seed0 method=mem1      # mem1/full_history (memrl.recipes.mem1)
  memrl demo --agent infmem --out runs/infmem/infmem/seed0 method=infmem   # InfMem vs MemAgent (memrl.recipes.infmem)
  memrl demo --agent lookback --out runs/lookback/rememr1 method=rememr1   # ReMemR1 vs MemAgent (memrl.recipes.lookback)
  memrl demo --out runs/demo sft.p_aware=0.7 train.trainer.steps=40 eval.num_tasks=200

The recipe is `memrl.recipes.memagent` (init -> cold-start SFT on a mixture demonstrator -> GRPO on
MemAgent -> the demonstrator, SFT and SFT+RL evaluated on held-out tasks at 1x/4x/16x the training length,
greedy and sampled, by `memrl.eval.evaluator`); the tables and plots are `memrl.recipes.report`. Writes results.md (printed),
results.json, accuracy_vs_length.png, rl_reward.png. Overrides: `key=value` for the demo config
(`memrl.recipes.memagent.DemoConfig`), `train.<key>=value` for the RL config (preset demo_cpu); `engine.*`
and `workflow.*` are spelled as in `memrl train` and `memrl eval` (they set the RL config's sections,
which the demo's evaluations use too).
"""

from __future__ import annotations

import argparse
import shlex

from memrl.config import MAX_PARALLEL, ConfigError, bounded
from memrl.locks import locked_dir
from memrl.recipes.pipeline import get_recipe, run_recipe
from memrl.recipes.seeds import parse_capabilities, parse_seeds, run_sweep


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="demo overrides (sft.epochs=2) or RL overrides (train.trainer.steps=40)")
    parser.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    parser.add_argument("--agent", default="memagent", metavar="METHOD",
                        help="the recipe method (memrl.recipes.pipeline): memagent (default: memrl.recipes.memagent), "
                             "memact (memrl.recipes.memact: cold start + DCPO), context (memrl.recipes.context: "
                             "method=react|window|summarize|fold|fold_no_process, cold start + GRPO / FoldGRPO), mem1 "
                             "(memrl.recipes.mem1: method=mem1|full_history, cold start + GRPO), infmem "
                             "(memrl.recipes.infmem: method=infmem|memagent, cold start on the reading oracle + GRPO), "
                             "lookback (memrl.recipes.lookback: method=memagent|rememr1, the look-back task), "
                             "or an import path package.module:ATTR naming a Recipe")
    parser.add_argument("--seeds", default=None, metavar="K,K,...",
                        help="training seeds (0 = the recipe's own): one run each, in its own subprocess, then "
                             "mean +- sd (memrl.recipes.seeds)")
    parser.add_argument("--cpu-capability", default=None, metavar="CAP,CAP,...",
                        help="ATEN_CPU_CAPABILITY of each run: avx2, avx512, default (scalar kernels) or native (unset: "
                             "torch's choice, the default); runs seed 0 when --seeds is not given")
    parser.add_argument("--jobs", type=bounded(int, ge=1, le=MAX_PARALLEL), default=1, help="with --seeds: runs at a time (default 1)")
    parser.add_argument("--aggregate-only", action="store_true",
                        help="with --seeds: start nothing, aggregate the finished runs")


def run(args: argparse.Namespace) -> int:
    """The demo, or a sweep of it; the output directory is locked (memrl.locks) once the arguments are
    checked, so a bad command line makes no directory."""
    if args.seeds is not None or args.cpu_capability is not None:
        return run_seeds(args)
    if args.jobs != 1 or args.aggregate_only:
        raise ConfigError("--jobs and --aggregate-only need --seeds or --cpu-capability")
    run_recipe(get_recipe(getattr(args, "agent", "memagent")), args.out, args.overrides)
    return 0


def run_seeds(args: argparse.Namespace) -> int:
    """--seeds / --cpu-capability: memrl.recipes.seeds.run_sweep; exit 1 when a run failed."""
    seeds = parse_seeds(args.seeds if args.seeds is not None else "0")
    caps = parse_capabilities(args.cpu_capability if args.cpu_capability is not None else "native")
    command = shlex.join(["memrl", "demo", "--agent", args.agent, "--out", str(args.out), "--seeds",
                          ",".join(map(str, seeds)), "--cpu-capability", ",".join(caps), *args.overrides])
    if args.aggregate_only:  # reads finished runs only
        text, status = run_sweep(args.agent, args.out, seeds, caps, list(args.overrides), jobs=args.jobs,
                                 aggregate_only=True, command=command)
    else:
        with locked_dir(args.out, "--out"):  # one sweep per directory (each run locks its own)
            text, status = run_sweep(args.agent, args.out, seeds, caps, list(args.overrides), jobs=args.jobs,
                                     command=command)
    print(text, end="")
    print(f"wrote {args.out}/seeds_results.md, {args.out}/seeds_results.json")
    failed = [f"{p} ({s})" for p, s in status.items() if s.startswith("failed")]
    if failed:
        print(f"memrl demo: {len(failed)} run(s) failed, see their log.txt: {', '.join(failed)}")
        return 1
    return 0
