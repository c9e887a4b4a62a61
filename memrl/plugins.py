"""Objects a config names by import path, `package.module:attr` (workflows, reward verifiers, retrievers).

A config is text, and a name that resolves to Python code is restricted: the attribute must be of the
kind the field asks for (a `WorkflowSpec` instance, a function marked `@memrl.rewards.verifiers.verifier`,
a class or function marked `@memrl.tools.search.retriever_factory`), checked before anything is called;
anything else (`os:system`, `builtins:exec`) is refused with a one-line ConfigError. Importing the module
runs its top-level code, as any import does; the attribute is read from the module's namespace (no
module `__getattr__` hook runs).
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

from memrl.config import ConfigError

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$")
"""`package.module:attr`: dotted module name, one colon, one attribute name."""


def is_import_path(name: object) -> bool:
    """True when `name` is meant as an import path (it has a colon); registered names never do."""
    return isinstance(name, str) and ":" in name


def load_object(path: str, where: str, kind: str, accept: Callable[[Any], bool], hint: str = "") -> Any:
    """The object `path` ("module:attr") names, when `accept(obj)`; otherwise a one-line ConfigError that
    starts with `where=path` and says which step failed: the syntax, the import, the attribute, or the
    kind of object (`kind`, e.g. "a WorkflowSpec"; `hint` says how to make one). Nothing is called."""
    head = f"{where}={path!r}"
    if not IMPORT_PATH.match(path):
        raise ConfigError(f"{head}: expected an import path module:attr (e.g. mypkg.mymodule:NAME)")
    mod_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(mod_name)
    except Exception as e:  # noqa: BLE001 - any failure while importing is the user's module: say which
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        if not isinstance(e, ImportError):
            reason = f"{type(e).__name__}: {reason}"
        raise ConfigError(f"{head}: cannot import module {mod_name!r} ({reason})") from e
    missing = object()
    obj = vars(module).get(attr, missing)
    if obj is missing:
        raise ConfigError(f"{head}: module {mod_name!r} has no attribute {attr!r}")
    if not accept(obj):
        got = type(obj).__name__
        raise ConfigError(f"{head} is not {kind} (got {got})" + (f": {hint}" if hint else "") + " (nothing was called)")
    return obj
