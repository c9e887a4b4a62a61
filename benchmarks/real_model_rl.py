"""RL on a real model on the CPU: SmolLM2-135M-Instruct, MemAgent on real HotpotQA, before and after RL.

  .venv/bin/python benchmarks/real_model_rl.py --model DIR [--seeds 0,1,2] [--steps 24] [--out runs/rl58] \
      [--stages data,sft,rl,eval,table] [--rl KEY=VALUE ...]

Stages (each resumes: a finished stage's outputs are kept, `memrl train --resume` continues a stopped run,
`memrl eval` resumes its results.jsonl):
  data   held-out set: 48 HotpotQA dev questions (seed 0) at 2 documents (the training length, 1x) and at 8
         (4x); training set: 480 other dev questions (seed 1) at 2 documents, minus any held-out question;
         fresh set: 96 dev questions in neither (the first 96 of a seed-3 draw of 400, at 2 and 8 documents),
         checked against the ids committed in docs/results/hotpot_fresh.json.
  sft    the cold start (a recipe choice: zero-shot, the model boxes no answer, so GRPO sees reward 0 on every
         trajectory): `memrl train-sft demonstrator.name=evidence` on the first 400 training questions
         (--cold-start-questions N; --sft KEY=VALUE adds overrides).
  rl     `memrl train --preset smollm2_memagent_cpu` (--preset NAME for another) from the cold-start model
         (--init DIR for another), one run per training seed (with the default preset also
         trainer.prefix_sharing=never: the setting docs/results/real_model.md's first table was recorded with);
         `--rl KEY=VALUE` adds overrides to it (after the script's own, so they win).
  eval   every model on the held-out set at 1x and 4x, greedy and sampled (temperature 1, one sample,
         eval seed 0), with the workflow settings of training (`--sets heldout,fresh`: on the fresh set too).
  table  accuracy (%) by the published verifier (MemAgent's training verifier, verl_hotpotqa), memrl's boxed
         exact match and a lenient reader (a gold answer anywhere in the final reply), the no-box rate and
         the memory length, mean and standard error over the 48 questions (RL rows: mean over seeds, the
         standard error over seeds), the published score's paired difference from the cold start (per
         question, same questions), and the training curve (reward per step, each seed).
The evaluation above was fixed before any run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

from memrl.eval.stats import cell, stat

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW = ["workflow.chunk_tokens=512", "workflow.max_memory_tokens=96", "workflow.max_final_tokens=32"]
ENGINE = ["engine.hf.compute_dtype=auto", "engine.hf.kv_cache=slots", "engine.max_batch_size=48",
          "concurrency=48"]
DECODING = {"greedy": [], "sampled": ["workflow.temperature=1.0", "seed=0"]}
SFT = ["model.compute_dtype=auto", "model.lora.rank=16", "model.lora.alpha=32", "model.lora.save_merged=true",
       "sft.lr=3e-4", "sft.batch_rows=16", "sft.warmup_steps=5", "sft.logits_chunk_tokens=1024",
       "sft.token_budget=4096"]
MEMRL = [sys.executable, "-m", "memrl.cli"]
DEFAULT_PRESET = "smollm2_memagent_cpu"


def sh(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")


def data(args: argparse.Namespace, out: Path) -> None:
    if not (out / "eval" / "manifest.json").is_file():
        sh([*MEMRL, "data", "build", "--kind", "hotpotqa", "--source", args.hotpot, "--docs", "2,8",
            "--num-questions", "48", "--seed", "0", "--out", str(out / "eval")])
    if not (out / "pool" / "manifest.json").is_file():
        sh([*MEMRL, "data", "build", "--kind", "hotpotqa", "--source", args.hotpot, "--docs", "2",
            "--num-questions", "480", "--seed", "1", "--out", str(out / "pool")])
    held = {r["id"] for r in json.loads((out / "eval" / "eval_2.json").read_text())}
    train = [r for r in json.loads((out / "pool" / "eval_2.json").read_text()) if r["id"] not in held]
    (out / "train_2.json").write_text(json.dumps(train))
    n = args.cold_start_questions
    (out / "sft_2.json").write_text(json.dumps(train[:n]))
    print(f"held out {len(held)} questions; {len(train)} training questions, the first {n} for the cold start")
    fresh(args, out, held | {r["id"] for r in json.loads((out / "pool" / "eval_2.json").read_text())})


FRESH_RECORD = ROOT / "docs" / "results" / "hotpot_fresh.json"
"""The fresh set's ids (in order), their digest and the build (`fresh`), committed."""
FRESH_QUESTIONS = 96


def ids_sha256(ids: list[str]) -> str:
    """The SHA-256 of question ids, one per line, in order (the fresh set's digest)."""
    return hashlib.sha256("".join(f"{i}\n" for i in ids).encode()).hexdigest()


