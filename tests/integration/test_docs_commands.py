"""The shell blocks the docs mark as tested (a ```bash fence right after a `<!-- tested -->` line, in README.md
and docs/) run as written, at tiny sizes.

Each block runs in a fresh directory holding what a reader brings, our own stand-ins: `$MODEL` a tiny random
model (memrl.models.tiny), `$TRAIN` 4 tasks, `$EVAL` a MemAgent-layout eval file of 4 questions, `$HOTPOT` a
HotpotQA-layout file of 600 made-up questions (also at `data/hotpot_dev_distractor_v1.json`, where `memrl data fetch
--out data` puts the real one), `models/smollm2` the tiny model (the real-model guide's path), `report.txt` a
short document, `$JUDGE_URL` an address nothing listens on (the tiny model never
writes a final answer, so no judge is called), and the prompt files the guides name, in our own wording.
`memrl ...` lines run in this process (memrl.cli.main) with TINY's overrides appended for their command and
workflow (later overrides win); other lines (`cat > FILE <<'EOF'`) run in bash. `$(cat FILE)` is read here.
`memrl data fetch NAME` downloads from a local server this test starts: every entry of memrl.data.fetch.DATASETS
is replaced by a stand-in file it serves (pinned by the stand-in's sha256), the cache is the test's directory,
and `dev-v2.0.json` (the guide's `--file` example) is the SQuAD entry's stand-in.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import subprocess
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data import fetch as F

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MARK = "<!-- tested -->"

_CHUNKED = ["workflow.chunk_tokens=8", "workflow.max_chunks=2", "workflow.max_memory_tokens=8",
            "workflow.max_final_tokens=8"]
_MEMACT = ["workflow.max_assistant_turns=2", "workflow.max_turn_tokens=8"]
_TRAIN = ["model.device=cpu", "model.dtype=float32", "engine=hf", "engine.max_batch_size=8", "trainer.steps=1",
          "trainer.batch_size=2", "algorithm.n=2", "trainer.mini_batches=1", "trainer.mini_batch_ranks=1",
          "trainer.concurrency=8", "trainer.progress=false", "trainer.loggers=[jsonl]"]
_EVAL = ["engine=hf", "engine.max_batch_size=8", "limit=2", "progress=false"]
TINY: dict[tuple[str, str], list[str]] = {
    ("train", "chunked"): _TRAIN + _CHUNKED, ("train", "memact"): _TRAIN + _MEMACT,
    ("eval", "chunked"): _EVAL + _CHUNKED, ("eval", "memact"): _EVAL + _MEMACT,
    ("eval", "full_context"): _EVAL + ["workflow.max_final_tokens=8"],
}
"""The sizes appended to each `memrl train` / `memrl eval` line of a tested block, by workflow."""

_RECALL = "Recalled: {recalled_memory}\n"


def _templates(style: str, recall: bool) -> tuple[str, str]:
    box = "\\boxed{{}}" if style == "str_format" else "\\boxed{}"
    rec = _RECALL if recall else ""
    return (f"Problem: {{prompt}}\n{rec}Memory: {{memory}}\nSection: {{chunk}}\nUpdate the memory.\n",
            f"Problem: {{prompt}}\n{rec}Memory: {{memory}}\nAnswer as {box}:\n")


PROMPT_FILES = {  # the prompt files the guides name -> (style, recall)
    "memagent": ("memrl", False), "memagent_eval": ("str_format", False), "rememr1": ("memrl", True),
    "rememr1_eval": ("str_format", True), "vime": ("str_format", False), "vime_eval": ("str_format", False),
}
CONTEXT = "The Beatles were formed in Liverpool in 1960. Queen was formed in London in 1970. " * 3


def blocks() -> list[tuple[str, str]]:
    """[(where, the block's text)] for every tested block of README.md and docs/."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lines = path.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.strip() == MARK:
                assert i + 1 < len(lines) and lines[i + 1].startswith("```bash"), f"{path}:{i + 1}: {MARK} needs a ```bash fence next"
                end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
                out.append((f"{path.relative_to(ROOT)}:{i + 2}", "\n".join(lines[i + 2:end])))
    return out


def commands(block: str) -> list[str]:
    """The block's commands: continuation lines joined, heredocs kept whole, comment lines dropped."""
    out, lines, i = [], block.splitlines(), 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        while line.endswith("\\"):
            line = line[:-1] + " " + lines[i].strip()
            i += 1
        m = re.search(r"<<\s*'?(\w+)'?", line)
        if m:
            body = []
            while lines[i] != m.group(1):
                body.append(lines[i])
                i += 1
            i += 1
            line = "\n".join([line, *body, m.group(1)])
        out.append(line)
    return out


def expand(command: str, env: dict[str, str], cwd: Path) -> list[str]:
    """shlex words of a memrl command, `$(cat FILE)` and `$VAR` substituted, `*` patterns globbed as bash does."""
    command = re.sub(r"\$\(cat ([^)]+)\)", lambda m: (cwd / m.group(1)).read_text().strip(), command)
    command = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], command)
    words = []
    for w in shlex.split(command, comments=True):
        found = sorted(str(p.relative_to(cwd)) for p in cwd.glob(w)) if "*" in w and "=" not in w else []
        words += found or [w]
    return words


