"""A real model learns a memory skill: SmolLM2-135M-Instruct with MemAgent carries RULER needles through
documents many times its training length (docs/results/real_model.md, "Needles").

  .venv/bin/python benchmarks/needle_recipe.py --size quick [--out runs/needle_quick]     # 1 seed, held-out 4K only (about 31 min by its stages' times)
  .venv/bin/python benchmarks/needle_recipe.py --size full --hotpot hotpot_dev_distractor_v1.json   # the page
  make needle        # the quick size, everything from the model fetch on (make needle-full: the full size)

Stages (`--stages`, default all; each resumes after a kill: a finished stage's outputs are kept, `memrl train
--resume` continues a stopped run, `memrl eval` resumes its results.jsonl):
  model   `memrl model fetch smollm2-135m-instruct` into <out>/model (skipped with --model DIR).
  data    a real-text haystack (--haystack FILE, else the paragraphs of --hotpot, a HotpotQA file in its original
          layout, one after another), then RULER's niah_single_1 (noise haystack), niah_single_2 (the real-text
          haystack), niah_multikey_2 (needles as haystack) and vt, built locally in the model's tokenizer
          (`memrl data build --kind ruler`): training rows at the training lengths with seed 1, held-out rows
          at the evaluation lengths with seed 0 (the quick size: seed 3, so it never scores the full size's). The held-out files' sha256 digest is written to
          <out>/heldout.json and, when --heldout-record names a file (the page's committed record), must equal it.
          Development rows (seed 2) for choosing settings: `--split dev` evaluates and tables those instead.
  sft     the SFT-only model: `memrl train-sft demonstrator.name=needle` (memory = the sentences holding a gold
          value, final reply = the boxed gold values) on the first training rows; the strongest SFT-only
          baseline this recipe has, and RL's starting point.
  rl      `memrl train --preset smollm2_needle_cpu` from the SFT model, one run per training seed.
  eval    on the held-out rows, by length: zero-shot MemAgent and full context (the document truncated in the
          middle to the model's window) on the base model, the SFT model and each RL seed, greedy and sampled
          (temperature 1, one sample, eval seed 0).
  table   RULER's string match (each gold value anywhere in the reply, format-free; the main metric), the
          share of gold values inside the last \\boxed{} (boxed), MemAgent's published verifier and the memory
          length, mean +- SE over questions (RL: mean over seeds +- SE over seeds), the paired gain of RL over
          the SFT model per question, and the training curve; written to <out>/results.md (results_dev.md) and
          printed.
The evaluation, sizes and bar were fixed before the first run (docs/results/real_model.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from real_model_rl import mean_se  # one mean ± SE cell for the real-model pages (benchmarks/ on sys.path)

ROOT = Path(__file__).resolve().parents[1]
MEMRL = [sys.executable, "-m", "memrl.cli"]
TASKS = ("niah_single_1", "niah_single_2", "niah_multikey_2", "vt")
PRESET = "smollm2_needle_cpu"
DECODING = {"greedy": [], "sampled": ["workflow.temperature=1.0", "seed=0"]}
ENGINE = ["engine.hf.compute_dtype=auto", "engine.hf.kv_cache=slots", "engine.max_batch_size=32", "concurrency=32"]


@dataclass(frozen=True)
class Size:
    """One size of the recipe: what it builds, trains and evaluates."""

    train_lengths: str
    eval_lengths: str
    train_rows: int
    """Training rows per task and training length (seed 1)."""
    eval_rows: dict[int, int]
    """Held-out rows per task, by evaluation length (seed 0)."""
    dev_rows: dict[int, int]
    """Development rows per task, by length (seed 2): where recipe settings are chosen (--split dev)."""
    sft_rows: int
    """Training rows the SFT model reads (the first ones, every task and length mixed)."""
    seeds: str
    eval_seed: int = 0
    """The held-out rows' build seed (the quick size reads its own, so it never scores the full size's rows)."""
    rl: list[str] = field(default_factory=list)
    """Overrides of the RL stage beyond the preset."""
    sft: list[str] = field(default_factory=list)
    workflow: list[str] = field(default_factory=list)
    """Workflow overrides for SFT, RL and eval (the preset's own for the real sizes)."""
    decodings: tuple[str, ...] = ("greedy", "sampled")


SIZES = {
    "full": Size("2k,4k", "4k,16k,64k,128k", 64, {4096: 16, 16384: 16, 65536: 8, 131072: 8}, {4096: 4, 16384: 4},
                 256, "0,1,2"),
    # the pipeline at its smallest real size (not a result): 8 SFT tasks, 2 RL steps of 2 tasks x 4 samples,
    # held-out 4K only (the evaluation is most of the time: docs/log/2026-11-29-needle-quick-size.md), one
    # question per task
    "quick": Size("2k,4k", "4k", 16, {4096: 1}, {4096: 1}, 8, "0", eval_seed=3,
                  rl=["trainer.steps=2", "trainer.batch_size=2", "algorithm.n=4", "trainer.save_every=2"],
                  sft=["sft.epochs=1", "sft.warmup_steps=1"], decodings=("greedy",)),
    # CI: a tiny model, tiny lengths; every stage runs once (tests/integration/test_needle_recipe.py)
    "smoke": Size("1024", "1536,2048", 2, {1536: 1, 2048: 1}, {1536: 1}, 8, "0",
                  rl=["trainer.steps=1", "trainer.batch_size=1", "algorithm.n=2", "trainer.token_budget=1024",
                      "model.lora.rank=0", "model.compute_dtype=float32"],
                  sft=["sft.epochs=1", "model.lora.rank=0", "model.compute_dtype=float32"],
                  workflow=["workflow.chunk_tokens=256", "workflow.max_memory_tokens=16", "workflow.max_final_tokens=8"],
                  decodings=("greedy",)),
}
SFT = ["model.compute_dtype=auto", "model.lora.rank=16", "model.lora.alpha=32", "model.lora.save_merged=true",
       "sft.lr=3e-4", "sft.batch_rows=16", "sft.warmup_steps=5", "sft.logits_chunk_tokens=1024", "sft.token_budget=4096"]


def sh(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}): {' '.join(cmd)}")


