"""The eval harness with a scripted engine: exact metrics, tables, resume, the full-context baseline."""

from __future__ import annotations

import csv
import json
import re
import shutil

import pytest
from doubles import ScriptedEngine

from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.eval.report import TABLE_COLUMNS, load_summaries, report_dirs, summarize, write_report
from memrl.eval.runner import (
    RESULTS_FILE,
    EvalConfig,
    evaluate,
    read_results,
)
from memrl.rewards.qa import qa_metrics
from memrl.types import Task

ANSWERS = ["Paris", "blue whale", "1969", "Ada Lovelace", "yes", "Mount Everest"]


def _tasks(n_docs: int) -> list[Task]:
    out = []
    for i, a in enumerate(ANSWERS):
        ctx = "\n\n".join(f"Document {d + 1}:\nT{d}\n" + ("filler " * 5) for d in range(n_docs))
        out.append(Task(f"q{i}", f"Question number {i}?", ctx, [a],
                        meta={"num_docs": n_docs, "index": i}))
    return out


def _reply(prompt: str, _: int) -> str:
    """Memory calls echo a note; final calls answer right for even questions, partly for q1, wrong else."""
    i = int(re.search(r"Question number (\d+)\?", prompt).group(1))
    if "<section>" in prompt:
        return f"note {i}"
    if i % 2 == 0:
        return f"It is \\boxed{{{ANSWERS[i]}}}."
    if i == 1:
        return "\\boxed{the blue whale species}"
    return "no box here"


@pytest.fixture
def files(tmp_path):
    paths = []
    for n in (2, 4):
        p = tmp_path / "data" / f"eval_{n}.json"
        write_eval_json(p, _tasks(n))
        paths.append(str(p))
    return paths


WF = {"chunk_tokens": 40, "max_memory_tokens": 32, "max_final_tokens": 64}


def _cfg(workflow: str = "memagent", wf: dict | None = None, **kw) -> EvalConfig:
    """An EvalConfig; the workflow section as `memrl eval workflow=<name> workflow.<field>=...` gives it."""
    return EvalConfig(workflow={"name": workflow, **(WF if wf is None else wf)},
                      engine=EngineConfig(model="scripted"), progress=False, concurrency=3, **kw)


def _expected(n: int) -> dict[str, float]:
    preds = [ANSWERS[0], "the blue whale species", ANSWERS[2], "", ANSWERS[4], ""]
    ms = [qa_metrics(p, [a]) for p, a in zip(preds, ANSWERS, strict=True)]
    return {k: 100 * sum(m[k] for m in ms) / len(ms) for k in ("em", "sub_em", "f1")}


def test_rows_and_tables_match_hand_computed(tmp_path, files):
    out = tmp_path / "run"
    rows = evaluate(files, out, _cfg(), engine=ScriptedEngine(_reply))
    assert len(rows) == 12 and len(read_results(out / RESULTS_FILE)) == 12
    r = next(r for r in rows if r["task_id"] == "q1" and r["num_docs"] == 2)
    assert r["prediction"] == "the blue whale species" and r["sub_em"] == 1.0 and r["em"] == 0.0
    assert 0 < r["f1"] < 1 and r["memory_trace"] and all(m == "note 1" for m in r["memory_trace"])
    assert r["model_calls"] == len(r["memory_trace"]) + 1 and r["tokens_read"] == r["context_tokens"] > 0
    sums = summarize(rows, "scripted")
    assert [s.num_docs for s in sums] == [2, 4]
    for s in sums:
        exp = _expected(s.num_docs)
        assert s.em == pytest.approx(exp["em"]) and s.accuracy == pytest.approx(exp["sub_em"])
        assert s.f1 == pytest.approx(exp["f1"]) and s.questions == 6
    files_ = write_report(out, sums)
    with open(files_.csv) as f:
        table = list(csv.DictReader(f))
    assert list(table[0]) == TABLE_COLUMNS
    assert float(table[0]["accuracy"]) == pytest.approx(_expected(2)["sub_em"])
    md = files_.markdown.read_text()
    assert f"| {_expected(2)['sub_em']:.2f} |" in md
    assert files_.png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_skips_done_rows_and_tolerates_a_cut_line(tmp_path, files):
    out = tmp_path / "run"
    full = evaluate(files, out, _cfg(), engine=ScriptedEngine(_reply))
    lines = (out / RESULTS_FILE).read_text().splitlines(keepends=True)
    (out / RESULTS_FILE).write_text("".join(lines[:5]) + lines[5][: len(lines[5]) // 2])
    eng = ScriptedEngine(_reply)
    again = evaluate(files, out, _cfg(), engine=eng)
    assert len(again) == 12 and len(read_results(out / RESULTS_FILE)) == 12
    finals = [c for c in eng.calls if "<section>" not in c.prompt_text]
    assert len(finals) == 7  # only the 7 questions not fully written were re-run
    key = lambda r: (r["num_docs"], r["task_id"])  # noqa: E731
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "started", "finished", "session")}  # noqa: E731
    assert sorted(map(strip, again), key=key) == sorted(map(strip, full), key=key)
    cols = [c for c in TABLE_COLUMNS if c not in ("seconds_per_question", "mean_latency_seconds")]
    a = [{c: getattr(s, c) for c in cols} for s in summarize(full, "r")]
    b = [{c: getattr(s, c) for c in cols} for s in summarize(again, "r")]
    assert a == b
    # a third run has nothing to do
    eng3 = ScriptedEngine(_reply)
    assert len(evaluate(files, out, _cfg(), engine=eng3)) == 12 and not eng3.calls


