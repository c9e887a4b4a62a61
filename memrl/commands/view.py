"""Open a local web page over one or two runs: question list, trajectories, memory diffs, curves.

  memrl view runs/eval/memagent [runs/eval/memagent_rl] [--host 127.0.0.1] [--port 8765]

A run is an eval --out directory (results.jsonl) or a training out_dir (trajectories.jsonl,
metrics.jsonl). With two runs, a trajectory is shown next to the same question of the other run.
"""

from __future__ import annotations

import argparse
import logging

from memrl.config import bounded
from memrl.errors import UsageError
from memrl.viewer.server import make_server, url_of


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="one or two run directories")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=bounded(int, ge=0, le=65535), default=8765, help="port (default 8765; 0 = any free port)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="also answer requests whose Host header is NAME (a proxy's name; repeatable)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if len(args.runs) > 2:
        raise UsageError(f"view: give one or two run directories, got {len(args.runs)}")
    server = make_server(args.runs, args.host, args.port, args.allow_host)
    print(f"memrl view: serving {', '.join(args.runs)} at {url_of(server)} (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