def workflow(size: Size, stage: str = "train") -> list[str]:
    """The workflow settings of SFT, RL and eval: the preset's (so all three read the same prompts and sizes),
    except that evaluation reads the whole document: the preset's max_chunks (8, MemAgent's training cap) is a
    training setting, and an evaluation at 16K-128K capped at 8 chunks would read only their head and tail."""
    from memrl.config import load_config
    from memrl.training.config import TrainConfig

    wf = load_config(TrainConfig, [], preset=PRESET).workflow
    keys = ("chunk_tokens", "max_memory_tokens", "max_final_tokens") + (("max_chunks",) if stage == "train" else ())
    uncapped = ["workflow.max_chunks=0"] if stage == "eval" else []
    return ["workflow=memagent", *(f"workflow.{k}={wf[k]}" for k in keys if k in wf), *uncapped, *size.workflow]


# ---------------------------------------------------------------------------------------------- stages


def model_dir(args: argparse.Namespace, out: Path) -> Path:
    return Path(args.model) if args.model else out / "model"


def model(args: argparse.Namespace, out: Path) -> None:
    if args.model is None and not (out / "model" / "config.json").is_file():
        sh([*MEMRL, "model", "fetch", "smollm2-135m-instruct", "--out", str(out / "model")])


HAYSTACK_QUESTIONS = 300
"""HotpotQA questions whose paragraphs make the real-text haystack (about 130K SmolLM2 tokens or more)."""


def haystack(args: argparse.Namespace, out: Path) -> tuple[Path, list[str]]:
    """The real-text haystack and the HotpotQA ids it came from: --haystack as given (no ids), else the
    paragraphs of HAYSTACK_QUESTIONS questions of --hotpot, each title once, in the order of their ids: the
    recorded ids when --heldout-record names some (so any HotpotQA dev file holding them, the full one or a
    subset, rebuilds the same text), else the first ids in sorted order."""
    if args.haystack:
        return Path(args.haystack), []
    path, ids_file = out / "haystack.txt", out / "haystack_ids.json"
    if path.is_file() and ids_file.is_file():
        return path, json.loads(ids_file.read_text())
    if not args.hotpot:
        raise SystemExit("data: give --haystack FILE (a text file) or --hotpot FILE (a HotpotQA file in its original "
                         "layout, e.g. from `memrl data fetch hotpotqa_dev`) for the real-text haystack")
    src = Path(args.hotpot)
    raw = lzma.decompress(src.read_bytes()) if src.suffix == ".xz" else src.read_bytes()
    by_id = {q["_id"]: q for q in json.loads(raw)}
    recorded = json.loads(Path(args.heldout_record).read_text()).get("haystack_ids") if args.heldout_record else None
    ids = recorded or sorted(by_id)[:HAYSTACK_QUESTIONS]
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise SystemExit(f"data: --hotpot {src} lacks {len(missing)} of the haystack's recorded HotpotQA ids (first: "
                         f"{missing[0]}); use the HotpotQA dev distractor file")
    seen, paragraphs = set(), []
    for i in ids:
        for title, sentences in by_id[i]["context"]:
            if title not in seen:
                seen.add(title)
                paragraphs.append("".join(sentences).strip())
    path.write_text("\n\n".join(p for p in paragraphs if p) + "\n", encoding="utf-8")
    ids_file.write_text(json.dumps(ids) + "\n")
    print(f"haystack: {len(paragraphs)} paragraphs of {len(ids)} HotpotQA questions, {path.stat().st_size:,} bytes -> {path}")
    return path, ids


