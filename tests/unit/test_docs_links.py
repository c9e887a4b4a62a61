"""The README stays one screen of user documentation, and every `docs/...md` path the repository mentions (code,
tests, benchmarks, scripts, the docs themselves) exists, so a moved page cannot leave stale pointers behind.
Links inside docs/ are checked by `mkdocs build --strict` (make test)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC_PATH = re.compile(r"\bdocs/(?:[\w-]+/)*\w[\w.-]*?\.md\b")
SCANNED = ("memrl", "tests", "benchmarks", "scripts", "docs")


def _files() -> list[Path]:
    out = [ROOT / "README.md", ROOT / "Makefile", ROOT / "mkdocs.yml"]
    for d in SCANNED:
        out += [p for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md", ".yaml", ".yml", ".sh", ".txt")]
    return out


def test_readme_is_at_most_250_lines():
    n = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert n <= 250, f"README.md has {n} lines; move detail to docs/ (the site)"


def test_every_mentioned_docs_page_exists():
    missing = []
    for path in _files():
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if "Moved verbatim from" in line:  # a log entry names the page it came from
                continue
            for ref in DOC_PATH.findall(line):
                if not (ROOT / ref).is_file():
                    missing.append(f"{path.relative_to(ROOT)}:{i}: {ref}")
    assert not missing, "pages that do not exist:\n" + "\n".join(missing)


def test_the_docs_cite_nothing_outside_the_repository():
    bad = [f"{p.relative_to(ROOT)}" for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
           if re.search(r"\.\./shared|/work/", p.read_text(encoding="utf-8"))]
    assert not bad, f"docs that cite files outside the repository: {bad}"
