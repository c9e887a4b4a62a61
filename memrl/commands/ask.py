"""Ask a (trained) memory agent a question about your own long document.

  memrl ask --model runs/train/checkpoints/step_000100 --file report.txt --question "Who signed it?"
  memrl ask --model DIR --file book.txt --question "..." --workflow rememr1 --show-memory \\
      workflow.chunk_tokens=512 workflow.max_memory_tokens=256

The agent reads the file chunk by chunk (MemAgent, or ReMemR1 with recall), then answers from its memory;
greedy decoding unless workflow.temperature=... Arguments with '=' are dotted overrides of
memrl.eval.runner.EvalConfig, as in `memrl eval` (workflow.*, engine.*). The same as one Python call:
`memrl.eval.ask.ask(model, text, question, workflow="memagent", overrides=[...])`.
"""

from __future__ import annotations

import argparse

from memrl.errors import UsageError
from memrl.eval.ask import ASK_WORKFLOWS, ask, read_document, render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides of the evaluation config (workflow.*, engine.*)")
    parser.add_argument("--model", required=True, help="model directory (a trained checkpoint, or any HF model)")
    parser.add_argument("--file", required=True, help="the document: a UTF-8 text file")
    parser.add_argument("--question", required=True, help="the question to answer from the document")
    parser.add_argument("--workflow", choices=ASK_WORKFLOWS, default="memagent",
                        help="memagent (default) or rememr1 (memory with recall)")
    parser.add_argument("--show-memory", action="store_true", help="print the memory after each chunk")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise UsageError(f"memrl ask takes key=value overrides only, got {bad[0]!r}")
    text = read_document(args.file)
    res = ask(args.model, text, args.question, workflow=args.workflow, overrides=args.overrides, apply_threads=True)
    print(render(res, args.show_memory))
    return 0
