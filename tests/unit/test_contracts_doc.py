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


def training_layout_gaps(text: str, training: Path) -> list[str]:
    """Where the Layout block's `training/` entry and the folder `training` differ: a subpackage or a module
    (`name.py`, by the folder it sits in) that one has and the other has not."""
    block = _sections(text)["Layout"]
    entry = re.search(r"^  training/(.*?)(?=^  \S)", block, flags=re.M | re.S)
    assert entry, "docs/CONTRACTS.md's Layout block has no `training/` entry"
    parts = re.split(r"^    (\w+)/", entry.group(1), flags=re.M)
    named = {"": parts[0], **{parts[i]: parts[i + 1] for i in range(1, len(parts) - 1, 2)}}
    folders = {""} | {p.name for p in training.iterdir() if (p / "__init__.py").is_file()}
    out = [f"training/{f}/ is not in the Layout block" for f in sorted(folders - set(named))]
    out += [f"the Layout block names training/{f}/, which does not exist" for f in sorted(set(named) - folders)]
    for folder in sorted(folders & set(named)):
        where = f"training/{folder}/" if folder else "training/"
        have = {p.name for p in (training / folder).glob("*.py") if p.name != "__init__.py"}
        said = set(re.findall(r"\b\w+\.py\b", named[folder]))
        out += [f"{where}{m} is not named under {where}" for m in sorted(have - said)]
        out += [f"the Layout block names {where}{m}, which does not exist" for m in sorted(said - have)]
    return out


def test_layout_names_every_training_folder_and_module():
    """A newcomer finds a part of training/ by its folder: the map says which folder holds each module."""
    gaps = training_layout_gaps((ROOT / "docs" / "CONTRACTS.md").read_text(encoding="utf-8"),
                                ROOT / "memrl" / "training")
    assert gaps == []


def test_a_training_module_missing_from_the_layout_is_caught(tmp_path):
    for rel in ("__init__.py", "trainer.py", "step/__init__.py", "step/rollout.py", "step/new.py",
                "ranks/__init__.py", "ranks/workers.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("")
    text = ("## Layout\n\n```\nmemrl/\n  training/       trainer.py (the loop), config.py\n"
            "    step/         rollout.py\n    sync/         engine_sync.py\n  data/           io.py\n```\n"
            "## Next\n")
    assert training_layout_gaps(text, tmp_path) == [
        "training/ranks/ is not in the Layout block",
        "the Layout block names training/sync/, which does not exist",
        "the Layout block names training/config.py, which does not exist",
        "training/step/new.py is not named under training/step/",
    ]


def repeated_sentences(text: str, shortest: int = 60) -> list[str]:
    """The sentences or clauses (split at . ! ? ; and blank lines, code blocks left out, whitespace folded) of at
    least `shortest` characters that `text` holds more than once: a paragraph pasted twice, also when one copy
    grew a clause."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    seen: dict[str, int] = {}
    for piece in re.split(r"(?<=[.!?;])\s+|\n\s*\n", prose):
        s = " ".join(piece.split()).rstrip(".;")
        if len(s) >= shortest:
            seen[s] = seen.get(s, 0) + 1
    return [s for s, n in seen.items() if n > 1]


def test_no_sentence_is_written_twice():
    twice = repeated_sentences((ROOT / "docs" / "CONTRACTS.md").read_text(encoding="utf-8"))
    assert twice == [], "docs/CONTRACTS.md says these twice (keep one):\n" + "\n".join(twice)


def test_a_pasted_paragraph_is_caught_also_when_one_copy_grew():
    para = ("The doubles live outside the package, in tests/doubles.py (on the tests' path); the import graph "
            "checks that the package holds none.")
    text = f"{para}\n\n```\nsame line in a code block, same line in a code block, same line\n```\n\n" \
           "```\nsame line in a code block, same line in a code block, same line\n```\n\n" \
           "The doubles live outside the package, in tests/doubles.py (on the tests'\npath).\n"
    assert repeated_sentences(text) == ["The doubles live outside the package, in tests/doubles.py (on the tests' path)"]
    assert repeated_sentences(para) == []
