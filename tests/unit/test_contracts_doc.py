"""docs/CONTRACTS.md names, for each boundary, the tests that check it (`tests/<path>.py::test_name`): every
section names at least one, and every named test exists (a renamed or deleted test fails here, naming it)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(tests/[\w/]+\.py)::(\w+)`")


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts) - 1, 2)}


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def missing_tests(text: str, root: Path = ROOT) -> list[str]:
    """The `file::function` names in `text` whose file or function does not exist."""
    out = []
    for file, fn in NAMED.findall(text):
        path = root / file
        if not path.is_file() or fn not in _functions(path):
            out.append(f"{file}::{fn}")
    return out


def test_every_contract_section_names_a_test():
    sections = _sections((ROOT / "docs" / "CONTRACTS.md").read_text(encoding="utf-8"))
    assert len(sections) > 10
    bare = [title for title, body in sections.items() if title != "Layout" and not NAMED.search(body)]
    assert not bare, f"docs/CONTRACTS.md sections without a `tests/...py::test_name`: {bare}"


def test_every_named_test_exists():
    missing = missing_tests((ROOT / "docs" / "CONTRACTS.md").read_text(encoding="utf-8"))
    assert not missing, f"docs/CONTRACTS.md names tests that do not exist: {', '.join(missing)}"


def test_a_renamed_test_is_caught(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text("def test_kept():\n    pass\n")
    text = "`tests/test_x.py::test_kept` and `tests/test_x.py::test_gone`, `tests/test_y.py::test_a`"
    assert missing_tests(text, tmp_path) == ["tests/test_x.py::test_gone", "tests/test_y.py::test_a"]
