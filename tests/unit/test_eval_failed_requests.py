"""`memrl eval`'s published-evaluation input and denominator switches (EvalConfig.failed_requests,
EvalConfig.strip_text), through the real runner with a scripted engine (character tokenizer) whose replies
and failures are written here, so every mean below is counted by hand."""

from __future__ import annotations

import logging

import pytest
from doubles import ScriptedEngine

from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.engines.base import EngineError
from memrl.eval import runner
from memrl.eval.runner import EvalConfig
from memrl.types import Task
from memrl.workflows.rollouts import RolloutError


def script(prompt: str, _: int) -> str:
    """Memory calls write a note; the final call of "number 1" fails at the server (an over-long request),
    "number 2" gets an empty reply, the others the right box."""
    if "<section>" in prompt:
        return "note"
    if "number 1" in prompt:
        raise EngineError("http://server: HTTP 400: the prompt is longer than --max-model-len")
    return "" if "number 2" in prompt else "\\boxed{Ada Lovelace}"


def files(tmp_path):
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task(f"q{i}", f"number {i}", "ctx", ["Ada Lovelace"], meta={"num_docs": 2})
                           for i in range(3)])
    return [str(data)]


def cfg(**kw) -> EvalConfig:
    return EvalConfig(workflow={"name": "memagent", "chunk_tokens": 40}, engine=EngineConfig(model="scripted"),
                      progress=False, **kw)


def test_a_failed_request_stops_the_run_by_default(tmp_path):
    with pytest.raises(RolloutError, match="task q1 .*HTTP 400"):
        runner.evaluate(files(tmp_path), tmp_path / "out", cfg(), engine=ScriptedEngine(script))


def test_drop_leaves_out_failed_requests_and_drop_or_empty_empty_replies_too(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="memrl.eval.runner")
    rows = runner.evaluate(files(tmp_path), tmp_path / "a", cfg(failed_requests="drop"),
                           engine=ScriptedEngine(script))
    # q1 dropped; q0 right (1), q2's empty reply scores 0: sub_em mean (1 + 0) / 2 = 0.5 (not 1/3)
    assert sorted(r["task_id"] for r in rows) == ["q0", "q2"]
    assert sum(r["sub_em"] for r in rows) / len(rows) == 0.5
    assert "question q1 sample 0 dropped (failed_requests=drop): http://server: HTTP 400" in caplog.text
    assert "1 question(s) dropped (failed_requests=drop)" in caplog.text
    caplog.clear()
    rows = runner.evaluate(files(tmp_path), tmp_path / "b", cfg(failed_requests="drop_or_empty"),
                           engine=ScriptedEngine(script))
    # MemAgent's `output == ''`: q1 (failed) and q2 (empty) out; q0 alone: mean 1.0
    assert [r["task_id"] for r in rows] == ["q0"] and rows[0]["sub_em"] == 1.0
    assert "question q2 sample 0 dropped (failed_requests=drop_or_empty): the final reply is empty" in caplog.text
    assert "2 question(s) dropped" in caplog.text
    # a later run into the same --out asks the dropped questions again (they have no row)
    again = ScriptedEngine(script)
    runner.evaluate(files(tmp_path), tmp_path / "b", cfg(failed_requests="drop_or_empty"), engine=again)
    assert any("number 1" in c.prompt_text for c in again.calls)
    assert not any("number 0" in c.prompt_text for c in again.calls)
    with pytest.raises(ValueError, match="failed_requests"):
        cfg(failed_requests="skip")


def test_strip_text_strips_the_question_and_the_context(tmp_path):
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task("q0", "  number 0 \n", "\n ctx  ", ["Ada"], meta={"num_docs": 2})])
    (t,) = runner.load_eval_file(str(data), cfg()).tasks
    assert (t.question, t.context) == ("  number 0 \n", "\n ctx  ")  # memrl: as the file holds them
    (t,) = runner.load_eval_file(str(data), cfg(strip_text=True)).tasks
    assert (t.question, t.context) == ("number 0", "ctx")


def test_validation_during_training_takes_the_same_switches(tmp_path):
    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.step.validation import run_validation

    train = load_config(TrainConfig, ["workflow.name=memagent", "workflow.chunk_tokens=40", f"out_dir={tmp_path}",
                                      f"val.files=[{files(tmp_path)[0]}]", "val.failed_requests=drop_or_empty"])
    got = run_validation(train, tmp_path, 3, engine=ScriptedEngine(script))
    # as memrl eval's drop_or_empty above: q1 (failed) and q2 (empty) left out, q0 right: 1 of 1 answered, 100%
    assert {k: v for k, v in got.items() if k.endswith(("questions", "mean_accuracy"))} == {
        "val/eval_2/2/questions": 1.0, "val/mean_accuracy": 100.0}  # accuracy in percent
    with pytest.raises(RolloutError, match="task q1 .*HTTP 400"):  # val.failed_requests=error, the default
        run_validation(load_config(TrainConfig, ["workflow.name=memagent", "workflow.chunk_tokens=40",
                                                 f"out_dir={tmp_path}", f"val.files=[{files(tmp_path)[0]}]"]),
                       tmp_path, 4, engine=ScriptedEngine(script))
