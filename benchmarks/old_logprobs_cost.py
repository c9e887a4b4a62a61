"""The cost of algorithm.old_logprobs=trainer on a recipe: RL steps with the engine's logprobs as the PPO
ratio's "old" side vs with the trainer's recompute (one extra forward over every row, before the first
optimizer step), run in alternation on the same model and data; prints each mode's median step and update
time and the recompute's share of the update.

    PYTHONPATH=$PWD python benchmarks/old_logprobs_cost.py --model runs/demo/sft [--steps 4] [--rounds 2]
        [--preset demo_cpu] [KEY=VALUE ...]

--model: the policy to train (the CPU demo's SFT checkpoint, `make demo` writes runs/demo/sft). Each round
trains `--steps` steps from that model in each mode (the first step of a run is left out of the medians).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

MODES = ("engine", "trainer")


def run(model: str, preset: str, steps: int, mode: str, out: Path, extra: list[str]) -> list[dict[str, float]]:
    cfg = load_config(TrainConfig, [f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}",
                                    "trainer.save_every=0", "trainer.progress=false", "trainer.tensorboard=false",
                                    f"algorithm.old_logprobs={mode}", *extra], preset=preset)
    return Trainer(assemble(cfg)).fit()[1:]  # the first step includes start-up work


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="policy directory (e.g. runs/demo/sft)")
    ap.add_argument("--preset", default="demo_cpu")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    if not (Path(args.model) / "config.json").is_file():
        print(f"old_logprobs_cost: --model {args.model} is not a model directory (make demo writes runs/demo/sft)",
              file=sys.stderr)
        return 2
    got: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in MODES:
                got[mode] += run(args.model, args.preset, args.steps, mode, Path(tmp) / f"{mode}{r}", args.overrides)
    print(f"{args.preset} on {args.model}: {args.rounds} rounds x {args.steps - 1} timed steps per mode (medians)")
    print(f"{'old_logprobs':<13} {'step_s':>8} {'update_s':>9} {'recompute_s':>12} {'share of update':>16} "
          f"{'train tokens':>13}")
    for mode in MODES:
        rows = got[mode]
        med = {k: statistics.median(m.get(k, 0.0) for m in rows)
               for k in ("time/step_s", "time/update_s", "time/old_logprobs_s", "train/tokens")}
        share = med["time/old_logprobs_s"] / med["time/update_s"] if med["time/update_s"] else 0.0
        print(f"{mode:<13} {med['time/step_s']:>8.2f} {med['time/update_s']:>9.2f} {med['time/old_logprobs_s']:>12.2f} "
              f"{100 * share:>15.1f}% {med['train/tokens']:>13.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
