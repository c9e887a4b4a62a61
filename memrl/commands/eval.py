"""Evaluate a workflow on eval files by context length, or plot several finished runs together.

  memrl eval --model MODEL_DIR --out runs/eval/memagent data/hqa/eval_*.json \\
      [workflow=memagent] [workflow.chunk_tokens=5000] [engine.max_batch_size=16] [limit=20]
  memrl eval --model MODEL_DIR --out runs/eval/fullctx data/hqa/eval_*.json workflow=full_context \\
      full_context.max_context_tokens=120000
  memrl eval report runs/eval/memagent runs/eval/fullctx --out runs/eval/compare

Arguments with '=' are dotted config overrides: `workflow.*` go to the workflow's config (greedy decoding
by default), the rest to memrl.eval.runner.EvalConfig. Results: <out>/results.jsonl (one row per question;
re-running resumes), summary.md, summary.csv and accuracy.png.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from memrl.errors import UserError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("items", nargs="+", metavar="FILE|key=value",
                        help="eval files (eval_{N}.json, MemAgent parquet) and dotted overrides; "
                             "or 'report DIR [DIR ...]'")
    parser.add_argument("--out", required=True, help="output directory (results, tables, plot)")
    parser.add_argument("--model", default=None, help="model directory (same as engine.model=...)")
    parser.add_argument("--preset", default=None, help="config preset YAML for EvalConfig")
    parser.add_argument("--name", default=None, help="run name in tables and plots")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def split_items(items: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(files, eval overrides, workflow overrides); a workflow override loses its `workflow.` prefix."""
    files, ev, wf = [], [], []
    for it in items:
        if "=" in it and not Path(it).exists():
            key, _, value = it.partition("=")
            if key.startswith("workflow."):
                wf.append(f"{key[len('workflow.'):]}={value}")
            else:
                ev.append(it)
        else:
            files.append(it)
    return files, ev, wf


def run(args: argparse.Namespace) -> int:
    from memrl.eval.report import report_dirs, summarize, write_report

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.items[0] == "report":
        dirs = args.items[1:]
        if not dirs:
            raise UserError("eval report: give one or more result directories")
        files = report_dirs(dirs, args.out)
        print(files.markdown.read_text(), end="")
        print(f"wrote {files.markdown}, {files.csv}, {files.png}")
        return 0

    from memrl.config import load_config
    from memrl.eval.runner import EvalConfig, evaluate

    files, ev, wf = split_items(args.items)
    if not files:
        raise UserError("eval: no eval files given")
    for f in files:
        if not Path(f).exists():
            raise UserError(f"eval file {f} does not exist")
    if args.model:
        ev.append(f"engine.model={args.model}")
    if args.name:
        ev.append(f"name={args.name}")
    if args.no_progress:
        ev.append("progress=false")
    cfg = load_config(EvalConfig, ev, preset=args.preset)
    rows = evaluate(files, args.out, cfg, wf)
    summaries = summarize(rows, cfg.name or Path(args.out).resolve().name)
    out = write_report(args.out, summaries)
    print(out.markdown.read_text(), end="")
    print(f"wrote {Path(args.out) / 'results.jsonl'}, {out.markdown}, {out.csv}, {out.png}")
    return 0
