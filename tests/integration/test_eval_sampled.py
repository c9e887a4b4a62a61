"""`memrl eval samples=k`: mean@k / pass@k with standard errors, and the LongBench reader's length buckets."""

from __future__ import annotations

import csv
import hashlib
import json
import math
import re

import pytest
from doubles import ScriptedEngine

from memrl.data.io import detect_kind, load_tasks
from memrl.data.longbench import bucket_of, load_longbench
from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.eval.evaluator import ROW_COLUMNS
from memrl.eval.report import SAMPLED_COLUMNS, TABLE_COLUMNS, summarize, write_report
from memrl.eval.results_file import file_identity
from memrl.eval.runner import EvalConfig, evaluate
from memrl.types import Task

# which samples answer right, per question: q0 always, q1 only sample 2, q2 never
RIGHT = {0: {0, 1, 2, 3}, 1: {2}, 2: set()}


def _cfg(**kw) -> EvalConfig:
    return EvalConfig(workflow={"name": "full_context", "temperature": 1.0}, engine=EngineConfig(model="scripted"),
                      progress=False, concurrency=3, **kw)


def _counting_reply():
    asked: dict[int, int] = {}

    def reply(prompt: str, _: int) -> str:
        i = int(re.search(r"Question number (\d+)\?", prompt).group(1))
        k = asked.get(i, 0)  # samples run one after another: the k-th time q_i is asked is sample k
        asked[i] = k + 1
        return f"\\boxed{{answer{i}}}" if k in RIGHT[i] else "\\boxed{wrong}"

    return reply


def _file(tmp_path):
    tasks = [Task(f"q{i}", f"Question number {i}?", f"Document 1:\nT\nThe answer is answer{i}.", [f"answer{i}"],
                  meta={"num_docs": 1, "index": i}) for i in range(3)]
    write_eval_json(tmp_path / "eval_1.json", tasks)
    return str(tmp_path / "eval_1.json")


def test_mean_and_pass_at_4_with_standard_errors(tmp_path):
    rows = evaluate([_file(tmp_path)], tmp_path / "run", _cfg(samples=4), engine=ScriptedEngine(_counting_reply()))
    assert sorted((r["task_id"], r["sample"], r["sub_em"]) for r in rows)[:5] == [
        ("q0", 0, 1.0), ("q0", 1, 1.0), ("q0", 2, 1.0), ("q0", 3, 1.0), ("q1", 0, 0.0)]
    # the evaluation row's labels (memrl.eval.evaluator.ROW_COLUMNS), as every recipe evaluation's rows:
    # the run's name, sampled (temperature 1), the length, the seed, the file's whole SHA-256 (64 hex digits, as
    # a recipe's rows carry the held-out tasks'); file_sha256, the resume key, stays its first 16
    digest = hashlib.sha256((tmp_path / "eval_1.json").read_bytes()).hexdigest()
    assert {tuple(r[c] for c in ROW_COLUMNS) for r in rows} == {("run", "sampled", 1, 0, digest)}
    assert len(digest) == 64 and {r["file_sha256"] for r in rows} == {digest[:16]}
    assert file_identity(tmp_path / "eval_1.json")["file_sha256"] == digest[:16]
    assert list(rows[0])[:9] == ["task_id", "num_docs", "dataset", "sample", *ROW_COLUMNS]
    [s] = summarize(rows, "r")
    # per question, mean over 4 samples: q0 4/4 = 1, q1 1/4 = 0.25, q2 0 -> mean@4 = 1.25/3 = 41.667%;
    # SE = stdev(n-1) / sqrt(3): deviations 0.58333, -0.16667, -0.41667, squares sum 0.541667, / 2 = 0.270833,
    # / 3 = 0.0902778, sqrt = 0.300463 -> 30.046%
    assert s.samples == 4 and s.questions == 3
    assert s.mean_at_k == pytest.approx(125 / 3) and s.mean_at_k_se == pytest.approx(30.0463, abs=1e-3)
    # pass@4: q0 1, q1 1, q2 0 -> 66.667%; SE: var = (1/9 + 1/9 + 4/9) / 2 = 1/3, / 3 = 1/9, sqrt = 1/3 -> 33.333%
    assert s.pass_at_k == pytest.approx(200 / 3) and s.pass_at_k_se == pytest.approx(100 / 3)
    assert s.accuracy == pytest.approx(100 * 5 / 12)  # over all 12 rows: 5 right
    files = write_report(tmp_path / "rep", [s])
    md = files.markdown.read_text()
    assert "| samples | mean@k ± SE | pass@k ± SE |" in md and "| 4 | 41.67 ± 30.05 | 66.67 ± 33.33 |" in md
    with open(files.csv) as f:
        [row] = list(csv.DictReader(f))
    assert list(row) == TABLE_COLUMNS + list(SAMPLED_COLUMNS)
    assert float(row["pass_at_k_se"]) == pytest.approx(100 / 3) and row["samples"] == "4"
    assert files.png.read_bytes()[:4] == b"\x89PNG"