def fresh(args: argparse.Namespace, out: Path, used: set[str]) -> None:
    """out/fresh/eval_{2,8}.json: the first FRESH_QUESTIONS of a seed-3 draw of 400 dev questions (at 2 and 8
    documents) that are neither held out nor in the training pool (`used`); refuses a set whose ids differ from
    FRESH_RECORD's."""
    if not (out / "fresh_pool" / "manifest.json").is_file():
        sh([*MEMRL, "data", "build", "--kind", "hotpotqa", "--source", args.hotpot, "--docs", "2,8",
            "--num-questions", "400", "--seed", "3", "--out", str(out / "fresh_pool")])
    pool = {n: json.loads((out / "fresh_pool" / f"eval_{n}.json").read_text()) for n in (2, 8)}
    ids = [r["id"] for r in pool[2] if r["id"] not in used][:FRESH_QUESTIONS]
    record = json.loads(FRESH_RECORD.read_text())
    if ids != record["ids"]:
        raise SystemExit(f"{FRESH_RECORD}: the fresh set built from {args.hotpot} has other ids (sha256 "
                         f"{ids_sha256(ids)[:16]}..., recorded {record['sha256'][:16]}...); another HotpotQA file?")
    (out / "fresh").mkdir(parents=True, exist_ok=True)
    keep = set(ids)
    for n, rows in pool.items():
        (out / "fresh" / f"eval_{n}.json").write_text(json.dumps([r for r in rows if r["id"] in keep]))
    print(f"fresh set: {len(ids)} questions (sha256 {record['sha256'][:16]}...)")


def sft(args: argparse.Namespace, out: Path) -> None:
    if not (out / "sft" / "merged" / "config.json").is_file():
        sh([*MEMRL, "train-sft", f"model.path={args.model}", "data.name=file", f"data.path={out / 'sft_2.json'}",
            "demonstrator.name=evidence", f"demonstrator.source={args.hotpot}", *WORKFLOW, *SFT,
            f"out_dir={out / 'sft'}", *args.sft])
        (out / "sft" / "recipe.json").write_text(json.dumps(cold_start_recipe(args)))


def cold_start_recipe(args: argparse.Namespace) -> dict:
    return {"questions": args.cold_start_questions, "sft": args.sft}


def check_cold_start(args: argparse.Namespace, out: Path) -> None:
    """A trained cold start is kept (the stages resume), so refuse --cold-start-questions / --sft values that
    describe another one instead of ignoring them."""
    if not (out / "sft" / "merged" / "config.json").is_file():
        return
    f = out / "sft" / "recipe.json"
    had = json.loads(f.read_text()) if f.is_file() else {"questions": 400, "sft": []}  # trained before the switches
    if had != cold_start_recipe(args):
        raise SystemExit(f"{out / 'sft'}: the cold start there was trained with {had}, this run asks for "
                         f"{cold_start_recipe(args)}; pass those values or another --out")


def rl(args: argparse.Namespace, out: Path) -> None:
    for seed in args.seeds:
        run = out / "rl" / f"seed{seed}"
        start = Path(args.init.replace("{seed}", str(seed))) if args.init else out / "sft" / "merged"
        if args.init and not (start / "config.json").is_file():
            raise SystemExit(f"--init: no model at {start} (a directory with config.json) for seed {seed}")
        # the default before 2026-11-28, which docs/results/real_model.md's first table was recorded with
        recorded = ["trainer.prefix_sharing=never"] if args.preset == DEFAULT_PRESET else []
        cmd = [*MEMRL, "train", "--preset", args.preset, f"model.path={start}",
               f"data.path={out / 'train_2.json'}", f"trainer.seed={seed}", f"data.seed={seed}", f"engine.seed={seed}", f"trainer.steps={args.steps}",
               f"out_dir={run}", *recorded,
               *(o.replace("{seed}", str(seed)) for o in args.rl)]
        if final_model(run, args.steps) is None:
            sh(cmd + (["--resume"] if (run / "checkpoints" / "latest").exists() else []))


def final_model(run: Path, steps: int) -> Path | None:
    merged = run / "checkpoints" / f"step_{steps:06d}" / "merged"
    return merged if (merged / "config.json").is_file() else None


def models(args: argparse.Namespace, out: Path) -> dict[str, Path]:
    found = {"base": Path(args.model), "cold start": out / "sft" / "merged"}
    for seed in args.seeds:
        m = final_model(out / "rl" / f"seed{seed}", args.steps)
        if m is not None:
            found[f"rl seed {seed}"] = m
    return found


