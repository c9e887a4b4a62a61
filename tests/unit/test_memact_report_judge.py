"""The MemAct eval table counts failed LLM judgements (workflow.judge): one per question whose judge call
failed, whatever the kind, summed over the run's rows (memrl.workflows.memact_report.summarize_memact)."""

from __future__ import annotations

from memrl.workflows.memact_report import memact_markdown, summarize_memact


def _row(correct: int, **judge: float) -> dict:
    return {"metrics": {"multiq_questions": 2.0, "multiq_correct": float(correct), "multiq_all_correct":
                        float(correct == 2), "multiq_f1_mean": correct / 2, **judge}}


def test_judge_errors_column_counts_failed_judgements():
    rows = [
        _row(2, judge_error=0.0, judge_correct=1.0),
        _row(1, judge_error=1.0, judge_error_timeout=1.0),  # the judge timed out: scored 0, counted
        _row(0, judge_error=1.0, judge_error_no_verdict=1.0),  # a reasoning reply without a final part
        _row(2),  # a run without a judge writes no judge keys: counts 0
    ]
    s = summarize_memact(rows, "run")
    # by hand: 1 + 1 failed judgements; accuracy 2 of 4 questions all right; sub-questions 5 of 8
    assert (s.judge_errors, s.questions, s.accuracy, s.subq_accuracy) == (2, 4, 50.0, 62.5)
    table = memact_markdown([s]).splitlines()
    assert table[0].endswith("| prune withheld | judge errors |")
    assert table[2].endswith("| 0.00 | 2 |")
