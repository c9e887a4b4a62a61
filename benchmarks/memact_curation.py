"""MemAct's context curation (issue 33): DCPO with the prune tool vs the same training with it withheld.

    .venv/bin/python benchmarks/memact_curation.py --out runs/curation --seeds 0,1,2 threads=1
    .venv/bin/python benchmarks/memact_curation.py --out runs/curation --seeds 0,1,2 --aggregate-only

The task is the MemAct demo's `variant=curation` (memrl.recipes.memact.VARIANTS; docs/concepts/memact.md "Context
curation"): 8 sub-questions, 4 facts per search result, a working-context budget that holds the task prompt
and every result, so the search-only agent answers every task and pruning only shortens the context. Per
training seed k (shifting every training seed like `memrl demo --seeds`, never the held-out eval.seed) two
arms with the same model shape, init, tokenizer, SFT and RL budgets:

- `dcpo`: cold start on the scripted agent that prunes its 2 held results into a note with probability
  1 - sft.late_prob, then DCPO (preset memact_dcpo_cpu) with the prune tool offered; evaluated with it;
- `withheld`: the same, `workflow.prune_tool=false` everywhere: the scripted agent only searches and
  answers, DCPO and the evaluation never offer prune_context.

The copy warm-up is computed once per seed (SEED_DIR/copy_warmup.pt, with the tokenizer's hash) and loaded
by both arms. Each arm runs the demo's stages in this process and writes SEED_DIR/<arm>/results.json (the demo's
one results layout, memrl.recipes.pipeline.results: its summary rows are the arm after RL, policy rl;
its facts add the arm, the prune tool, the overrides and the cold start's size);
resumable: a finished arm is not run again, an unfinished one starts again from an empty directory. Then
ROOT/curation_results.md (printed) and ROOT/curation_results.json: per arm and decoding, mean +- sd over
seeds (ddof 1) of accuracy, its standard error over tasks, mean and peak working context, prunes per
task, overflow; and the goal (equal accuracy within one standard error, mean context >= 30% shorter).

`--dev` also evaluates each arm on the dev tasks (DEV_EVAL_SEED; results.json's facts "eval_dev": their summary
rows) and prints those
instead of the held-out result: pilots and tuning look at the dev tasks only. Training does not depend on
the evaluation, so a pilot whose recipe is kept is a finished arm of the sweep (its held-out result, stored
but not looked at, counts like any other). Other arguments are demo overrides
(`key=value`, `train.<key>=value`), applied to both arms.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from memrl.eval.fields import one, summary_rows
from memrl.eval.stats import cell, recorded
from memrl.recipes.memact import MemActRecipe
from memrl.recipes.pipeline import RecipeRun, execute, load_recipe

ARMS: dict[str, tuple[str, ...]] = {
    "dcpo": (),
    "withheld": ("workflow.prune_tool=false", "sft.batch_rows=4", "sft.epochs=4", "sft.copy_warmup_rows=32")}
"""Arm -> its overrides on top of variant=curation (and after the command line's). The withheld arm's cold
start takes as many optimizer steps over as many tokens as the dcpo arm's: a search-only trajectory is one
~742-token row, a pruning one ~3.7 rows of ~384 tokens, so at the variant's 8 rows x 2 epochs the dcpo arm
takes ~1,400 steps (seed 0: 1,398 over 4.29M tokens) and the withheld arm took 375 (over 2.23M) and learned
nothing (docs/concepts/memact.md); at 4 rows x 4 epochs it takes 1,500 over 4.45M. Its copy warm-up keeps the dcpo
arm's 32 rows per step (4 x 8), so both arms load the same one."""
ARM_NAMES = {"dcpo": "DCPO (prune tool)", "withheld": "prune withheld"}
DEV_EVAL_SEED = 24680
"""The pilots' evaluation seed (another task seed than the held-out eval.seed and every training seed)."""
GOAL_REDUCTION = 0.30
METRICS = ("accuracy", "accuracy_se", "mean_context_tokens", "peak_context_tokens", "prunes_per_task", "overflow")


# ---------------------------------------------------------------------------------------------- one arm


def arm_overrides(arm: str, seed: int, extra: list[str], only: tuple[str, ...] = ()) -> list[str]:
    """The demo overrides of `arm` at training seed `seed` (memrl.recipes.seeds: every training seed + seed):
    the variant, `extra` (both arms'), the arm's own (ARMS), then `only` (this arm's, from `--set`)."""
    from memrl.recipes.memact import expand_variant
    from memrl.recipes.seeds import base_seeds, seed_overrides

    user = ["variant=curation", *extra, *ARMS[arm], *only]
    return [*user, *seed_overrides("memact", seed, base_seeds("memact", expand_variant(user)))]


def tokenizer_hash(tokenizer: Any) -> str:
    return hashlib.sha256(json.dumps(tokenizer.get_vocab(), sort_keys=True).encode()).hexdigest()


class CurationArm(MemActRecipe):
    """One arm as a method of the recipe pipeline (the MemAct demo's stages): the copy warm-up shared by both
    arms of a seed (SEED_DIR/copy_warmup.pt, checked against the tokenizer's hash and the warm-up settings),
    no evaluation of the cold start, and with `dev` also the dev tasks after RL."""

    def __init__(self, arm: str, seed_dir: Path, dev: bool) -> None:
        self.arm, self.seed_dir, self.dev = arm, seed_dir, dev

    def init(self, run: RecipeRun) -> None:
        super().init(run)
        print(f"[{self.arm}] working-context budget {run.wf_cfg.max_context_tokens} tokens, prune tool "
              f"{'on' if run.wf_cfg.prune_tool else 'withheld'}", flush=True)

    def warmup(self, run: RecipeRun) -> list[float]:
        import torch

        cfg, model, warm = run.cfg, run.model, self.seed_dir / "copy_warmup.pt"
        tok_hash = tokenizer_hash(run.tokenizer)
        recipe = {"steps": cfg.sft.copy_warmup_steps, "rows": cfg.sft.warmup_rows(), "lr": cfg.sft.lr}
        if warm.is_file():
            saved = torch.load(warm, weights_only=True)
            if saved["tokenizer_sha256"] != tok_hash:
                raise SystemExit(f"{warm}: made with another tokenizer than this arm's; remove it to start the seed "
                                 "again")
            made = {k: saved.get(k) for k in recipe}
            if made != recipe:
                raise SystemExit(f"{warm}: made with copy warm-up {made}, this arm asks for {recipe}; remove it to "
                                 "start the seed again")
            model.load_state_dict(saved["state_dict"])
            return []
        losses = super().warmup(run)
        tmp = warm.with_suffix(".tmp")
        torch.save({"state_dict": model.state_dict(), "tokenizer_sha256": tok_hash, **recipe}, tmp)
        tmp.replace(warm)
        return losses

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        if policy == "sft":
            return []  # the table compares the arms after RL
        from memrl.data.synthetic_memact import make_tasks
        from memrl.recipes.parts import engine_eval
        from memrl.recipes.summaries import evaluate_memact

        cfg, prune = run.cfg, run.wf_cfg.prune_tool
        rows = engine_eval(evaluate_memact, run, model, model_dir, run.extra["data"].eval_tasks, prune_tool=prune,
                           policy=policy)
        if self.dev:  # the dev tasks: what a pilot prints and tunes on (the held-out result is only stored)
            dev_tasks = make_tasks(cfg.task, cfg.eval.num_tasks, DEV_EVAL_SEED, prefix="dev")
            dev = engine_eval(evaluate_memact, run, model, model_dir, dev_tasks, cfg.eval.temperature, DEV_EVAL_SEED,
                              prune_tool=prune, policy="dev")
            run.facts["eval_dev"] = summary_rows(dev, self.fields_for(cfg))
        return rows

    def arm_facts(self, run: RecipeRun) -> dict[str, Any]:
        """The arm's facts beside the demo's: the arm, the prune tool, the overrides and the cold start's size
        (its steps, rows per step, epochs, final loss)."""
        cfg, losses = run.cfg, run.sft_losses
        return dict(arm=self.arm, prune_tool=run.wf_cfg.prune_tool, overrides=run.extra["overrides"],
                    sft={"steps": len(losses), "batch_rows": cfg.sft.batch_rows, "epochs": cfg.sft.epochs,
                         "final_loss": losses[-1] if losses else None})


def run_arm(seed_dir: Path, arm: str, overrides: list[str], dev: bool = False) -> dict[str, Any]:
    """One arm through the recipe pipeline (memrl.recipes.pipeline.execute; module docstring); returns and
    writes what its results.json holds. `dev`: also evaluates on the dev tasks (DEV_EVAL_SEED), which is what
    it prints."""
    out_dir = seed_dir / arm
    if out_dir.exists():
        shutil.rmtree(out_dir)  # an unfinished arm starts again from nothing
    recipe = CurationArm(arm, seed_dir, dev)
    run = load_recipe(recipe, overrides, out_dir)
    run.extra["overrides"] = overrides
    res = execute(recipe, run)
    res["facts"].update(recipe.arm_facts(run))  # the demo's results.json (one layout) with the arm's facts
    (run.out / "results.json").write_text(json.dumps(res, indent=1) + "\n", encoding="utf-8")
    dev = "eval_dev" in res["facts"]
    for mode in ("greedy", "sampled"):
        e = one(res["facts"]["eval_dev"] if dev else res["summary"], decoding=mode)
        print(f"[{arm}] {'dev ' if dev else ''}{mode}: accuracy "
              f"{cell(recorded(e['accuracy'], e['accuracy_se']))}, mean context {e['mean_context_tokens']:.1f}, peak "
              f"{e['peak_context_tokens']:.1f}, prunes/task {e['prunes_per_task']:.2f}, overflow {e['overflow']:.1f}% "
              f"({run.timings['total_s'] / 60:.1f} min)", flush=True)
    return res


# ---------------------------------------------------------------------------------------------- the table


def arm_eval(res: dict[str, Any], mode: str) -> dict[str, Any]:
    """An arm's held-out summary row after RL (policy rl) of decoding `mode`, from its results.json."""
    row = one(res["summary"], policy="rl", decoding=mode)
    if row is None:
        raise ValueError(f"an arm's results.json has no summary row of rl, {mode}")
    return dict(row)


def aggregate(results: dict[int, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """{seed: {arm: results.json}} -> per arm and decoding the mean +- sd over seeds of METRICS
    (each seed's long rows, memrl.recipes.seeds.view_rows, grouped by memrl.recipes.seeds.cells), and per decoding
    the goal: accuracy difference (dcpo - withheld, mean over seeds) within one standard error
    (memrl.eval.stats.diff_se of the runs' standard errors over tasks: that
    of the seed-mean difference) and mean working context >= 30% shorter (1 - dcpo / withheld, seed means).
    Only seeds with both arms count; every run must have evaluated the same tasks."""
    from memrl.eval.stats import EMPTY, diff_se
    from memrl.recipes.seeds import cells as group_cells
    from memrl.recipes.seeds import view_rows

    seeds = sorted(s for s, arms in results.items() if all(a in arms for a in ARMS))
    shas = {tuple(r["heldout_sha256"]) for s in seeds for r in results[s].values()}
    if len(shas) > 1:
        raise ValueError(f"the runs evaluated different task sets ({len(shas)} held-out files): not comparable")
    cells = group_cells([row for s in seeds for row in view_rows(
        {arm: {mode: {"all": arm_eval(results[s][arm], mode)} for mode in ("greedy", "sampled")} for arm in ARMS},
        METRICS, seed=s)])
    table: dict[str, Any] = {}
    goal: dict[str, Any] = {}
    for mode in ("greedy", "sampled"):
        for arm in ARMS:
            table[f"{arm}/{mode}"] = {m: cells.get(mode, {}).get("all", {}).get(f"{arm}_{m}", EMPTY) for m in METRICS}
        if not seeds:
            continue
        d, w = table[f"dcpo/{mode}"], table[f"withheld/{mode}"]
        diff = d["accuracy"]["mean"] - w["accuracy"]["mean"]
        se = diff_se(*([arm_eval(results[s][arm], mode)["accuracy_se"] for s in seeds] for arm in ("dcpo", "withheld")))
        ctx_w = w["mean_context_tokens"]["mean"]
        reduction = 1.0 - d["mean_context_tokens"]["mean"] / ctx_w if ctx_w else 0.0
        equal = abs(diff) <= se
        goal[mode] = {"accuracy_diff": diff, "accuracy_diff_se": se, "equal_accuracy": equal,
                      "context_reduction": reduction, "shorter_30": reduction >= GOAL_REDUCTION,
                      "met": equal and reduction >= GOAL_REDUCTION}
    per_seed = [{"seed": s, "arm": arm, "mode": mode, "sft_steps": results[s][arm]["facts"].get("sft", {}).get("steps"),
                 **{m: arm_eval(results[s][arm], mode).get(m) for m in (*METRICS, "subq_accuracy", "turns")}}
                for s in seeds for arm in ARMS for mode in ("greedy", "sampled")]
    return {"seeds": seeds, "table": table, "goal": goal, "per_seed": per_seed}


def _num(v: Any, digits: int) -> str:
    return "–" if v is None else f"{v:.{digits}f}"


def markdown(agg: dict[str, Any], command: str = "") -> str:
    from memrl.recipes.tables import table_rows

    cells = {mode: {"all": {f"{arm}_{m}": agg["table"][f"{arm}/{mode}"][m] for arm in ARMS for m in METRICS}}
             for mode in ("greedy", "sampled")}
    lines = [f"MemAct context curation, {len(agg['seeds'])} training seeds ({', '.join(map(str, agg['seeds']))}); "
             "mean ± sd over seeds", ""]
    if command:
        lines += [f"`{command}`", ""]
    lines += ["| training | decoding | accuracy (%) | s.e. over tasks | mean context (tokens) | peak context (tokens) "
              "| prunes / task | overflow (%) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    lines += table_rows({"cells": cells}, tuple((ARM_NAMES[a], a) for a in ARMS), METRICS, by_decoding=True,
                        digits=lambda m: 2 if m == "prunes_per_task" else 1)
    lines.append("")
    for mode, g in agg["goal"].items():
        lines.append(f"- {mode}: accuracy DCPO - withheld {g['accuracy_diff']:+.1f} points (one s.e. "
                     f"{g['accuracy_diff_se']:.1f}: {'equal' if g['equal_accuracy'] else 'not equal'}), mean "
                     f"context {100 * g['context_reduction']:.1f}% shorter (goal 30%): goal "
                     f"{'met' if g['met'] else 'missed'}")
    lines += ["", "Per seed (sub-question accuracy: the share of the answers right; SFT steps: the arm's cold start):",
              "", "| seed | arm | decoding | accuracy (%) ± s.e. | sub-question acc. (%) | mean context | peak context "
              "| prunes / task | overflow (%) | turns | SFT steps |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in agg.get("per_seed", []):
        acc = "–" if r["accuracy"] is None else cell(recorded(r["accuracy"], r["accuracy_se"]))
        lines.append(f"| {r['seed']} | {r['arm']} | {r['mode']} | {acc} | "
                     f"{_num(r['subq_accuracy'], 1)} | {_num(r['mean_context_tokens'], 1)} | "
                     f"{_num(r['peak_context_tokens'], 1)} | {_num(r['prunes_per_task'], 2)} | {_num(r['overflow'], 1)} | "
                     f"{_num(r['turns'], 1)} | {'–' if r['sft_steps'] is None else r['sft_steps']} |")
    return "\n".join(lines) + "\n"


def load_results(root: Path, seeds: list[int]) -> dict[int, dict[str, dict[str, Any]]]:
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for s in seeds:
        for arm in ARMS:
            p = root / f"seed{s}" / arm / "results.json"
            if p.is_file():
                out.setdefault(s, {})[arm] = json.loads(p.read_text(encoding="utf-8"))
    return out


def main(argv: list[str] | None = None) -> int:
    from memrl.recipes.seeds import parse_seeds

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="root directory (runs/ is git-ignored)")
    ap.add_argument("--seeds", default="0,1,2", help="training seeds, e.g. 0,1,2")
    ap.add_argument("--dev", action="store_true", help=f"also evaluate on the dev task seed {DEV_EVAL_SEED}, and "
                    "print that")
    ap.add_argument("--arms", default=",".join(ARMS), help="the arms to run, in this order (default: "
                    f"{','.join(ARMS)}); the table needs both")
    ap.add_argument("--set", action="append", default=[], metavar="ARM:KEY=VALUE",
                    help="an override for one arm, applied after its own (e.g. withheld:sft.epochs=8); repeatable")
    ap.add_argument("--aggregate-only", action="store_true", help="only write the table of the finished arms")
    ap.add_argument("overrides", nargs="*", help="demo overrides for both arms (key=value, train.<key>=value)")
    args = ap.parse_args(argv)
    root = Path(args.out)
    seeds = parse_seeds(args.seeds)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or any(a not in ARMS for a in arms):
        raise SystemExit(f"--arms {args.arms!r}: a comma-separated list of {', '.join(ARMS)}")
    only: dict[str, tuple[str, ...]] = {a: () for a in ARMS}
    for item in args.set:
        arm, _, ov = item.partition(":")
        if arm not in ARMS or "=" not in ov:
            raise SystemExit(f"--set {item!r}: ARM:KEY=VALUE with ARM one of {', '.join(ARMS)}")
        only[arm] += (ov,)
    if args.aggregate_only and not root.is_dir():
        raise SystemExit(f"--out {root}: no such directory (--aggregate-only reads the runs there)")
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if not args.aggregate_only:
        for s in seeds:
            for arm in arms:
                if (root / f"seed{s}" / arm / "results.json").is_file():
                    continue
                print(f"== seed {s}, arm {arm}", flush=True)
                run_arm(root / f"seed{s}", arm, arm_overrides(arm, s, args.overrides, only[arm]), args.dev)
    agg = aggregate(load_results(root, seeds))
    command = "benchmarks/memact_curation.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = markdown(agg, command)
    (root / "curation_results.md").write_text(text, encoding="utf-8")
    (root / "curation_results.json").write_text(json.dumps({**agg, "command": command,
                                                            "wall_s": time.perf_counter() - t0}, indent=1),
                                                encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
