"""Start a service.

  memrl serve retrieval --corpus corpus.jsonl [--host 127.0.0.1] [--port 8000]
                        [--max-concurrency 8] [--cache-size 10000] [--max-topk 100]
                        [--retriever bm25|dense --model EMBEDDING_MODEL_DIR]
                        [--reply-shape memrl|public] [--max-body-bytes 8388608]

`retrieval` serves BM25 over a corpus JSONL (build one with `memrl data corpus`) at POST /retrieve and
GET /health (docs/guides/memact_services.md). It binds 127.0.0.1 unless told otherwise.
"""

from __future__ import annotations

import argparse
import socket
import time
from pathlib import Path

from memrl.commands.options import refuse_unused, track_given
from memrl.config import MAX_CHARS, MAX_COUNT, MAX_PARALLEL, bounded
from memrl.errors import UsageError, UserError
from memrl.services.retrieval import BM25Retriever, DenseRetriever
from memrl.services.server import create_app


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    sub = parser.add_subparsers(dest="service", metavar="SERVICE", required=True)
    r = sub.add_parser("retrieval", help="BM25 retrieval over a corpus JSONL (POST /retrieve, GET /health)")
    track_given(r)  # --model / --device without --retriever dense are refused, not ignored
    r.add_argument("--corpus", required=True, help="corpus JSONL: {id, title, text} per line")
    r.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    r.add_argument("--port", type=bounded(int, ge=1, le=65535), default=8000)
    r.add_argument("--max-concurrency", type=bounded(int, ge=1, le=MAX_PARALLEL), default=8, help="request batches scored at once")
    r.add_argument("--cache-size", type=bounded(int, ge=0, le=MAX_COUNT), default=10000, help="LRU cache entries (query, topk); 0 = off")
    r.add_argument("--max-topk", type=bounded(int, ge=1, le=MAX_COUNT), default=100, help="largest topk a request may ask for")
    r.add_argument("--retriever", choices=("bm25", "dense"), default="bm25",
                   help="bm25 (default) or dense (needs the 'dense' extra and --model)")
    r.add_argument("--model", help="--retriever dense: a local sentence-transformers / HF model directory")
    r.add_argument("--device", default="cpu", help="--retriever dense: torch device of the embedding model")
    r.add_argument("--reply-shape", choices=("memrl", "public"), default="memrl",
                   help="memrl: documents with id and score; public: as the public MemAct service (title and "
                        "text only)")
    r.add_argument("--max-body-bytes", type=bounded(int, ge=1, le=MAX_CHARS), default=8 * 1024 * 1024,
                   help="larger request bodies get 413 before they are read (default 8 MiB)")
    r.add_argument("--log-level", default="warning", help="uvicorn log level")
    r.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    if args.service == "retrieval":
        return _retrieval(args)
    raise ValueError(f"unknown service {args.service!r}")


def check_retrieval_args(args: argparse.Namespace) -> None:
    """Option values and the files they name, before any import or indexing: UsageError (exit 2) for a
    value out of range, UserError for a missing file or a port that cannot be bound."""
    refuse_unused(args, args.retriever, "--retriever", {"model": ("dense",), "device": ("dense",)}, {})
    if not 1 <= args.port <= 65535:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    for opt, val, low in (("--max-concurrency", args.max_concurrency, 1), ("--max-topk", args.max_topk, 1),
                          ("--max-body-bytes", args.max_body_bytes, 1), ("--cache-size", args.cache_size, 0)):
        if val < low:
            raise UsageError(f"{opt} must be at least {low}{' (0 = no cache)' if low == 0 else ''}, got {val}")
    if args.retriever == "dense":
        if not args.model:
            raise UsageError("--retriever dense needs --model (a local embedding model directory)")
        if not Path(args.model).is_dir():
            raise UserError(f"--model {args.model}: no such directory (expected a local embedding model directory)")
    if not Path(args.corpus).is_file():
        c = Path(args.corpus)
        what = ("is a directory" if c.is_dir() else "is not a regular file (a device or pipe)" if c.exists() else
                "does not exist")
        raise UserError(f"corpus file {args.corpus} {what} (expected a corpus JSONL: memrl data corpus)")
    problem = bind_problem(args.host, args.port)
    if problem:
        raise UserError(f"--host {args.host} --port {args.port}: cannot listen there ({problem})")


def bind_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on (host, port) (address in use, unknown host), None if it can.
    Checked before indexing a corpus, which can take minutes; the port is released again at once."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        return f"unknown host: {e.strerror}"
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            s.bind(addr)
        except OSError as e:
            return e.strerror or str(e)
    return None


def _retrieval(args: argparse.Namespace) -> int:
    check_retrieval_args(args)
    try:
        import uvicorn  # noqa: PLC0415
    except ImportError as e:
        raise UserError("memrl serve needs the 'serve' extra: pip install 'memrl[serve]'") from e

    t0 = time.perf_counter()
    if args.retriever == "dense":
        retriever = DenseRetriever.from_file(args.corpus, args.model, device=args.device, max_topk=args.max_topk)
    else:
        retriever = BM25Retriever.from_file(args.corpus, max_topk=args.max_topk)
    print(f"indexed {len(retriever.docs)} documents from {args.corpus} in {time.perf_counter() - t0:.1f}s; "
          f"serving on http://{args.host}:{args.port}", flush=True)
    app = create_app(retriever, args.max_concurrency, args.cache_size, corpus=args.corpus,
                     reply_shape=args.reply_shape, max_body_bytes=args.max_body_bytes)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
