"""Every dotted `memrl.x.y` name written in a docstring of the package, in the README or in a hand-written
docs page resolves to a module or an attribute (or a dataclass field) that exists: a moved or renamed
object leaves no stale pointer behind. The generated reference pages are checked by test_docs_reference."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import re
from pathlib import Path

import pytest

import memrl

ROOT = Path(memrl.__file__).parent
REPO = ROOT.parent
NAME = re.compile(r"(?<![\w./-])memrl(?:\.[A-Za-z_]\w*)+")
PENDING: set[str] = set()  # names known broken, each with the reason (none today)


def resolve(name: str) -> str | None:
    """None when `name` is an importable module, an attribute chain under one, or a dataclass field; else
    what is missing."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ModuleNotFoundError as e:
            if e.name and ".".join(parts[:k]).startswith(e.name):
                continue
            raise
        for i, attr in enumerate(parts[k:], start=k):
            fields = {f.name for f in dataclasses.fields(obj)} if dataclasses.is_dataclass(obj) else set()
            if attr in fields and not hasattr(obj, attr):
                return None  # a field without a class-level default
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:i])} has no {attr!r}"
            obj = getattr(obj, attr)
        return None
    return "no such module"


def docstrings(source: str) -> list[str]:
    """The module, class and function docstrings of `source`, and the attribute docstrings (a string
    statement after an assignment)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        for st in getattr(node, "body", []) if isinstance(getattr(node, "body", None), list) else []:
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
                out.append(st.value.value)
    return out


def written_names() -> dict[str, str]:
    """name -> the first file that writes it."""
    found: dict[str, str] = {}
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    for page in pages:
        # the generated reference, and the development log (dated history: names as they were that day)
        if {"reference", "log"} & set(page.relative_to(REPO).parts) or not page.is_file():
            continue
        for m in NAME.finditer(page.read_text(encoding="utf-8")):
            found.setdefault(m.group(), str(page.relative_to(REPO)))
    for path in sorted(ROOT.rglob("*.py")):
        for text in docstrings(path.read_text(encoding="utf-8")):
            for m in NAME.finditer(text):
                found.setdefault(m.group(), str(path.relative_to(REPO)))
    return found


def test_resolve_tells_a_stale_name_from_a_good_one():
    assert resolve("memrl.engines.hf.HFEngine") is None
    assert resolve("memrl.engines.config.EngineConfig.hf") is None  # a field with a default factory
    assert resolve("memrl.engines.hf.NoSuchEngine") == "memrl.engines.hf has no 'NoSuchEngine'"
    assert resolve("memrl.no_such_module") == "memrl has no 'no_such_module'"
    assert NAME.findall("see memrl.engines.base. and memrl/engines.py, memrl.types.Segment") == [
        "memrl.engines.base", "memrl.types.Segment"]


@pytest.mark.parametrize("where", ["package", "docs"])
def test_every_written_name_resolves(where):
    names = {n: f for n, f in written_names().items() if f.startswith("memrl/") == (where == "package")}
    assert len(names) > 20  # the scan found the names it is meant to check
    broken = {n: (f, resolve(n)) for n, f in sorted(names.items()) if n not in PENDING and resolve(n)}
    assert not broken, "\n".join(f"{f}: {n} ({why})" for n, (f, why) in broken.items())
