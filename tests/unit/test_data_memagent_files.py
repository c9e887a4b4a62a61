"""MemAgent parquet and eval_{N}.json: lossless round trips, ReMemR1 extras, named errors."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memrl.data import hotpotqa, memagent_files, twowiki
from memrl.data.io import DataError, detect_kind, iter_records
from memrl.data.longctx import DocPool, build_long_task
from memrl.types import Task

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
TWOWIKI = DATA / "2wikimultihopqa_dev_500.json.xz"
needs_data = pytest.mark.skipif(not HOTPOT.exists() or not TWOWIKI.exists(),
                                reason=f"shared real data not found at {DATA.resolve()}")

MEMAGENT_ROW = {
    "data_source": "hotpotqa",
    "prompt": [{"role": "user", "content": "Who?"}],
    "context": "Document 1:\nA\nB",
    "ability": "memory",
    "reward_model": {"style": "rule", "ground_truth": ["Ann", "Anne"]},
    "extra_info": {"index": 7, "question": "Who?", "num_docs": 200},
}
EVAL_ROW = {"context": "Document 1:\nT\ntext", "input": "Which?", "answers": ["x"], "num_docs": 50, "index": 3}
REMEMR1_ROW = {**EVAL_ROW, "evidence_idx": [0, 4], "min_distance": 4, "type": "bridge", "id": "5a8b"}


def _built_tasks(n_questions: int, num_docs: int) -> list[Task]:
    tasks = hotpotqa.load_hotpotqa(HOTPOT)
    pool = DocPool.from_tasks(tasks)
    return [build_long_task(t, pool, num_docs, 1, i) for i, t in enumerate(tasks[:n_questions])]


def test_eval_rows_round_trip_exactly(tmp_path):
    rows = [EVAL_ROW, REMEMR1_ROW, {**EVAL_ROW, "index": 4, "extra_field": {"a": [1, 2]}}]
    src = tmp_path / "eval_50.json"
    src.write_text(json.dumps(rows))
    assert detect_kind(src) == "eval"
    tasks = memagent_files.load_eval_json(src)
    assert [t.task_id for t in tasks] == ["3", "5a8b", "4"]
    assert tasks[1].meta == {"num_docs": 50, "index": 3, "evidence_idx": [0, 4], "min_distance": 4,
                             "type": "bridge"}
    out = tmp_path / "again.json"
    memagent_files.write_eval_json(out, tasks)
    assert json.loads(out.read_text()) == rows
    assert memagent_files.load_eval_json(out) == tasks


def test_parquet_rows_round_trip_exactly(tmp_path):
    src = tmp_path / "train.parquet"
    memagent_files.write_memagent_parquet(src, [])  # an empty set writes and reads
    pq.write_table(__import__("pyarrow").Table.from_pylist([MEMAGENT_ROW]), src)
    assert detect_kind(src) == "memagent"
    [task] = memagent_files.load_memagent_parquet(src)
    assert task.task_id == "hotpotqa-7" and task.answers == ["Ann", "Anne"] and task.question == "Who?"
    out = tmp_path / "again.parquet"
    memagent_files.write_memagent_parquet(out, [task])
    assert [r for _, r in iter_records(out)] == [MEMAGENT_ROW]


@needs_data
def test_built_eval_set_round_trips_through_both_formats(tmp_path):
    tasks = _built_tasks(20, 50)
    ej, pqf = tmp_path / "eval_50.json", tmp_path / "train.parquet"
    memagent_files.write_eval_json(ej, tasks)
    assert memagent_files.load_eval_json(ej) == tasks
    memagent_files.write_memagent_parquet(pqf, tasks)
    back = memagent_files.load_memagent_parquet(pqf)
    assert [(t.task_id, t.question, t.context, t.answers) for t in back] == \
        [(t.task_id, t.question, t.context, t.answers) for t in tasks]
    for b, t in zip(back, tasks, strict=True):
        assert {k: b.meta[k] for k in t.meta} == t.meta
    # and the written parquet reads back to the same rows when written again
    again = tmp_path / "again.parquet"
    memagent_files.write_memagent_parquet(again, back)
    assert pq.read_table(again).to_pylist() == pq.read_table(pqf).to_pylist()


@needs_data
@pytest.mark.parametrize("loader", [hotpotqa.load_hotpotqa, twowiki.load_twowiki])
def test_source_tasks_round_trip_through_parquet_and_eval_json(tmp_path, loader):
    tasks = loader(HOTPOT if loader is hotpotqa.load_hotpotqa else TWOWIKI)
    ej = tmp_path / "eval.json"
    memagent_files.write_eval_json(ej, tasks)
    assert memagent_files.load_eval_json(ej) == tasks
    pqf = tmp_path / "rows.parquet"
    memagent_files.write_memagent_parquet(pqf, tasks)
    back = memagent_files.load_memagent_parquet(pqf)
    for b, t in zip(back, tasks, strict=True):
        assert (b.task_id, b.question, b.context, b.answers) == (t.task_id, t.question, t.context, t.answers)
        assert {k: b.meta[k] for k in t.meta} == t.meta


@pytest.mark.parametrize(
    "row, field",
    [
        ({k: v for k, v in EVAL_ROW.items() if k != "input"}, "'input'"),
        ({**EVAL_ROW, "answers": []}, "'answers'"),
        ({**EVAL_ROW, "context": None}, "'context'"),
        ({k: v for k, v in EVAL_ROW.items() if k != "index"}, "'index'"),
    ],
)
def test_bad_eval_rows_are_named(tmp_path, row, field):
    p = tmp_path / "eval_50.json"
    p.write_text(json.dumps([EVAL_ROW, row]))
    with pytest.raises(DataError) as e:
        memagent_files.load_eval_json(p)
    assert str(p) in str(e.value) and "row 1" in str(e.value) and field in str(e.value)
    assert len(memagent_files.load_eval_json(p, skip_bad=True)) == 1


def test_bad_parquet_row_is_named(tmp_path):
    import pyarrow as pa

    p = tmp_path / "x.parquet"
    bad = {**MEMAGENT_ROW, "reward_model": {"style": "rule", "ground_truth": []}}
    pq.write_table(pa.Table.from_pylist([MEMAGENT_ROW, bad]), p)
    with pytest.raises(DataError, match=r"row 1: field 'reward_model.ground_truth'"):
        memagent_files.load_memagent_parquet(p)
