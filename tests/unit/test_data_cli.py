"""`memrl data` commands: build (same seed, same bytes), convert, show, stats, --skip-bad."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data.io import load_tasks

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
needs_data = pytest.mark.skipif(not HOTPOT.exists(), reason=f"shared real data not found at {DATA.resolve()}")


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


@needs_data
def test_build_twice_same_bytes_and_convert(tmp_path, capsys):
    for d in ("a", "b"):
        assert main(["data", "build", "--source", str(HOTPOT), "--out", str(tmp_path / d), "--docs", "50,100",
                     "--num-questions", "16", "--seed", "3"]) == 0
    for n in (50, 100):
        assert _sha(tmp_path / "a" / f"eval_{n}.json") == _sha(tmp_path / "b" / f"eval_{n}.json")
    assert "built 2 sets of 16 questions" in capsys.readouterr().out
    assert main(["data", "convert", str(HOTPOT), str(tmp_path / "hf.jsonl"), "--to", "hf"]) == 0
    assert load_tasks(tmp_path / "hf.jsonl") == load_tasks(HOTPOT)
    assert main(["data", "convert", str(tmp_path / "a" / "eval_50.json"), str(tmp_path / "x.parquet"),
                 "--to", "memagent"]) == 0
    a, b = load_tasks(tmp_path / "a" / "eval_50.json"), load_tasks(tmp_path / "x.parquet")
    assert [(t.task_id, t.context, t.answers) for t in a] == [(t.task_id, t.context, t.answers) for t in b]
    assert main(["data", "show", str(tmp_path / "x.parquet"), "--chars", "20"]) == 0
    assert "Document 1:" in capsys.readouterr().out


def test_skip_bad_on_the_command_line(tmp_path, capsys):
    good = {"_id": "a", "question": "q?", "answer": "x", "supporting_facts": [["T", 0]],
            "context": [["T", ["s."]], ["U", ["u."]]]}
    src = tmp_path / "src.json"
    src.write_text(json.dumps([good, {"_id": "b"}, {**good, "_id": "c"}]))
    assert main(["data", "convert", str(src), str(tmp_path / "o.json")]) == 1
    assert "row 1" in capsys.readouterr().err
    assert main(["data", "convert", str(src), str(tmp_path / "o.json"), "--skip-bad"]) == 0
    assert "skipped 1 malformed" in capsys.readouterr().out
    assert [t.task_id for t in load_tasks(tmp_path / "o.json")] == ["a", "c"]


def test_stats_with_a_real_tokenizer(tmp_path, capsys):
    from memrl.data.memagent_files import write_eval_json
    from memrl.models.tiny import cached_tiny_model
    from memrl.types import Task

    for n in (2, 4):
        write_eval_json(tmp_path / f"eval_{n}.json",
                        [Task(f"q{i}", "?", "word " * (10 * n), ["a"], meta={"num_docs": n, "index": i})
                         for i in range(3)])
    tok = cached_tiny_model("tiny")
    assert main(["data", "stats", "--tokenizer", str(tok), str(tmp_path / "eval_2.json"),
                 str(tmp_path / "eval_4.json")]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("| 2 |") or ln.startswith("| 4 |")]
    assert len(lines) == 2 and "| 3 |" in lines[0]