def tiny_sizes(argv: list[str]) -> list[str]:
    """TINY's sizes for the line's command and workflow; on a CPU without bfloat16 instructions also float32
    compute where the line asks for bfloat16 (memrl refuses it there: emulated, slower than float32)."""
    from memrl.precision import cpu_has_bf16

    fp32 = [w.replace("bfloat16", "float32") for w in argv if w.endswith("compute_dtype=bfloat16")]
    extra = [] if cpu_has_bf16() else fp32
    if argv[:1] not in (["train"], ["eval"]) or argv[1:2] == ["report"]:
        return extra
    kind = "memact" if any("memact" in w for w in argv) else "chunked"
    if "workflow=full_context" in argv:
        kind = "full_context"
    return TINY[(argv[0], kind)] + extra


def _hotpot(n: int) -> list[dict]:
    rows = []
    for i in range(n):
        title = f"Place {i}"
        rows.append({"_id": f"h{i}", "question": f"What is the river of {title}?", "answer": f"River {i}",
                     "type": "bridge", "level": "easy", "supporting_facts": [[title, 0]],
                     "context": [[title, [f"{title} lies on River {i}."]], [f"Other {i}", [f"Filler {i}."]]]})
    return rows


@pytest.fixture(scope="module")
def tiny_model() -> str:
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def workspace(tmp: Path, model: str) -> dict[str, str]:
    tasks = [{"task_id": f"q{i}", "question": "Which band was formed in Liverpool?", "context": CONTEXT,
              "answers": ["The Beatles"]} for i in range(4)]
    (tmp / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (tmp / "eval_50.json").write_text(json.dumps([{"index": i, "input": "Which band was formed in Liverpool?",
                                                    "context": CONTEXT, "answers": ["The Beatles"], "num_docs": 50}
                                                   for i in range(4)]))
    (tmp / "hotpot.json").write_text(json.dumps(_hotpot(600)))
    (tmp / "data").mkdir()
    (tmp / "data" / "hotpot_dev_distractor_v1.json").write_text(json.dumps(_hotpot(600)))
    (tmp / "models").mkdir()
    (tmp / "models" / "smollm2").symlink_to(model, target_is_directory=True)
    (tmp / "report.txt").write_text(CONTEXT)
    for name, (style, recall) in PROMPT_FILES.items():
        memory, final = _templates(style, recall)
        (tmp / f"{name}_memory.txt").write_text(memory)
        (tmp / f"{name}_final.txt").write_text(final)
    return {"MODEL": model, "TRAIN": str(tmp / "train.jsonl"), "EVAL": str(tmp / "eval_50.json"),
            "HOTPOT": str(tmp / "hotpot.json"), "JUDGE_URL": "http://127.0.0.1:9/v1"}


@pytest.fixture
def data_server(tmp_path, monkeypatch):
    """Stand-ins for every `memrl data fetch` entry, served from 127.0.0.1 (a free port); {name: bytes}."""
    files: dict[str, bytes] = {}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = files.get(self.path.split("?")[0].lstrip("/"), b"")
            self.send_response(200 if body else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("MEMRL_CACHE", str(tmp_path / "cache"))
    stand_ins = {}
    for name, pin in list(F.DATASETS.items()):
        data = json.dumps(_hotpot(20)).encode() if name.startswith(("hotpot", "2wiki")) else json.dumps({name: 1}).encode()
        stand_ins[name] = data
        if pin.member:
            buf = io.BytesIO()
            with zipfile.ZipFile(buf, "w") as z:
                z.writestr(pin.member, data)
            files[name] = buf.getvalue()
            extra = {"member_sha256": hashlib.sha256(data).hexdigest(), "member_size": len(data)}
        else:
            files[name] = data
            extra = {}
        monkeypatch.setitem(F.DATASETS, name, F.PinnedFile(**{
            **pin.__dict__, **extra, "url": f"http://127.0.0.1:{httpd.server_address[1]}/{name}",
            "filename": pin.target_name(),
            "sha256": hashlib.sha256(files[name]).hexdigest(), "size": len(files[name])}))
    (tmp_path / "dev-v2.0.json").write_bytes(stand_ins["squad_v2_dev"])
    yield stand_ins
    httpd.shutdown()
    httpd.server_close()


BLOCKS = blocks()


def test_the_docs_have_tested_blocks():
    where = {w.split(":")[0] for w, _ in BLOCKS}
    for page in ("README.md", "docs/guides/memagent.md", "docs/guides/rememr1.md", "docs/guides/vime.md",
                 "docs/guides/memact.md"):
        assert page in where, f"{page} has no {MARK} block"


@pytest.mark.parametrize("where, block", BLOCKS, ids=[w for w, _ in BLOCKS])
def test_a_tested_block_runs(where, block, tiny_model, tmp_path, monkeypatch, data_server):
    env = workspace(tmp_path, tiny_model)
    monkeypatch.chdir(tmp_path)
    for command in commands(block):
        if not command.startswith("memrl "):
            r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env={**os.environ, **env},
                               capture_output=True, text=True, timeout=60)
            assert r.returncode == 0, f"{where}: `{command.splitlines()[0]}` failed: {r.stderr.strip()}"
            continue
        argv = expand(command, env, tmp_path)[1:]
        if argv[:1] == ["view"]:
            continue  # a server: tests/integration/test_viewer.py
        argv += tiny_sizes(argv)
        assert main(argv) == 0, f"{where}: `{command}` failed (with {' '.join(tiny_sizes(argv))})"
