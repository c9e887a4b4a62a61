"""The `memrl` command. Each subcommand lives in its own module (memrl/commands/<name>.py) exposing
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches, so importing it is cheap."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Iterable
from typing import Any, NoReturn

from memrl import __version__
from memrl.config import redact_text
from memrl.engines.base import EngineError
from memrl.errors import UserError, os_message
from memrl.services.base import RetrievalError
from memrl.threads import check_env_threads, early_env

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "model": ("memrl.commands.model", "build tiny local models; convert verl / Megatron checkpoints"),
    "data": ("memrl.commands.data", "build, convert and inspect datasets"),
    "eval": ("memrl.commands.eval", "evaluate a workflow on eval files, by context length"),
    "ask": ("memrl.commands.ask", "ask a (trained) memory agent a question about your own document"),
    "train": ("memrl.commands.train", "RL training (dotted config overrides)"),
    "train-sft": ("memrl.commands.train_sft", "supervised cold start on workflow traces"),
    "demo": ("memrl.commands.demo", "the CPU demo: tiny model -> SFT -> RL -> eval -> report"),
    "serve": ("memrl.commands.serve", "start a service (retrieval: BM25 or dense search over a corpus)"),
    "view": ("memrl.commands.view", "a local web page over eval / training runs (trajectories, memory diffs)"),
}


class ArgumentError(Exception):
    """A command-line option argparse refused (a bad value, an unknown option): printed as one line."""

    def __init__(self, prog: str, message: str) -> None:
        super().__init__(message)
        self.prog = prog


class OneLineParser(argparse.ArgumentParser):
    """argparse's parser, except that a refused option is one line, `memrl <command>: error: <why>` (exit 2),
    like every other memrl error, instead of a usage block; `--help` still prints the usage."""

    def error(self, message: str) -> NoReturn:
        raise ArgumentError(self.prog, message)


def build_parser(commands: Iterable[str] | None = None) -> tuple[argparse.ArgumentParser, dict[str, object]]:
    """The `memrl` parser: every command is listed (name and help, for `memrl --help`), and the commands in
    `commands` (default: all) get their module imported and their options added. `main` asks only for the
    command on its line, so `memrl --version`, `memrl --help` and `memrl data ...` import no other command's
    module (those pull in torch and transformers); docs_gen asks for all."""
    parser = OneLineParser(prog="memrl", description="Long-context memory agents trained with RL.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    wanted = set(COMMANDS if commands is None else commands)
    modules: dict[str, object] = {}
    for name, (modname, help_) in COMMANDS.items():
        mod = None
        if name in wanted:
            try:
                mod = importlib.import_module(modname)
            except ModuleNotFoundError as e:
                if e.name == modname:  # command not built yet in this version
                    continue
                raise
        p = sub.add_parser(name, help=help_, description=((mod.__doc__ if mod else None) or help_).strip())
        if mod is not None:
            mod.add_arguments(p)
            modules[name] = mod
    return parser, modules


def chosen_command(argv: list[str]) -> str | None:
    """The command a `memrl` line names: its first word that is not an option (the top-level parser has
    only flags, --version and --help), or None."""
    return next((a for a in argv if not a.startswith("-")), None)


# Positional list arguments that take `key=value` overrides (and files) wherever they appear on the line.
_LIST_ARGS = ("overrides", "items", "files")


def _place_extras(parser: argparse.ArgumentParser, args: argparse.Namespace, extra: list[str]) -> None:
    """Append stray positional words (an override after an option) to the command's list argument."""
    target = next((a for a in _LIST_ARGS if isinstance(getattr(args, a, None), list)), None)
    stray = [x for x in extra if x.startswith("-") or target is None]
    if stray:
        parser.error(f"unrecognized arguments: {' '.join(stray)}")
    getattr(args, target).extend(extra)  # type: ignore[arg-type]


def redact_log_records() -> None:
    """Every log record's message passes `redact_text` (URL credentials, api_key=VALUE): an engine's
    warning that names its URL or a library that echoes an override prints no secret. Installed once."""
    make = logging.getLogRecordFactory()
    if getattr(make, "memrl_redacts", False):
        return

    def record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        rec = make(*args, **kwargs)
        try:
            text = rec.getMessage()
        except Exception:  # noqa: BLE001 - a bad format string is logging's own error to report
            return rec
        clean = redact_text(text)
        if clean != text:
            rec.msg, rec.args = clean, ()
        return rec

    record.memrl_redacts = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(record)


def main(argv: list[str] | None = None) -> int:
    redact_log_records()
    try:
        check_env_threads()  # an absurd OMP_NUM_THREADS, before any command imports torch (which reads it)
    except UserError as e:
        print(f"memrl: error: {e}", file=sys.stderr)
        return 2
    words = list(sys.argv[1:] if argv is None else argv)
    early_env(words)  # OMP_WAIT_POLICY before the commands import torch
    parser, modules = build_parser([c] if (c := chosen_command(words)) in COMMANDS else [])
    try:
        args, extra = parser.parse_known_args(argv)
        if extra:
            _place_extras(parser, args, extra)
    except ArgumentError as e:
        print(f"{e.prog}: error: {redact_text(str(e))}", file=sys.stderr)
        return 2
    if args.version:
        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 2
    debug = getattr(args, "debug", False)
    try:
        return int(modules[args.command].run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except UserError as e:
        if debug:
            raise
        print(f"memrl {args.command}: error: {redact_text(str(e))}", file=sys.stderr)
        return e.exit_code
    except OSError as e:  # the file system refused: name the file and why
        if debug:
            raise
        print(f"memrl {args.command}: error: {redact_text(os_message(e))}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # a server or engine that failed (named in the message); not a bug of ours
        if debug or not _service_failure(e):
            raise
        print(f"memrl {args.command}: error: {redact_text(str(e))}", file=sys.stderr)
        return 1


def _service_failure(e: BaseException) -> bool:
    """Whether `e` (or what a rollout wrapped) is an engine / retrieval failure rather than a bug."""
    return isinstance(e, EngineError | RetrievalError) or isinstance(e.__cause__, EngineError | RetrievalError)


if __name__ == "__main__":
    sys.exit(main())
