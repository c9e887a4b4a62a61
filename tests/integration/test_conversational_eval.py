"""`memrl eval` over the LoCoMo and LongMemEval fixtures with a tiny local model: MemAgent with LongMemEval's judge
(a fake OpenAI-compatible judge on 127.0.0.1, free port, started and stopped here), ReMemR1 and full context.

Checked: rows carry the question type and the benchmark scores recomputed from their predictions; only
LongMemEval answers go to the judge, each with the prompt of its question type, the question as written
(without the date prefix) and the gold answer; a failing judge call scores 0 and is counted; summary.md has
the by-question-type table and by_type.csv matches the rows.
"""

from __future__ import annotations

import csv
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data.io import load_tasks
from memrl.eval.runner import RESULTS_FILE, read_results
from memrl.rewards.eval_metrics import metric_value

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[1] / "data" / "conversational"
LOCOMO = DATA / "locomo_tiny.json"
LME = DATA / "longmemeval_s_tiny.json"
SMALL = ["workflow.chunk_tokens=128", "workflow.max_chunks=2", "workflow.max_memory_tokens=4",
         "workflow.max_final_tokens=6", "engine.max_batch_size=1", "concurrency=4", "extract=raw"]


class FakeJudge:
    """Answers "Yes" to the abstention and temporal prompts, HTTP 500 to the pets question, "No" otherwise;
    keeps every prompt it was sent."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                judge.prompts.append(prompt)
                if "How many pets" in prompt:
                    self.send_response(500)
                    self.end_headers()
                    return
                yes = "cannot be answered" in prompt or "off by one" in prompt
                data = json.dumps({"choices": [{"message": {"content": "Yes" if yes else "No"}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def model():
    from memrl.models.tiny import cached_tiny_model

    return cached_tiny_model("tiny")


@pytest.fixture(scope="module")
def judged_run(model, tmp_path_factory):
    judge = FakeJudge()
    out = tmp_path_factory.mktemp("conv") / "memagent"
    try:
        rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", "--name", "memagent",
                   str(LOCOMO), str(LME), *SMALL, f"judge.url={judge.url}", "judge.model=fake", "judge.retries=0"])
    finally:
        judge.close()
    assert rc == 0
    return out, judge.prompts


def test_rows_carry_types_and_recomputable_scores(judged_run):
    out, _ = judged_run
    rows = {r["task_id"]: r for r in read_results(out / RESULTS_FILE)}
    tasks = {t.task_id: t for t in [*load_tasks(LOCOMO), *load_tasks(LME)]}
    assert set(rows) == set(tasks)
    for tid, r in rows.items():
        t = tasks[tid]
        assert r["question_type"] == t.meta["question_type"] and r["dataset"] == t.meta["dataset"]
        assert r.get("abstention", False) is t.meta.get("abstention", False)
        name = t.meta["metric"]
        assert r[name] == metric_value(name, r["prediction"], t.answers, t.meta)
        other = "longmemeval_rule" if name == "locomo_f1" else "locomo_f1"
        assert other not in r
        assert ("longmemeval_judge" in r) is (t.meta["dataset"] == "longmemeval_s")


def test_only_longmemeval_answers_are_judged_with_their_prompt(judged_run):
    out, prompts = judged_run
    rows = {r["task_id"]: r for r in read_results(out / RESULTS_FILE) if r["dataset"] == "longmemeval_s"}
    sent = {tid for tid, r in rows.items() if r["prediction"].strip()}
    assert len(prompts) == len(sent) >= 3  # one call per non-empty answer; the LoCoMo ones are never sent
    tasks = {t.task_id: t for t in load_tasks(LME)}
    marks = {"answer": "works all the way to it", "temporal": "off by one", "update": "latest",
             "preference": "personalised", "abstention": "cannot be answered"}
    kinds = {"q_ssu_1": "answer", "q_tr_2": "temporal", "q_ku_3_abs": "abstention", "q_pref_4": "preference",
             "q_ms_5": "answer"}
    for tid in sent:
        t = tasks[tid]
        [p] = [p for p in prompts if f"Question: {t.meta['question']}\n" in p or f"Request: {t.meta['question']}\n" in p]
        assert marks[kinds[tid]] in p and t.answers[0] in p and rows[tid]["prediction"] in p
        assert "(Current date:" not in p  # the judge sees the question as written
    expected = {"q_ssu_1": 0.0, "q_tr_2": 1.0, "q_ku_3_abs": 1.0, "q_pref_4": 0.0, "q_ms_5": 0.0}
    for tid, r in rows.items():
        assert r["longmemeval_judge"] == (expected[tid] if tid in sent else 0.0)
    if "q_ms_5" in sent:  # the judge failed on it: scored 0, counted by kind
        assert rows["q_ms_5"]["metrics"]["judge_error"] == 1.0
        assert rows["q_ms_5"]["metrics"]["judge_error_http_error"] == 1.0
    config = json.loads((out / "eval_config.json").read_text())
    assert config["scoring"]["judge"]["url"].startswith("http://127.0.0.1:")


def test_by_type_table_matches_the_rows(judged_run):
    out, _ = judged_run
    md = (out / "summary.md").read_text()
    assert "### By question type" in md
    assert "| memagent | longmemeval_s | temporal-reasoning | 1 |" in md
    assert "| memagent | locomo | adversarial | 1 |" in md
    rows = read_results(out / RESULTS_FILE)
    with open(out / "by_type.csv") as f:
        lines = {(r["dataset"], r["question_type"]): r for r in csv.DictReader(f)}
    loc = [r for r in rows if r["dataset"] == "locomo"]
    assert int(lines[("locomo", "temporal")]["questions"]) == 2
    assert float(lines[("locomo", "all")]["locomo_f1"]) == pytest.approx(100 * sum(r["locomo_f1"] for r in loc) / 6)
    assert lines[("locomo", "all")]["longmemeval_judge"] == ""
    lm = [r for r in rows if r["dataset"] == "longmemeval_s"]
    assert int(lines[("longmemeval_s", "abstention")]["questions"]) == 1
    per_type = [r["longmemeval_judge"] for r in lm]  # one question per type: the type mean is the row mean
    assert float(lines[("longmemeval_s", "mean of types")]["longmemeval_judge"]) == pytest.approx(
        100 * sum(per_type) / 5)
    assert float(lines[("longmemeval_s", "abstention")]["longmemeval_rule"]) == pytest.approx(
        100 * next(r["longmemeval_rule"] for r in lm if r["task_id"] == "q_ku_3_abs"))


@pytest.mark.parametrize("workflow", ["rememr1", "full_context"])
def test_other_workflows_give_the_by_type_table(model, tmp_path, workflow):
    extra = ["workflow.max_context_tokens=512", "workflow.max_final_tokens=6"] if workflow == "full_context" else SMALL
    if workflow == "full_context":
        extra += ["engine.max_batch_size=1", "concurrency=4", "extract=raw"]
    out = tmp_path / workflow
    rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", str(LOCOMO), str(LME),
               f"workflow={workflow}", *extra])
    assert rc == 0
    md = (out / "summary.md").read_text()
    assert "### By question type" in md and "| locomo | single-hop | 1 |" in md
    assert "| longmemeval_s | abstention | 1 |" in md and "longmemeval_judge" not in md  # no judge.url: no judge


def test_judge_setting_mistakes_are_one_line_before_any_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MEMRL_TEST_NO_SUCH_KEY", raising=False)
    base = ["eval", "--model", str(tmp_path / "no_model"), "--out", str(tmp_path / "out"), str(LME),
            "judge.url=http://127.0.0.1:9/v1", "judge.model=fake"]
    assert main([*base, "judge.api_key_env=MEMRL_TEST_NO_SUCH_KEY"]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "judge.api_key_env=MEMRL_TEST_NO_SUCH_KEY: that environment variable is not set" in err
    (tmp_path / "prompts").mkdir()
    assert main([*base, f"judge.prompts_dir={tmp_path / 'prompts'}"]) != 0
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "missing answer.txt, temporal.txt, update.txt, preference.txt, abstention.txt" in err
