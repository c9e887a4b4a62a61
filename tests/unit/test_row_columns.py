"""A workflow declares its own evaluation-row columns (WorkflowSpec.row_columns); memrl.eval.runner names none."""

from __future__ import annotations

from pathlib import Path

from memrl.eval.runner import result_row
from memrl.types import Segment, Task, Trajectory
from memrl.workflows import get_workflow

MULTIQ = {"multiq_questions": 2.0, "multiq_correct": 1.0, "multiq_all_correct": 0.0, "multiq_subq_accuracy": 0.5,
          "multiq_f1_mean": 0.75, "generated_tokens": 9.0}
STANDARD = ["task_id", "num_docs", "dataset", "sample", "file", "question", "answers", "prediction", "answer_text",
            "memory_trace", "em", "sub_em", "f1", "tokens_read", "context_tokens", "generated_tokens", "model_calls"]
TAIL = ["reward", "seconds", "started", "finished", "session", "metrics", "steps"]


def _row(metrics: dict[str, float], workflow: str | None, extract: str = "raw") -> dict:
    segs = [Segment([1, 2], list(range(n)), [0.0] * n, info={"kind": "final"}) for n in (3, 4)]
    traj = Trajectory("q1", "", segs, final_answer="Paris; Rome", metrics=dict(metrics),
                      info={"answer_text": r"the answer is \boxed{Paris}", "memories": []})
    cols = get_workflow(workflow).row_columns if workflow else None
    return result_row(Task("q1", "a? b?", "", ["Paris", "Rome"]), traj, 4, "f.jsonl", 0.0, 1.0, extract=extract,
                      row_columns=cols)


def test_multi_question_workflows_score_their_own_rows():
    for workflow in ("memact", "mem1", "fold", "summarize", "sliding_window"):
        r = _row(MULTIQ, workflow)
        # its own final answer (not the raw text), em = sub_em = all sub-questions right (no), f1 = the mean
        # sub-question F1, generated tokens its own count (9, not the segments' 3 + 4)
        assert (r["prediction"], r["em"], r["sub_em"], r["f1"], r["generated_tokens"]) == ("Paris; Rome", 0.0, 0.0,
                                                                                          0.75, 9), workflow
        assert list(r) == STANDARD + TAIL


def test_infmem_adds_its_decided_actions_after_model_calls():
    r = _row({"retrievals": 2.0, "stopped": 1.0, "stop_step": 3.0}, "infmem")
    assert list(r) == STANDARD + ["retrievals", "stopped", "stop_step"] + TAIL
    assert (r["retrievals"], r["stopped"], r["stop_step"], r["generated_tokens"]) == (2.0, 1.0, 3.0, 7)
    # raw extraction scores the whole final text against both answers: "Paris" is a sub-string, not an exact match
    assert (r["prediction"], r["em"], r["sub_em"]) == (r"the answer is \boxed{Paris}", 0.0, 1.0)


def test_a_workflow_without_row_columns_gets_the_standard_row():
    r = _row(MULTIQ, "memagent", extract="boxed")
    assert list(r) == STANDARD + TAIL
    # the multiq_* metrics are ignored: "Paris; Rome" against "Paris" / "Rome" by memrl.rewards.qa: no exact match,
    # a gold inside it, F1 2/3 (precision 1/2, recall 1); generated tokens the segments' 3 + 4
    assert (r["prediction"], r["em"], r["sub_em"], r["generated_tokens"]) == ("Paris; Rome", 0.0, 1.0, 7)
    assert abs(r["f1"] - 2 / 3) < 1e-12


def test_the_runner_names_no_workflows_metric():
    text = (Path(__file__).resolve().parents[2] / "memrl" / "eval" / "runner.py").read_text(encoding="utf-8")
    assert [w for w in ("multiq", "stop_step", "retrievals", "MemAct", "InfMem") if w in text] == []