def ruler_files(d: Path) -> list[Path]:
    return sorted(d.glob("*/data/*/validation.jsonl"), key=lambda p: (int(p.parts[-4]), p.parts[-2]))


def digest(files: list[Path], root: Path) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0" + hashlib.sha256(f.read_bytes()).hexdigest().encode())
    return h.hexdigest()


def data(args: argparse.Namespace, out: Path) -> None:
    size, tok = SIZES[args.size], str(model_dir(args, out))
    hay, hay_ids = haystack(args, out)
    common = ["--kind", "ruler", "--tasks", ",".join(TASKS), "--tokenizer", tok, "--haystack", str(hay)]
    if not (out / "train_ruler" / "manifest.json").is_file():  # written last: a killed build is redone
        sh([*MEMRL, "data", "build", *common, "--lengths", size.train_lengths, "--samples", str(size.train_rows),
            "--seed", "1", "--out", str(out / "train_ruler")])
    held = out / "heldout"
    for split, rows_by_n, seed in (("heldout", size.eval_rows, str(size.eval_seed)), ("dev", size.dev_rows, "2")):
        for n, rows in rows_by_n.items():
            if not (out / split / str(n) / "manifest.json").is_file():
                sh([*MEMRL, "data", "build", *common, "--lengths", str(n), "--samples", str(rows), "--seed", seed,
                    "--out", str(out / split / str(n))])
    files = [f for n in size.eval_rows for f in ruler_files(held / str(n))]
    record = {"size": args.size, "tasks": list(TASKS), "seed": size.eval_seed, "rows": {str(n): r for n, r in size.eval_rows.items()},
              "ids": [f"{f.parts[-2]}@{f.parts[-4]}#{i}" for f in files for i in range(len(f.read_text().splitlines()))],
              "files": {f.relative_to(held).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest() for f in files},
              "sha256": digest(files, held), "haystack_sha256": hashlib.sha256(hay.read_bytes()).hexdigest(),
              "haystack_ids": hay_ids}
    (out / "heldout.json").write_text(json.dumps(record, indent=1) + "\n")
    if args.heldout_record:
        want = json.loads(Path(args.heldout_record).read_text())
        if want["sha256"] != record["sha256"]:
            bad = sorted(k for k in set(want["files"]) | set(record["files"])
                         if want["files"].get(k) != record["files"].get(k))
            raise SystemExit(f"data: the held-out set built here ({record['sha256'][:12]}) is not the recorded one "
                             f"{args.heldout_record} ({want['sha256'][:12]}); first differing file: {bad[0]} (same "
                             "tokenizer, haystack and builder?)")
    from memrl.data.io import load_tasks
    from memrl.data.tasks_jsonl import write_tasks

    train = [t for f in ruler_files(out / "train_ruler") for t in load_tasks(str(f))]
    for t in train:  # one file of every task and length: ids made unique, the task kept in meta
        t.task_id = f"{t.meta['dataset']}@{t.meta['seq_length']}#{t.task_id}"
    order = sorted(range(len(train)), key=lambda i: hashlib.sha256(train[i].task_id.encode()).hexdigest())
    train = [train[i] for i in order]  # a fixed mix of tasks and lengths, so the first N cover every one
    write_tasks(out / "train.jsonl", train)
    write_tasks(out / "sft.jsonl", train[: size.sft_rows])
    print(f"held out {len(record['ids'])} rows (sha256 {record['sha256'][:12]}); {len(train)} training rows, the first "
          f"{min(size.sft_rows, len(train))} for the SFT model")


def sft(args: argparse.Namespace, out: Path) -> None:
    size = SIZES[args.size]
    if not (out / "sft" / "merged" / "config.json").is_file() and not (out / "sft" / "model.safetensors").is_file():
        sh([*MEMRL, "train-sft", f"model.path={model_dir(args, out)}", "data.name=file", f"data.path={out / 'sft.jsonl'}",
            "demonstrator.name=needle", *workflow(size), *SFT, *size.sft, f"out_dir={out / 'sft'}", *args.sft])


