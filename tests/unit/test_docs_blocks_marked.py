"""Every shell block a reader would type, in README.md and docs/guides/, is either run by a test or says why not.

A ```bash fence must follow either `<!-- tested -->` (tests/integration/test_docs_commands.py runs it as
written, at tiny sizes) or `<!-- untested: REASON why -->`, REASON one of UNTESTED_REASONS: a block that
needs a GPU, runs long on a CPU, downloads (the package index, a model), starts or needs a server, needs the
reader's own files (a published checkpoint, a config), or runs a benchmark. A new block without either fails
here, naming its file and line."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNTESTED_REASONS = {
    "gpu": "a published model or vLLM: GPUs",
    "long": "minutes to hours on a CPU (demos over seeds, training runs of many steps)",
    "network": "downloads (pip, the package index, a model fetch)",
    "server": "starts a server (the viewer, ray) or needs one",
    "files": "the reader's own files (a published checkpoint, a corpus, a plugin)",
    "benchmark": "a benchmark script (its own page says what it measured)",
}
UNTESTED = re.compile(r"<!-- untested: (\w+)\b[^>]*-->")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs" / "guides").glob("*.md"))]


def unmarked() -> list[str]:
    out = []
    for path in pages():
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("```bash"):
                continue
            mark = lines[i - 1].strip() if i else ""
            m = UNTESTED.fullmatch(mark)
            if mark == "<!-- tested -->" or (m and m.group(1) in UNTESTED_REASONS):
                continue
            out.append(f"{path.relative_to(ROOT)}:{i + 1}: {mark or '(no mark)'}")
    return out


def test_every_shell_block_is_tested_or_says_why_not():
    assert unmarked() == []


def test_the_check_finds_an_unmarked_block(tmp_path, monkeypatch):
    page = tmp_path / "README.md"
    page.write_text("# x\n\n```bash\nmemrl --version\n```\n\n<!-- untested: maybe -->\n```bash\nmemrl x\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "docs" / "guides").mkdir(parents=True)
    assert unmarked() == ["README.md:3: (no mark)", "README.md:8: <!-- untested: maybe -->"]