def test_refuses_to_resume_a_different_run(tmp_path, files):
    out = tmp_path / "run"
    evaluate(files[:1], out, _cfg(limit=1), engine=ScriptedEngine(_reply))
    with pytest.raises(ValueError, match="workflow_config"):
        evaluate(files[:1], out, _cfg(limit=1, wf={**WF, "chunk_tokens": 41}), engine=ScriptedEngine(_reply))


def test_a_record_older_than_a_workflow_field_resumes_at_its_default(tmp_path, files, caplog):
    out = tmp_path / "run"
    evaluate(files[:1], out, _cfg(limit=1), engine=ScriptedEngine(_reply))
    saved = json.loads((out / "eval_config.json").read_text())
    assert saved["workflow_config"]["reward"] == "boxed_em"  # the default
    del saved["workflow_config"]["reward"]  # a directory written before workflow.reward existed
    (out / "eval_config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match=r"\(workflow_config differ"):  # set to another value: another run
        evaluate(files[:1], out, _cfg(limit=1, wf={**WF, "reward": "verl_hotpotqa"}), engine=ScriptedEngine(_reply))
    eng = ScriptedEngine(_reply)
    with caplog.at_level("INFO", logger="memrl.eval.runner"):
        assert len(evaluate(files[:1], out, _cfg(limit=1), engine=eng)) == 1
    assert not eng.calls  # resumed: its row was kept, nothing left to run
    assert any("workflow fields newer than its record, at their defaults: reward" in r.getMessage()
               for r in caplog.records)
    assert json.loads((out / "eval_config.json").read_text())["workflow_config"]["reward"] == "boxed_em"


def test_a_workflow_config_without_usable_defaults_fills_in_nothing():
    from dataclasses import dataclass

    from memrl.eval.runner import _defaults

    @dataclass
    class Required:
        corpus: str

    @dataclass
    class Checked:
        corpus: str = ""

        def __post_init__(self) -> None:
            if not self.corpus:
                raise ValueError("corpus: set it")

    assert _defaults(Required) is None and _defaults(Checked) is None


def test_bad_line_in_the_middle_is_named(tmp_path, caplog):
    p = tmp_path / RESULTS_FILE
    p.write_text('{"task_id": "a", "num_docs": 1}\n{broken\n{"a": 2}\n')
    assert read_results(p) == [{"task_id": "a", "num_docs": 1}]  # counted and named, not fatal
    [msg] = [r.getMessage() for r in caplog.records]
    assert "skipped 2 unreadable lines: line 2 (invalid JSON" in msg and "line 3 (not a result row" in msg


def test_full_context_baseline_truncates_the_middle(tmp_path):
    ctx = "HEAD" + "m" * 500 + "TAIL"
    task = Task("only", "Question number 0?", ctx, ["Paris"], meta={"num_docs": 1, "index": 0})
    write_eval_json(tmp_path / "eval_1.json", [task])
    eng = ScriptedEngine(lambda p, i: "\\boxed{Paris}")
    cfg = _cfg(workflow="full_context", wf={"max_context_tokens": 100})
    [row] = evaluate([str(tmp_path / "eval_1.json")], tmp_path / "fc", cfg, engine=eng)
    [call] = eng.calls
    assert "HEAD" in call.prompt_text and "TAIL" in call.prompt_text and "m" * 101 not in call.prompt_text
    assert "Question number 0?" in call.prompt_text and "\\boxed{}" in call.prompt_text
    assert row["em"] == 1.0 and row["tokens_read"] == 100 and row["context_tokens"] == len(ctx)
    assert row["metrics"]["truncated"] == 1.0 and row["model_calls"] == 1


def test_report_over_several_dirs(tmp_path, files):
    for name in ("a", "b"):
        evaluate(files, tmp_path / name, _cfg(name=f"run-{name}"), engine=ScriptedEngine(_reply))
    shutil.copytree(tmp_path / "a", tmp_path / "a2")
    assert load_summaries(tmp_path / "a")[0].run == "run-a"
    rep = report_dirs([tmp_path / "a", tmp_path / "b"], tmp_path / "cmp")
    md = rep.markdown.read_text()
    assert "run-a" in md and "run-b" in md and rep.png.stat().st_size > 1000
    with open(rep.csv) as f:
        assert len(list(csv.DictReader(f))) == 4
    assert json.loads((tmp_path / "a" / "eval_config.json").read_text())["workflow"] == "memagent"


def test_other_registered_workflows_run_through_the_harness(tmp_path, files):
    from memrl.workflows import workflow_names

    if "rememr1" not in workflow_names():
        pytest.skip("rememr1 workflow not registered in this version")
    rows = evaluate(files, tmp_path / "r1", _cfg(workflow="rememr1"), engine=ScriptedEngine(_reply))
    assert len(rows) == 12 and all(isinstance(r["memory_trace"], list) and r["model_calls"] > 1 for r in rows)
    assert {r["prediction"] for r in rows if r["task_id"] == "q0"} == {"Paris"}


def test_eval_report_command(tmp_path, files, capsys):
    from memrl.cli import main

    evaluate(files, tmp_path / "a", _cfg(name="A"), engine=ScriptedEngine(_reply))
    assert main(["eval", "report", str(tmp_path / "a"), "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert "| A | 2 | 6 |" in out and (tmp_path / "rep" / "accuracy.png").exists()
    assert main(["eval", "--out", str(tmp_path / "x"), str(tmp_path / "missing.json")]) == 1
    assert "does not exist" in capsys.readouterr().err
