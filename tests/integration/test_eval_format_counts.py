"""Format errors and fallbacks (no \\boxed{}, ReMemR1's missing <update>) are counted in the eval summary
table and CSV, and in the training metrics, so a model that emits garbage is visible at a glance."""

from __future__ import annotations

import csv
import re

from doubles import ScriptedEngine

from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.eval.report import summarize, write_report
from memrl.eval.runner import EvalConfig, evaluate
from memrl.types import Task
from memrl.workflows import format_counts

WF = {"name": "memagent", "chunk_tokens": 40, "max_memory_tokens": 32, "max_final_tokens": 64}


def _files(tmp_path) -> list[str]:
    tasks = [Task(f"q{i}", f"Question number {i}?", "Document 1:\nT0\n" + "filler " * 5, ["Paris"],
                  meta={"num_docs": 1, "index": i}) for i in range(4)]
    p = tmp_path / "eval_1.json"
    write_eval_json(p, tasks)
    return [str(p)]


def _reply(prompt: str, _: int) -> str:
    """Memory calls write a note; questions 0 and 1 answer boxed, 2 and 3 unboxed."""
    i = int(re.search(r"Question number (\d+)\?", prompt).group(1))
    if "<section>" in prompt:
        return f"note {i}"
    return "\\boxed{Paris}" if i < 2 else "Paris, I think"


def test_memagent_no_box_in_table_and_csv(tmp_path):
    cfg = EvalConfig(workflow=WF, engine=EngineConfig(model="scripted"), progress=False, concurrency=2)
    rows = evaluate(_files(tmp_path), tmp_path / "run", cfg, engine=ScriptedEngine(_reply))
    [s] = summarize(rows, "A")
    assert (s.no_box, s.format_errors, s.format_detail) == (2, 0, "")
    files = write_report(tmp_path / "run", [s])
    line = files.markdown.read_text().splitlines()[2]
    assert line.startswith("| A | 1 | 4 | 50.00 | 50.00 | 50.00 |") and line.endswith("| 2 | 0 |")
    [row] = list(csv.DictReader(files.csv.open()))
    assert (row["no_box"], row["format_errors"], row["format_detail"]) == ("2", "0", "")


def _row(metrics: dict[str, float] | None) -> dict:
    r = {"num_docs": 8, "em": 0.0, "sub_em": 0.0, "f1": 0.0, "context_tokens": 10, "tokens_read": 10,
         "generated_tokens": 3, "seconds": 1.0}
    if metrics is not None:
        r["metrics"] = metrics
    return r


def test_rememr1_flags_counted_per_question():
    rows = [
        _row({"no_box": 1.0, "missing_update": 0.0}),
        _row({"no_box": 0.0, "missing_update": 2.0, "unclosed_update": 0.0}),
        _row({"no_box": 1.0, "missing_update": 1.0, "unclosed_update": 1.0}),
        _row(None),  # a row written before metrics were recorded
    ]
    [s] = summarize(rows, "R")
    assert (s.no_box, s.format_errors, s.format_detail) == (2, 2, "missing_update=2 unclosed_update=1")
    assert format_counts([r.get("metrics", {}) for r in rows]) == {
        "no_box": 2, "missing_update": 2, "unclosed_update": 1}