def sft_model(out: Path) -> Path:
    merged = out / "sft" / "merged"
    return merged if (merged / "config.json").is_file() else out / "sft"


def rl(args: argparse.Namespace, out: Path) -> None:
    size = SIZES[args.size]
    for seed in seeds(args):
        run = out / "rl" / f"seed{seed}"
        if final_model(run) is None:
            cmd = [*MEMRL, "train", "--preset", PRESET, f"model.path={sft_model(out)}", f"data.path={out / 'train.jsonl'}",
                   *workflow(size)[1:], f"trainer.seed={seed}", f"data.seed={seed}", f"engine.seed={seed}",
                   f"out_dir={run}", *size.rl, *args.rl]
            sh(cmd + (["--resume"] if (run / "checkpoints" / "latest").exists() else []))


def seeds(args: argparse.Namespace) -> list[int]:
    return [int(s) for s in (args.seeds or SIZES[args.size].seeds).split(",")]


def final_model(run: Path) -> Path | None:
    """The run's checkpoint of its last step (trainer.steps of its config.yaml) once it exists: its merged/
    directory with LoRA, else the checkpoint itself."""
    import yaml

    cfg = run / "config.yaml"
    if not cfg.is_file():
        return None
    ckpt = run / "checkpoints" / f"step_{int(yaml.safe_load(cfg.read_text())['trainer']['steps']):06d}"
    for d in (ckpt / "merged", ckpt):
        if (d / "config.json").is_file():
            return d
    return None


def models(args: argparse.Namespace, out: Path) -> dict[str, tuple[Path, str]]:
    """name -> (model, workflow) of every model the table shows."""
    found = {"zero-shot": (model_dir(args, out), "memagent"), "full context": (model_dir(args, out), "full_context"),
             "sft": (sft_model(out), "memagent")}
    for seed in seeds(args):
        m = final_model(out / "rl" / f"seed{seed}")
        if m is not None:
            found[f"rl seed {seed}"] = (m, "memagent")
    return found


def evaluate(args: argparse.Namespace, out: Path) -> None:
    size = SIZES[args.size]
    files = [str(f) for n in split_rows(args) for f in ruler_files(out / args.split / str(n))]
    for name, (path, wf) in models(args, out).items():
        settings = workflow(size, "eval") if wf == "memagent" else [
            "workflow=full_context", *(w for w in workflow(size) if "max_final_tokens" in w)]
        for dec in size.decodings:
            sh([*MEMRL, "eval", "--model", str(path), "--out", str(out / eval_dir(args) / slug(name) / dec), "--no-progress",
                *files, *settings, *ENGINE, *DECODING[dec]])


def split_rows(args: argparse.Namespace) -> dict[int, int]:
    size = SIZES[args.size]
    return size.eval_rows if args.split == "heldout" else size.dev_rows


def eval_dir(args: argparse.Namespace) -> str:
    return "eval" if args.split == "heldout" else "eval_dev"


def slug(name: str) -> str:
    return name.replace(" ", "_")


# ---------------------------------------------------------------------------------------------- the table

COLUMNS = ("string match", "boxed", "published", "memory tokens")


def row_scores(r: dict) -> dict[str, float]:
    """One held-out row's scores (points; memory in tokens)."""
    from memrl.rewards.eval_metrics import string_match_all
    from memrl.rewards.qa import extract_boxed
    from memrl.rewards.verifiers import get_verifier

    text, golds = r.get("answer_text") or "", r["answers"]
    box = extract_boxed(text) or ""
    return {"string match": 100 * string_match_all(text, golds),
            "boxed": 100 * (string_match_all(box, golds) if box else 0.0),
            "published": 100 * get_verifier("verl_hotpotqa")(text, golds),
            "memory tokens": r.get("metrics", {}).get("memory_tokens_mean", float("nan"))}


def scores(run: Path) -> dict[int, dict[str, dict[str, float]]]:
    """length -> question (task@row) -> scores."""
    out: dict[int, dict[str, dict[str, float]]] = {}
    f = run / "results.jsonl"
    for line in (f.read_text().splitlines() if f.is_file() else []):
        if line.strip():
            r = json.loads(line)
            out.setdefault(int(r["num_docs"]), {})[f"{r.get('dataset')}#{r['task_id']}"] = row_scores(r)
    return out


def paired(run: dict[str, dict[str, float]], base: dict[str, dict[str, float]]) -> list[float]:
    """Per question held by both, `run`'s string match minus `base`'s (points)."""
    return [v["string match"] - base[q]["string match"] for q, v in run.items() if q in base] or [float("nan")]


