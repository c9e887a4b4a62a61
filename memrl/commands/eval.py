"""Evaluate a workflow on eval files by context length, or plot several finished runs together.

  memrl eval --model MODEL_DIR --out runs/eval/memagent data/hqa/eval_*.json \\
      [workflow=memagent] [workflow.chunk_tokens=5000] [engine.max_batch_size=16] [limit=20]
  memrl eval --model MODEL_DIR --out runs/eval/fullctx data/hqa/eval_*.json workflow=full_context \\
      workflow.max_context_tokens=120000
  memrl eval report runs/eval/memagent runs/eval/fullctx --out runs/eval/compare
  memrl eval --model MODEL_DIR --out runs/eval/memact tasks.jsonl workflow=memact \
      workflow.retriever_corpus=corpus.jsonl [workflow.prune_tool=false  (the search-only baseline)]
  memrl eval --model MODEL_DIR --out runs/eval/over1m eval_12800.json --docs-from hotpot_dev_distractor_v1.json

Eval files: MemAgent / ReMemR1 eval_{N}.json (index-only ones with --docs-from), MemAgent parquet,
vime / slime JSONL, RULER (validation.jsonl or MemAgent's eval_<task>_<len>.json), LongBench, LoCoMo
(locomo10.json) and LongMemEval (longmemeval_s / _m / _oracle), memrl task files. Rows with a question type
(LoCoMo, LongMemEval) add a by-type table to summary.md; `judge.url=... judge.model=...` has an LLM judge
score LongMemEval's answers (docs/guides/conversational.md).

Arguments with '=' are dotted overrides of memrl.eval.runner.EvalConfig, spelled as in `memrl train`:
`workflow.<field>` sets the workflow's config (greedy decoding by default), `engine.*` the engine;
`golds=any|first`, `extract=boxed|answer_is|boxed_published|boxed_last300|raw` and
`metric_rules=memrl|memagent|vime` choose how answers are scored (docs/guides/eval_scoring.md). `--preset memagent_eval_official` (rememr1_eval_official,
vime_eval_official) is a published evaluation value for value; it needs your copies of the published
prompts: workflow.memory_template_file=... workflow.final_template_file=... (README "Evaluate as
published"). Results: <out>/results.jsonl (one row per question; re-running resumes), summary.md,
summary.csv and accuracy.png (MemAct runs: also the MemAct table in summary.md, memact_summary.csv and
memact_context.png).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from memrl.config import load_config
from memrl.errors import UserError
from memrl.eval.report import report_dirs, section_summaries, summarize, write_report
from memrl.eval.runner import EvalConfig, evaluate
from memrl.locks import locked_dir
from memrl.threads import apply as apply_threads


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("items", nargs="+", metavar="FILE|key=value",
                        help="eval files (eval_{N}.json, MemAgent parquet) and dotted overrides; "
                             "or 'report DIR [DIR ...]'")
    parser.add_argument("--out", required=True, help="output directory (results, tables, plot)")
    parser.add_argument("--model", default=None, help="model directory (same as engine.model=...)")
    parser.add_argument("--preset", default=None, help="config preset for EvalConfig: a packaged name "
                        "(memagent_eval_official, rememr1_eval_official, vime_eval_official) or a YAML path")
    parser.add_argument("--name", default=None, help="run name in tables and plots")
    parser.add_argument("--docs-from", default=None, metavar="DEV_FILE",
                        help="index-only eval files: the dev file their document indices point into "
                             "(same as docs_from=...)")
    parser.add_argument("--group-by", choices=("dataset", "file"), default="dataset",
                        help="table rows per (dataset, N) (default) or per (eval file, N), as MemAgent / vime "
                             "score each file")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def split_items(items: list[str]) -> tuple[list[str], list[str]]:
    """(files, overrides): an item with '=' that is not an existing path is an override."""
    files, ev = [], []
    for it in items:
        (ev if "=" in it and not Path(it).exists() else files).append(it)
    return files, ev


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.items[0] == "report":
        dirs = args.items[1:]
        if not dirs:
            raise UserError("eval report: give one or more result directories")
        files = report_dirs(dirs, args.out, args.group_by)
        print(files.markdown.read_text(), end="")
        print(f"wrote {files.markdown}, {files.csv}, {files.png}")
        return 0

    files, ev = split_items(args.items)
    if not files:
        raise UserError("eval: no eval files given")
    for f in files:
        if not Path(f).exists():
            raise UserError(f"eval file {f} does not exist")
    if args.model:
        ev.append(f"engine.model={args.model}")
    if args.name:
        ev.append(f"name={args.name}")
    if args.docs_from:
        ev.append(f"docs_from={args.docs_from}")
    if args.no_progress:
        ev.append("progress=false")
    cfg = load_config(EvalConfig, ev, preset=args.preset)
    apply_threads(cfg.threads)  # torch's thread counts; the wait policy was set before torch loaded (memrl.cli)
    with locked_dir(args.out, "--out"):  # a second eval into --out would answer every question again
        rows = evaluate(files, args.out, cfg)
    name = cfg.name or Path(args.out).resolve().name
    out = write_report(args.out, summarize(rows, name, args.group_by), sections=section_summaries(rows, name))
    print(out.markdown.read_text(), end="")
    print(f"wrote {Path(args.out) / 'results.jsonl'}, {out.markdown}, {out.csv}, {out.png}")
    return 0
