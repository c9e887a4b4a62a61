"""Ask a (trained) memory agent a question about your own long document.

  memrl ask --model runs/train/checkpoints/step_000100 --file report.txt --question "Who signed it?"
  memrl ask --model DIR --file book.txt --question "..." --workflow rememr1 --show-memory \\
      workflow.chunk_tokens=512 workflow.max_memory_tokens=256

The agent reads the file chunk by chunk (MemAgent, or ReMemR1 with recall), then answers from its memory;
greedy decoding unless workflow.temperature=... A progress bar over the chunks (with the time left) goes to
stderr (--no-progress: none); --show-memory prints each memory as it is written. Arguments with '=' are dotted overrides of
memrl.eval.runner.EvalConfig, as in `memrl eval` (workflow.*, engine.*); the model and the workflow are
chosen with --model and --workflow only (an override of engine.model or workflow.name is refused). The same as one Python call:
`memrl.eval.ask.ask(model, text, question, workflow="memagent", overrides=[...])`.
"""

from __future__ import annotations

import argparse

from memrl.errors import UsageError
from memrl.eval.ask import ASK_WORKFLOWS, ask, read_document, render, render_memory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("overrides", nargs="*", metavar="key=value",
                        help="dotted overrides of the evaluation config (workflow.*, engine.*)")
    parser.add_argument("--model", required=True, help="model directory (a trained checkpoint, or any HF model)")
    parser.add_argument("--file", required=True, help="the document: a UTF-8 text file")
    parser.add_argument("--question", required=True, help="the question to answer from the document")
    parser.add_argument("--workflow", choices=ASK_WORKFLOWS, default="memagent",
                        help="memagent (default) or rememr1 (memory with recall)")
    parser.add_argument("--show-memory", action="store_true",
                        help="print the memory after each chunk, as it is written")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar over the chunks (stderr)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise UsageError(f"memrl ask takes key=value overrides only, got {bad[0]!r}")
    text = read_document(args.file)
    def show(i: int, memory: str, recall: str) -> None:
        print(render_memory(i, memory, recall), flush=True)

    res = ask(args.model, text, args.question, workflow=args.workflow, overrides=args.overrides, apply_threads=True,
              progress=not args.no_progress, on_memory=show if args.show_memory else None)
    print(render(res, args.show_memory, streamed=True))
    return 0