SETS = {"heldout": ("eval", ""), "fresh": ("fresh", "fresh_")}
"""A question set: (its folder under --out, the prefix of its evaluation folders' decoding name)."""


def evaluate(args: argparse.Namespace, out: Path) -> None:
    for folder, prefix in (SETS[s] for s in args.sets):
        files = [str(out / folder / f"eval_{n}.json") for n in (2, 8)]
        for name, model in models(args, out).items():
            if name == "base" and not args.base:
                continue
            for dec, extra in DECODING.items():
                sh([*MEMRL, "eval", "--model", str(model), "--out",
                    str(out / "eval_runs" / slug(name) / (prefix + dec)), "--no-progress", *files,
                    "workflow=memagent", *WORKFLOW, *ENGINE, *extra])


def slug(name: str) -> str:
    return name.replace(" ", "_")


def score(run: Path) -> dict[int, dict[str, list[float]]]:
    from memrl.rewards.qa import extract_boxed, normalize_answer
    from memrl.rewards.verifiers import get_verifier

    published = get_verifier("verl_hotpotqa")
    by_n: dict[int, dict[str, list[float]]] = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        t = r.get("answer_text") or ""
        cell = by_n.setdefault(int(r["num_docs"]), {k: [] for k in ("published", "boxed EM", "lenient", "no box",
                                                                     "memory tokens")})
        cell["published"].append(100 * published(t, r["answers"]))
        cell["boxed EM"].append(100 * r["em"])
        cell["lenient"].append(100 * float(any(normalize_answer(g) and normalize_answer(g) in normalize_answer(t)
                                               for g in r["answers"])))
        cell["no box"].append(100 * float(extract_boxed(t) is None))
        cell["memory tokens"].append(r.get("metrics", {}).get("memory_tokens_mean", float("nan")))
    return by_n


def mean_se(xs: list[float]) -> str:
    """The table's cell of `xs` without its nans (a metric a row lacks): memrl.eval.stats' mean ± SE."""
    return cell(stat(x for x in xs if x == x))


def paired(run: Path, base: Path, n_docs: int) -> list[float]:
    """Per question, the published verifier's score of `run` minus that of `base` (same questions, same order
    of task ids), in points."""
    def by_task(p: Path) -> dict[str, float]:
        from memrl.rewards.verifiers import get_verifier

        published = get_verifier("verl_hotpotqa")
        rows = [json.loads(ln) for ln in (p / "results.jsonl").read_text().splitlines() if ln.strip()]
        return {r["task_id"]: 100 * published(r.get("answer_text") or "", r["answers"]) for r in rows
                if int(r["num_docs"]) == n_docs}
    a, b = by_task(run), by_task(base)
    return [a[t] - b[t] for t in sorted(a) if t in b]


def table(args: argparse.Namespace, out: Path) -> None:
    for name in args.sets:
        if name != "heldout":
            print(f"\n{name} set ({FRESH_RECORD.name}'s {FRESH_QUESTIONS} questions):")
        set_table(args, out, SETS[name][1])
    curve(args, out)


def set_table(args: argparse.Namespace, out: Path, prefix: str) -> None:
    """The table of one question set (its evaluation folders' `prefix`)."""
    cols = ("published", "boxed EM", "lenient", "no box", "memory tokens")
    print("| model | decoding | docs | questions | " + " | ".join(cols) + " | published - cold start (paired) |")
    print("|---|---|---:|---:|" + "---:|" * (len(cols) + 1))
    names = list(models(args, out))
    rl_names = [n for n in names if n.startswith("rl seed")]
    runs_dir = out / "eval_runs"
    for dec in DECODING:
        base = runs_dir / "cold_start" / (prefix + dec)
        for n_docs in (2, 8):
            for name in names + (["rl (seeds)"] if len(rl_names) > 1 else []):
                runs = rl_names if name == "rl (seeds)" else [name]
                found = [runs_dir / slug(r) / (prefix + dec) for r in runs]
                found = [p for p in found if (p / "results.jsonl").is_file() and n_docs in score(p)]
                if not found:
                    continue
                scored = [score(p)[n_docs] for p in found]
                q = len(scored[0]["published"])
                has_base = (base / "results.jsonl").is_file() and name != "cold start"
                if len(runs) == 1:
                    cells = [mean_se(scored[0][c]) for c in cols]
                    delta = mean_se(paired(found[0], base, n_docs)) if has_base else "-"
                else:  # mean over seeds, standard error over the seeds' means
                    cells = [mean_se([statistics.mean(s[c]) for s in scored]) for c in cols]
                    delta = mean_se([statistics.mean(paired(p, base, n_docs)) for p in found]) if has_base else "-"
                    name = f"rl ({len(scored)} seeds)"
                print(f"| {name} | {dec} | {n_docs} | {q} | " + " | ".join(cells) + f" | {delta} |")