def test_one_sample_keeps_the_old_table(tmp_path):
    rows = evaluate([_file(tmp_path)], tmp_path / "run", _cfg(), engine=ScriptedEngine(_counting_reply()))
    [s] = summarize(rows, "r")
    assert s.samples == 1 and s.mean_at_k is None and s.questions == 3
    files = write_report(tmp_path / "rep", [s])
    assert "mean@k" not in files.markdown.read_text()
    with open(files.csv) as f:
        assert list(next(csv.DictReader(f))) == TABLE_COLUMNS


def test_sampled_ruler_rows_use_their_task_metric():
    # two samples of one string_match_all question with 4 answers: 0.5 and 0.25 -> mean 0.375, pass 0.5
    base = {"file_sha256": "f", "task_id": "0", "num_docs": 4096, "dataset": "niah_multivalue", "em": 0.0,
            "sub_em": 0.0, "f1": 0.0, "context_tokens": 1, "tokens_read": 1, "generated_tokens": 1, "seconds": 0.1}
    rows = [{**base, "sample": 0, "string_match_all": 0.5}, {**base, "sample": 1, "string_match_all": 0.25}]
    [s] = summarize(rows, "r")
    assert (s.samples, s.mean_at_k, s.pass_at_k, s.mean_at_k_se) == (2, 37.5, 50.0, 0.0)


LB = [  # LongBench rows (THUDM/LongBench data/*.jsonl): input, context, answers, length, dataset, language,
    # all_classes, _id; lengths chosen at the bucket edges: 0-4k, 4-8k, 8k+
    {"input": "Who wrote it?", "context": "A text. Written by Ann.", "answers": ["Ann"], "length": 100,
     "dataset": "hotpotqa_e", "language": "en", "all_classes": None, "_id": "a1"},
    {"input": "Who sang?", "context": "Bo sang.", "answers": ["Bo"], "length": 3999, "dataset": "hotpotqa_e",
     "language": "en", "all_classes": None, "_id": "a2"},
    {"input": "Where?", "context": "In Rome.", "answers": ["Rome"], "length": 4000, "dataset": "hotpotqa_e",
     "language": "en", "all_classes": None, "_id": "a3"},
    {"input": "Which class?", "context": "Sports news.", "answers": ["sports"], "length": 12000,
     "dataset": "trec_e", "language": "en", "all_classes": ["sports", "news"], "_id": "b1"},
]


def test_longbench_rows_load_with_length_buckets(tmp_path):
    p = tmp_path / "longbench_e.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in LB))
    assert detect_kind(p) == "longbench"
    tasks = load_tasks(p)
    assert [t.task_id for t in tasks] == ["a1", "a2", "a3", "b1"]
    assert [(t.meta["length_bucket"], t.meta["length_bucket_name"]) for t in tasks] == [
        (0, "0-4k"), (0, "0-4k"), (4000, "4-8k"), (8000, "8k+")]
    assert tasks[3].meta["all_classes"] == ["sports", "news"] and tasks[3].meta["dataset"] == "trec_e"
    assert tasks[0].question == "Who wrote it?" and tasks[0].context == "A text. Written by Ann."
    assert [t.meta["length_bucket"] for t in load_longbench(p, buckets=(2000,))] == [0, 2000, 2000, 2000]
    assert bucket_of(1500, (1000, 3000)) == (1000, "1-3k")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({**LB[0], "length": "long"}) + "\n")
    with pytest.raises(Exception, match=r"bad.jsonl: row 0: field 'length' must be a non-negative integer"):
        load_tasks(bad, "longbench")

    reply = lambda prompt, _: "\\boxed{Ann}" if "Ann" in prompt else "\\boxed{Rome}"  # noqa: E731
    rows = evaluate([str(p)], tmp_path / "run", _cfg(), engine=ScriptedEngine(reply))
    sums = [(s.dataset, s.num_docs, s.questions, s.accuracy) for s in summarize(rows, "r")]
    # a1 right, a2 wrong (0-4k: 50%); a3 right (4-8k: 100%); b1 wrong (trec_e 8k+: 0%)
    assert sums == [("hotpotqa_e", 0, 2, 50.0), ("hotpotqa_e", 4000, 1, 100.0), ("trec_e", 8000, 1, 0.0)]
    assert not math.isnan(sums[0][3])
    # length_buckets=[5000]: 0-5k holds a1, a2, a3; 5k+ holds b1 (a new bucket layout re-runs nothing:
    # rows are keyed by their N, so this goes to its own --out)
    rows = evaluate([str(p)], tmp_path / "run5", _cfg(length_buckets=[5000]), engine=ScriptedEngine(reply))
    assert [(s.dataset, s.num_docs, s.questions) for s in summarize(rows, "r")] == [
        ("hotpotqa_e", 0, 3), ("trec_e", 5000, 1)]
    with pytest.raises(ValueError, match="length_buckets"):  # the same --out with other buckets: refused
        evaluate([str(p)], tmp_path / "run5", _cfg(length_buckets=[6000]), engine=ScriptedEngine(reply))
    with pytest.raises(ValueError, match="length_buckets must be increasing"):
        _cfg(length_buckets=[8000, 4000])
