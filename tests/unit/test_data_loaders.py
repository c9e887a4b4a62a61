"""HotpotQA / 2Wiki loaders on the real shared data: both layouts give identical tasks; bad rows are named."""

from __future__ import annotations

import json
import logging
import lzma
from pathlib import Path

import pytest

from memrl.data import hotpotqa, twowiki
from memrl.data.io import DataError, ReadStats, detect_kind, load_tasks, write_records

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
TWOWIKI = DATA / "2wikimultihopqa_dev_500.json.xz"
needs_data = pytest.mark.skipif(not HOTPOT.exists() or not TWOWIKI.exists(),
                                reason=f"shared real data not found at {DATA.resolve()}")


@pytest.fixture(scope="module")
def hotpot_tasks():
    return hotpotqa.load_hotpotqa(HOTPOT)


@pytest.fixture(scope="module")
def twowiki_tasks():
    return twowiki.load_twowiki(TWOWIKI)


@needs_data
@pytest.mark.parametrize("ext", ["json", "jsonl", "parquet"])
def test_hotpotqa_hf_layout_gives_identical_tasks(tmp_path, hotpot_tasks, ext):
    assert len(hotpot_tasks) == 1143
    path = tmp_path / f"hotpot_hf.{ext}"
    write_records(path, [hotpotqa.to_hf_record(t) for t in hotpot_tasks])
    assert detect_kind(path) == "hotpotqa"
    again = hotpotqa.load_hotpotqa(path)
    assert again == hotpot_tasks


@needs_data
@pytest.mark.parametrize("ext", ["json", "jsonl", "parquet"])
def test_twowiki_hf_layout_gives_identical_tasks(tmp_path, twowiki_tasks, ext):
    assert len(twowiki_tasks) == 500
    path = tmp_path / f"twowiki_hf.{ext}"
    write_records(path, [twowiki.to_hf_record(t) for t in twowiki_tasks])
    assert detect_kind(path) == "2wiki"
    assert twowiki.load_twowiki(path) == twowiki_tasks


@needs_data
def test_original_layout_round_trip_is_exact(hotpot_tasks, twowiki_tasks):
    raw_h = json.loads(lzma.open(HOTPOT).read())
    raw_w = json.loads(lzma.open(TWOWIKI).read())
    assert [hotpotqa.to_original_record(t) for t in hotpot_tasks] == raw_h
    assert [twowiki.to_original_record(t) for t in twowiki_tasks] == raw_w


@needs_data
def test_task_fields(hotpot_tasks, twowiki_tasks):
    t = hotpot_tasks[0]
    assert t.task_id == "5a8b57f25542995d1e6f1371" and t.answers == ["yes"]
    assert t.meta["type"] == "comparison" and t.meta["level"] == "hard"
    assert t.meta["supporting_facts"] == [["Scott Derrickson", 0], ["Ed Wood", 0]]
    assert t.context.startswith("Document 1:\nEd Wood (film)\nEd Wood is a 1994")
    assert t.context.count("Document ") >= len(t.meta["paragraphs"])
    assert hotpotqa.gold_titles(t) == ["Scott Derrickson", "Ed Wood"]
    w = twowiki_tasks[0]
    assert w.meta["answer_id"] == "Q36647" and w.meta["evidences"][0][1] == "father"


@needs_data
def test_twowiki_supporting_facts_past_paragraph_end_are_kept(twowiki_tasks):
    by_id = {t.task_id: t for t in twowiki_tasks}
    t = by_id["c049b0240bdd11eba7f7acde48001122"]
    assert ["Mario Bava", 13] in t.meta["supporting_facts"]
    assert "Mario Bava" in hotpotqa.gold_titles(t)
    assert hotpotqa.gold_paragraph_indices(t)  # the paragraph itself is still found by title


def _write(tmp_path: Path, rows: list) -> Path:
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(rows))
    return p


GOOD = {"_id": "a", "question": "q?", "answer": "x", "type": "bridge", "level": "hard",
        "supporting_facts": [["T", 0]], "context": [["T", ["s0.", " s1."]]]}


@pytest.mark.parametrize(
    "bad, field",
    [
        ({k: v for k, v in GOOD.items() if k != "question"}, "question"),
        ({**GOOD, "answer": 3}, "answer"),
        ({**GOOD, "context": [["T"]]}, "context[0]"),
        ({**GOOD, "context": [["T", "not a list"]]}, "sentences"),
        ({**GOOD, "supporting_facts": [["T", "zero"]]}, "supporting_facts[0]"),
        ({**GOOD, "_id": ""}, "_id"),
        ("just a string", "object"),
    ],
)
def test_malformed_row_names_file_row_and_field(tmp_path, bad, field):
    p = _write(tmp_path, [GOOD, {**GOOD, "_id": "b"}, bad])
    with pytest.raises(DataError) as e:
        hotpotqa.load_hotpotqa(p)
    msg = str(e.value)
    assert str(p) in msg and "row 2" in msg and field in msg


def test_skip_bad_counts_and_logs(tmp_path, caplog):
    p = _write(tmp_path, [GOOD, {**GOOD, "answer": None}, {**GOOD, "_id": "c"}, {"x": 1}])
    st = ReadStats(str(p))
    with caplog.at_level(logging.WARNING):
        tasks = hotpotqa.load_hotpotqa(p, skip_bad=True, stats=st)
    assert [t.task_id for t in tasks] == ["a", "c"]
    assert st.rows == 4 and st.skipped == 2
    assert "skipped 2 of 4" in caplog.text and "row 1" in caplog.text


def test_jsonl_bad_line_is_named(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps(GOOD) + "\n{not json\n")
    with pytest.raises(DataError, match=r"row 1 \(line 2\) is not valid JSON"):
        load_tasks(p, "hotpotqa")
    assert len(load_tasks(p, "hotpotqa", skip_bad=True)) == 1


def test_unknown_file_type_and_kind(tmp_path):
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="unknown data file type"):
        load_tasks(tmp_path / "x.csv", "hotpotqa")
    p = _write(tmp_path, [{"foo": 1}])
    with pytest.raises(DataError, match="cannot tell which dataset"):
        detect_kind(p)


def test_task_layout_is_detected_and_read_by_load_tasks(tmp_path):
    """memrl's own Task rows (data.tasks_jsonl) load through the generic loader the trainer uses."""
    from memrl.data.tasks_jsonl import write_tasks
    from memrl.types import Task

    tasks = [Task(task_id="t0", question="q0?", context="", answers=["a", "b"],
                  meta={"sub_questions": ["x?", "y?"], "sub_answers": [["a"], ["b"]]}),
             Task(task_id="t1", question="q1?", context="ctx", answers=["c"], meta={})]
    p = tmp_path / "tasks.jsonl"
    assert write_tasks(p, tasks) == 2
    assert detect_kind(p) == "tasks"
    assert load_tasks(p) == tasks
    p.write_text(p.read_text().replace('"sub_answers": [["a"], ["b"]]', '"sub_answers": [["a"]]'))
    with pytest.raises(DataError, match=r"tasks.jsonl: row 0: meta.sub_answers has 1 entries, answers has 2"):
        load_tasks(p)
