"""Build tiny local models: a byte-level BPE tokenizer (ChatML template) and a randomly initialized Qwen2
causal LM in HuggingFace format. Nothing is downloaded.

  memrl model init --preset tiny --out models/tiny [--corpus a.txt b.txt] [--vocab-size 4096] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from memrl.config import bounded


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from memrl.models.tiny import PRESETS

    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="train a tokenizer and write a random Qwen2 model")
    init.add_argument("--preset", choices=sorted(PRESETS), default="tiny", help="model size (tiny ~3M, small ~24M)")
    init.add_argument("--out", required=True, help="output directory (HuggingFace format)")
    init.add_argument("--corpus", nargs="+", default=None, metavar="FILE",
                      help="text files to train the tokenizer on (default: built-in synthetic text)")
    init.add_argument("--vocab-size", type=bounded(int, ge=1), default=None, help="BPE vocabulary size (default: the preset's)")
    init.add_argument("--seed", type=bounded(int, ge=0), default=0, help="seed of the synthetic text and the weights")
    init.add_argument("--force", action="store_true", help="write into a non-empty output directory")
    init.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    from memrl.errors import UserError
    from memrl.models.tiny import init_tiny_model

    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--out {out} is not empty; pass --force to write into it")
    for c in args.corpus or []:
        if not Path(c).is_file():
            raise UserError(f"--corpus file {c} does not exist")
    init_tiny_model(out, preset=args.preset, corpus=args.corpus, seed=args.seed, vocab_size=args.vocab_size)
    info = json.loads((out / "memrl_model.json").read_text(encoding="utf-8"))
    print(f"wrote {args.preset} model to {out}: {info['num_parameters']:,} parameters, vocab {info['vocab_size']}")
    return 0
