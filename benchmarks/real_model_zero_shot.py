"""Zero-shot tables of a real model (SmolLM2-135M-Instruct) on real HotpotQA and on RULER needles.

  .venv/bin/python benchmarks/real_model_zero_shot.py --model DIR --hotpot hotpot_dev_distractor_v1.json \
      [--docs 10,50,200] [--ruler-lengths 2k,8k,32k] [--questions 8] [--out runs/real_zero_shot] [--only hotpotqa] [--memagent-n 2048,8192]

Builds the eval files (`memrl data build`: HotpotQA questions padded with other questions' paragraphs to
N documents, seed 0; RULER niah_single_1 built locally, lengths measured in the model's tokenizer), then
runs `memrl eval` for MemAgent and for the full-context baseline (the document truncated in the middle to
the model's window) with the settings below, fixed before any run, greedy. Runs resume (results.jsonl).
Each final reply is then scored three ways, side by side:
  published: MemAgent's training verifier (workflow.reward=verl_hotpotqa: the last \\boxed{} in the last
             300 characters, spaces and LaTeX removed, lowercased);
  boxed EM:  memrl's eval (the last \\boxed{}, SQuAD-normalized exact match, best over the golds);
  lenient:   a gold answer appears anywhere in the final reply (both SQuAD-normalized).
plus the share of replies with no \\boxed{}, the mean memory length (tokens) and seconds per question (the
set's wall time over its questions, which run together).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEMAGENT = ["workflow=memagent", "workflow.chunk_tokens=1024", "workflow.max_memory_tokens=128",
            "workflow.max_final_tokens=32"]
FULL = ["workflow=full_context", "workflow.max_final_tokens=32"]
ENGINE = ["engine.hf.compute_dtype=auto", "engine.hf.kv_cache=slots", "engine.max_batch_size=16"]


def sh(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=ROOT, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        errs = [ln for ln in proc.stderr.replace("\r", "\n").splitlines() if ln.strip()]
        raise SystemExit("\n".join(errs[-15:]))


def build(args: argparse.Namespace, out: Path) -> dict[str, list[Path]]:
    sets: dict[str, list[Path]] = {}
    memrl = [sys.executable, "-m", "memrl.cli"]
    if args.only in ("", "hotpotqa"):
        d = out / "data" / "hotpotqa"
        if not (d / "manifest.json").is_file():
            sh([*memrl, "data", "build", "--kind", "hotpotqa", "--source", args.hotpot, "--out", str(d),
                "--docs", args.docs, "--num-questions", str(args.questions), "--seed", "0"])
        sets["hotpotqa"] = [d / f"eval_{n}.json" for n in args.docs.split(",")]
    if args.only in ("", "ruler"):
        d = out / "data" / "ruler"
        if not any(d.glob("*")):
            sh([*memrl, "data", "build", "--kind", "ruler", "--tasks", "niah_single_1", "--lengths", args.ruler_lengths,
                "--tokenizer", args.model, "--samples", str(args.questions), "--out", str(d), "--seed", "0"])
        sets["ruler"] = sorted(p for p in d.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl")
                               and p.name != "manifest.json")
    return sets


def set_n(path: Path) -> int:
    """N of an eval file: documents for HotpotQA (eval_<N>.json), tokens for RULER (<N>/data/<task>/...)."""
    return int(path.stem.split("_")[1]) if path.stem.startswith("eval_") else int(path.parts[-4])


def evaluate(args: argparse.Namespace, files: list[Path], run: Path, wf: list[str]) -> None:
    sh([sys.executable, "-m", "memrl.cli", "eval", "--model", args.model, "--out", str(run), "--no-progress",
        *map(str, files), *wf, *ENGINE])


def score(run: Path) -> list[tuple[int, dict[str, float]]]:
    from memrl.rewards.qa import extract_boxed, normalize_answer
    from memrl.rewards.verifiers import get_verifier

    published = get_verifier("verl_hotpotqa")
    by_n: dict[int, list[dict]] = {}
    for line in (run / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            by_n.setdefault(int(r["num_docs"]), []).append(r)
    out = []
    for n, rows in sorted(by_n.items()):
        texts = [r.get("answer_text") or "" for r in rows]
        lenient = [float(any(normalize_answer(g) and normalize_answer(g) in normalize_answer(t) for g in r["answers"]))
                   for r, t in zip(rows, texts, strict=True)]
        mem = [statistics.mean(r["metrics"]["memory_tokens"]) if isinstance(r.get("metrics", {}).get("memory_tokens"), list)
               else r.get("metrics", {}).get("memory_tokens_mean", float("nan")) for r in rows]
        out.append((n, {"questions": len(rows),
                        "published": 100 * statistics.mean(published(t, r["answers"]) for r, t in zip(rows, texts, strict=True)),
                        "boxed EM": 100 * statistics.mean(r["em"] for r in rows),
                        "lenient": 100 * statistics.mean(lenient),
                        "no box": 100 * statistics.mean(float(extract_boxed(t) is None) for t in texts),
                        "context tokens": statistics.mean(r["context_tokens"] for r in rows),
                        "memory tokens": statistics.mean(m for m in mem if m == m) if any(m == m for m in mem) else float("nan"),
                        # questions run together (eval's concurrency): the set's wall time over its questions
                        "s / question": (max(r["finished"] for r in rows) - min(r["started"] for r in rows)) / len(rows)}))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--hotpot", default=None,
                   help="HotpotQA dev distractor file (default: `memrl data fetch hotpotqa_dev_distractor`'s)")
    ap.add_argument("--docs", default="10,50,200")
    ap.add_argument("--ruler-lengths", default="2k,8k,32k")
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--only", choices=("", "hotpotqa", "ruler"), default="")
    ap.add_argument("--out", default="runs/real_zero_shot")
    ap.add_argument("--memagent-n", default="", help="run MemAgent only at these N (documents for HotpotQA, "
                    "tokens for RULER, comma-separated; default: every N); the full-context baseline runs at every N")
    ap.add_argument("--table-only", action="store_true", help="score finished runs, run nothing")
    args = ap.parse_args()
    if args.hotpot is None:
        from memrl.data.fetch import fetched_path  # noqa: PLC0415 - only for the default
        from memrl.errors import UserError  # noqa: PLC0415

        try:
            args.hotpot = str(fetched_path("hotpotqa_dev_distractor"))
        except UserError as e:
            raise SystemExit(f"--hotpot: {e} (or pass --hotpot FILE)") from None
    out = Path(args.out)
    sets = build(args, out) if not args.table_only else {
        s: [] for s in ("hotpotqa", "ruler") if (out / s).is_dir() and args.only in ("", s)}
    keep = {int(n) for n in args.memagent_n.split(",")} if args.memagent_n else None
    for name, files in sets.items():
        for wf_name, wf in (("memagent", MEMAGENT), ("full_context", FULL)):
            run_files = [f for f in files if wf_name != "memagent" or keep is None or set_n(f) in keep]
            if not args.table_only and run_files:
                evaluate(args, run_files, out / name / wf_name, wf)
    cols = ("questions", "published", "boxed EM", "lenient", "no box", "context tokens", "memory tokens", "s / question")
    print("| set | N | workflow | " + " | ".join(cols) + " |")
    print("|---|---:|---|" + "---:|" * len(cols))
    for name in sets:
        for wf_name in ("memagent", "full_context"):
            run = out / name / wf_name
            if not (run / "results.jsonl").is_file():
                continue
            for n, m in score(run):
                cells = ["-" if m[c] != m[c] else f"{m[c]:.0f}" if c in ("questions", "context tokens") else f"{m[c]:.1f}"
                         for c in cols]
                print(f"| {name} | {n} | {wf_name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
