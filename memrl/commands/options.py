"""Options that only some `--kind`s (or `--retriever`s) read: which were given on the command line, and a
one-line refusal of one the chosen kind would silently ignore, naming the option it reads instead."""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from memrl.errors import UsageError

GIVEN = "given_options"
"""Namespace attribute: the dests of the options given on the command line (`track_given`)."""


def _recording(base: type[argparse.Action]) -> type[argparse.Action]:
    class Recording(base):  # type: ignore[misc,valid-type]
        def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                     option_string: str | None = None) -> None:
            super().__call__(parser, namespace, values, option_string)
            given = set(getattr(namespace, GIVEN, ()))
            setattr(namespace, GIVEN, given | {self.dest})

    return Recording


def track_given(parser: argparse.ArgumentParser) -> None:
    """Make `parser`'s store / store_true options (added after this call) record that they were given."""
    parser.register("action", None, _recording(argparse._StoreAction))
    parser.register("action", "store", _recording(argparse._StoreAction))
    parser.register("action", "store_true", _recording(argparse._StoreTrueAction))


def refuse_unused(args: argparse.Namespace, kind: str, chooser: str, used_by: Mapping[str, tuple[str, ...]],
                  instead: Mapping[tuple[str, str], str], names: Mapping[str, str] | None = None) -> None:
    """UsageError for the first given option whose `used_by[dest]` excludes `kind` (what `chooser`, e.g.
    --kind, chose), naming the option that kind reads instead when `instead[(dest, kind)]` says; `names`
    spells a kind that stands for several values (eval -> "auto|hotpotqa|... (eval sets)")."""
    names = names or {}
    given = getattr(args, GIVEN, set())
    for dest, users in used_by.items():
        if dest not in given or kind in users:
            continue
        opt = "--" + dest.replace("_", "-")
        alt = instead.get((dest, kind))
        hint = f"; it reads {alt}" if alt else f" (only by {' and '.join(f'{chooser} {names.get(u, u)}' for u in users)})"
        raise UsageError(f"{opt} is not used by {chooser} {names.get(kind, kind)}{hint}")