def table(args: argparse.Namespace, out: Path) -> None:
    size = SIZES[args.size]
    names = list(models(args, out))
    rl_names = [n for n in names if n.startswith("rl seed")]
    lines = [f"# Needles: {args.size} size, {args.split} rows (held-out sha256 {json.loads((out / 'heldout.json').read_text())['sha256'][:12]})",
             "", "| model | decoding | length | questions | " + " | ".join(COLUMNS) + " | string match - SFT (paired) |",
             "|---|---|---:|---:|" + "---:|" * (len(COLUMNS) + 1)]
    for dec in size.decodings:
        sft_scores = scores(out / eval_dir(args) / "sft" / dec)
        for n in split_rows(args):
            for name in names + (["rl (seeds)"] if len(rl_names) > 1 else []):
                runs = rl_names if name == "rl (seeds)" else [name]
                got = [s[n] for s in (scores(out / eval_dir(args) / slug(r) / dec) for r in runs) if n in s]
                if not got:
                    continue
                base = sft_scores.get(n, {})
                if len(got) == 1:
                    cells = [mean_se([v[c] for v in got[0].values()]) for c in COLUMNS]
                    delta = mean_se(paired(got[0], base)) if name.startswith("rl") else "-"
                else:  # mean over seeds, standard error over the seeds' means
                    cells = [mean_se([statistics.mean(v[c] for v in s.values()) for s in got]) for c in COLUMNS]
                    delta = mean_se([statistics.mean(paired(s, base)) for s in got])
                    name = f"rl ({len(got)} seeds)"
                lines.append(f"| {name} | {dec} | {n} | {len(got[0])} | " + " | ".join(cells) + f" | {delta} |")
    lines += curve(args, out)
    text = "\n".join(lines) + "\n"
    (out / ("results.md" if args.split == "heldout" else "results_dev.md")).write_text(text, encoding="utf-8")
    print(text, end="")


def curve(args: argparse.Namespace, out: Path) -> list[str]:
    runs = {}
    for seed in seeds(args):
        f = out / "rl" / f"seed{seed}" / "metrics.jsonl"
        if f.is_file():
            runs[seed] = {m["step"]: m for m in map(json.loads, f.read_text().splitlines()) if "step" in m}
    if not runs:
        return []
    lines = ["", "training reward (ruler_match, mean over the step's trajectories), per seed", "",
             "| step | " + " | ".join(f"seed {s}" for s in runs) + " |", "|---:|" + "---:|" * len(runs)]
    for step in sorted({k for r in runs.values() for k in r}):
        lines.append(f"| {step} | " + " | ".join(f"{r[step]['reward/mean']:.2f}" if step in r else "-"
                                                 for r in runs.values()) + " |")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return lines
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for seed, r in runs.items():
        ax.plot(sorted(r), [r[k]["reward/mean"] for k in sorted(r)], marker="o", label=f"seed {seed}")
    ax.set_xlabel("RL step")
    ax.set_ylabel("training reward (ruler_match)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=120)
    return [*lines, "", f"curve: {out / 'curve.png'}"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="quick")
    ap.add_argument("--out", default=None, help="output directory (default runs/needle_<size>)")
    ap.add_argument("--model", default=None, help="a model directory instead of fetching SmolLM2")
    ap.add_argument("--hotpot", default=None, help="a HotpotQA file (original layout, .json or .json.xz) for the haystack")
    ap.add_argument("--haystack", default=None, help="a text file for the real-text haystack instead of --hotpot")
    ap.add_argument("--heldout-record", default=None, metavar="FILE",
                    help="the committed held-out record (docs/results/needle_heldout.json): the data stage refuses a "
                         "held-out set whose digest differs")
    ap.add_argument("--split", choices=("heldout", "dev"), default="heldout",
                    help="the rows eval and table read: heldout (scored once per final recipe) or dev (seed 2, where "
                         "settings are chosen)")
    ap.add_argument("--seeds", default=None, help="training seeds (default: the size's)")
    ap.add_argument("--stages", default="model,data,sft,rl,eval,table")
    ap.add_argument("--rl", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for the RL stage")
    ap.add_argument("--sft", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for the SFT stage")
    args = ap.parse_args()
    out = Path(args.out or f"runs/needle_{args.size}")
    out.mkdir(parents=True, exist_ok=True)
    stages = {"model": model, "data": data, "sft": sft, "rl": rl, "eval": evaluate, "table": table}
    for name in args.stages.split(","):
        if name not in stages:
            raise SystemExit(f"--stages: unknown stage {name!r}; known: {', '.join(stages)}")
        stages[name](args, out)


if __name__ == "__main__":
    main()