def curve(args: argparse.Namespace, out: Path) -> None:
    rows = {}
    for seed in args.seeds:
        f = out / "rl" / f"seed{seed}" / "metrics.jsonl"
        if f.is_file():
            steps = [json.loads(ln) for ln in f.read_text().splitlines() if ln.strip()]
            rows[seed] = {s["step"]: s for s in steps}
    if not rows:
        return
    print("\ntraining reward (the run's workflow.reward, mean over the step's trajectories) and no-box share per step")
    print("| step | " + " | ".join(f"seed {s} reward | seed {s} no box" for s in rows) + " | s / step |")
    print("|---:|" + "---:|---:|" * len(rows) + "---:|")
    for step in sorted({k for r in rows.values() for k in r}):
        cells = []
        for r in rows.values():
            m = r.get(step)
            segs = m.get("rollout/groups_kept", 0) * 8 if m else 0
            cells += [f"{m['reward/mean']:.2f}" if m else "-",
                      f"{m.get('format/no_box', float('nan')) / max(segs, 1):.2f}" if m else "-"]
        secs = [r[step]["time/step_s"] for r in rows.values() if step in r]
        print(f"| {step} | " + " | ".join(cells) + f" | {statistics.mean(secs):.0f} |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for seed, r in rows.items():
        ax.plot(sorted(r), [r[k]["reward/mean"] for k in sorted(r)], marker="o", label=f"seed {seed}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (workflow.reward)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    print(f"\ncurve: {out / 'curve.png'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="SmolLM2 directory (memrl model fetch smollm2-135m-instruct)")
    ap.add_argument("--hotpot", default=None,
                    help="HotpotQA dev distractor file (default: `memrl data fetch hotpotqa_dev_distractor`'s)")
    ap.add_argument("--seeds", default="0,1,2", type=lambda s: [int(x) for x in s.split(",")])
    ap.add_argument("--steps", type=int, default=None,
                    help="RL steps a seed (default: the preset's trainer.steps, 24 for smollm2_memagent_cpu)")
    ap.add_argument("--preset", default=DEFAULT_PRESET,
                    help="the RL stage's preset (e.g. smollm2_memagent_box_cpu, then smollm2_memagent_answer_cpu)")
    ap.add_argument("--out", default="runs/rl58")
    ap.add_argument("--stages", default="data,sft,rl,eval,table")
    ap.add_argument("--sets", default=["heldout"], type=lambda s: s.split(","),
                    help="question sets the eval and table stages score: heldout (the 48), fresh (the 96 of "
                         "docs/results/hotpot_fresh.json), or heldout,fresh")
    ap.add_argument("--rl", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides for the RL stage's memrl train (after the script's own; {seed} in a value is "
                         "replaced by the training seed)")
    ap.add_argument("--cold-start-questions", type=int, default=400,
                    help="training questions the cold start's SFT reads (the first N; 400 in the first four recipes)")
    ap.add_argument("--sft", nargs="*", default=[], metavar="KEY=VALUE",
                    help="overrides for the cold start's memrl train-sft (after the script's own)")
    ap.add_argument("--init", default=None, metavar="DIR",
                    help="start RL from this model instead of the cold start, {seed} replaced by the training seed "
                         "(a second RL stage from an earlier run's final model); the paired column stays against "
                         "the cold start")
    ap.add_argument("--base", action="store_true", help="also evaluate the base model (slow: it never stops early)")
    args = ap.parse_args()
    if args.hotpot is None:
        from memrl.data.fetch import fetched_path  # noqa: PLC0415 - only for the default
        from memrl.errors import UserError  # noqa: PLC0415

        try:
            args.hotpot = str(fetched_path("hotpotqa_dev_distractor"))
        except UserError as e:
            raise SystemExit(f"--hotpot: {e} (or pass --hotpot FILE)") from None
    if args.steps is None:  # the preset's own count, so that a stage preset's steps are not overridden
        from memrl.config import ConfigError, load_config
        from memrl.training.config import TrainConfig
        try:
            args.steps = load_config(TrainConfig, [], preset=args.preset).trainer.steps
        except ConfigError as e:
            raise SystemExit(f"--preset: {e}") from None
    if bad := [s for s in args.sets if s not in SETS]:
        raise SystemExit(f"--sets: unknown set {bad[0]!r}; heldout, fresh or both")
    out = Path(args.out)
    stages = {"data": data, "sft": sft, "rl": rl, "eval": evaluate, "table": table}
    if {"data", "sft"} & set(args.stages.split(",")):
        check_cold_start(args, out)
    for name in args.stages.split(","):
        stages[name](args, out)


if __name__ == "__main__":
    main()
