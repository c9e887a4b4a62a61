"""JudgeClient against a fake OpenAI-compatible judge on 127.0.0.1 (free port), started and stopped here.

The fake judge answers by the prediction it finds in the rubric prompt, so every path is exercised:
correct / partial / incorrect verdicts, garbage text, HTTP 500, a reply slower than the timeout, an
unreachable server, and a reasoning model's replies (a separate reasoning field, harmony channels, think
blocks, reasoning cut off before the final part). Failures score 0, are counted by kind, and never raise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memrl.rewards.judge import JudgeClient, JudgeResult, JudgeSettings, parse_verdict

PUBLISHED_TAGS = ("<ANSWER_CORRECT>", "<ANSWER_PARTIAL_CORRECT>", "<ANSWER_INCORRECT>")
HARMONY = "<|channel|>analysis<|message|>{a}<|end|><|start|>assistant<|channel|>final<|message|>{f}<|return|>"
REPLIES = {  # prediction -> (status, reply text / message dict / None for a malformed body, delay s)
    "Paris": (200, "CORRECT", 0.0),
    "the city of Paris, France": (200, "Verdict: correct", 0.0),
    "Paris and Lyon": (200, "PARTIALLY CORRECT", 0.0),
    "London": (200, "INCORRECT", 0.0),
    "garbage": (200, "I am not sure what you mean.", 0.0),
    "both": (200, "CORRECT or INCORRECT", 0.0),
    "boom": (500, "internal error", 0.0),
    "slow": (200, "CORRECT", 1.5),
    "nobody": (200, None, 0.0),
    # a reasoning judge (gpt-oss / DeepSeek style), published tags
    "r-field": (200, {"content": "<ANSWER_CORRECT>", "reasoning_content": "not <ANSWER_INCORRECT>?"}, 0.0),
    "r-only": (200, {"content": None, "reasoning": "<ANSWER_CORRECT> so far"}, 0.0),  # budget spent thinking
    "harmony": (200, HARMONY.format(a="<ANSWER_INCORRECT>? no.", f="<ANSWER_CORRECT>"), 0.0),
    "harmony-wrong": (200, HARMONY.format(a="<ANSWER_CORRECT>? no.", f="<ANSWER_INCORRECT>"), 0.0),
    "harmony-cut": (200, "<|channel|>analysis<|message|>looks like <ANSWER_CORRECT> but", 0.0),
    "think": (200, "<think>maybe <ANSWER_CORRECT></think>\n<ANSWER_PARTIAL_CORRECT>", 0.0),
    "two-tags": (200, "<ANSWER_CORRECT> or <ANSWER_INCORRECT>", 0.0),
    "words": (200, "The answer is correct.", 0.0),
}


class FakeJudge:
    def __init__(self) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.bodies.append(body)
                pred = re.search(r"Predicted answer: (.*)\n", body["messages"][0]["content"]).group(1)
                status, text, delay = REPLIES[pred]
                time.sleep(delay)
                if status != 200:
                    data = text.encode()
                elif text is None:
                    data = json.dumps({"choices": []}).encode()
                elif isinstance(text, dict):
                    data = json.dumps({"choices": [{"message": {"role": "assistant", **text}}]}).encode()
                else:
                    data = json.dumps({"choices": [{"message": {"role": "assistant", "content": text}}]}).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def preds(self) -> list[str]:
        return [re.search(r"Predicted answer: (.*)\n", b["messages"][0]["content"]).group(1) for b in self.bodies]

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def judge_server():
    s = FakeJudge()
    yield s
    s.stop()


def run_all(cfg: JudgeSettings, preds: list[str]) -> tuple[list[JudgeResult], JudgeClient]:
    async def go():
        client = JudgeClient(cfg)
        try:
            return await asyncio.gather(*(client.judge("What is the capital of France?", ["Paris"], p)
                                          for p in preds)), client
        finally:
            await client.close()

    return asyncio.run(go())


def test_verdicts_and_failures_score_and_count(judge_server):
    cfg = JudgeSettings(url=judge_server.url, model="judge-m", timeout_s=0.5, retries=1, backoff_s=0.01,
                        max_concurrency=4)
    preds = ["Paris", "the city of Paris, France", "Paris and Lyon", "London", "garbage", "both", "boom",
             "slow", "nobody"]
    results, client = run_all(cfg, preds)
    got = {p: (r.score, r.verdict, r.error) for p, r in zip(preds, results, strict=True)}
    assert got == {
        "Paris": (1.0, "correct", None),
        "the city of Paris, France": (1.0, "correct", None),
        "Paris and Lyon": (0.0, "partial", None),
        "London": (0.0, "incorrect", None),
        "garbage": (0.0, "error", "no_verdict"),
        "both": (0.0, "error", "garbled"),
        "boom": (0.0, "error", "http_error"),
        "slow": (0.0, "error", "timeout"),
        "nobody": (0.0, "error", "garbled"),
    }
    c = client.counters
    assert c["judge_calls"] == 9 and c["judge_error"] == 5
    assert (c["judge_error_no_verdict"], c["judge_error_garbled"], c["judge_error_http_error"],
            c["judge_error_timeout"]) == (1, 2, 1, 1)
    assert (c["judge_correct"], c["judge_partial"], c["judge_incorrect"]) == (2, 1, 1)
    # 500 and timeout are retried once (2 attempts each); verdicts, garbage and bad bodies are not
    assert sorted(judge_server.preds()) == sorted(preds + ["boom", "slow"])
    assert c["judge_retries"] == 2
    body = judge_server.bodies[0]
    assert body["model"] == "judge-m" and body["temperature"] == 0.0 and body["max_tokens"] == 8
    assert "top_p" not in body
    assert "Gold answer(s): Paris\n" in body["messages"][0]["content"]


def test_unreachable_judge_scores_zero_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = JudgeSettings(url=f"http://127.0.0.1:{port}", model="m", timeout_s=1, retries=2, backoff_s=0.01)
    [r], client = run_all(cfg, ["Paris"])
    assert (r.score, r.verdict, r.error) == (0.0, "error", "http_error")
    assert f"http://127.0.0.1:{port}/v1/chat/completions: ConnectError" in r.raw
    assert client.counters["judge_error_http_error"] == 1 and client.counters["judge_retries"] == 2


def test_concurrency_cap(judge_server):
    cfg = JudgeSettings(url=judge_server.url, model="m", timeout_s=5, retries=0, max_concurrency=2)
    inflight, peak = 0, 0

    async def go():
        nonlocal inflight, peak
        client = JudgeClient(cfg)
        post = client._post

        async def watched(body):
            nonlocal inflight, peak
            inflight += 1
            peak = max(peak, inflight)
            try:
                return await post(body)
            finally:
                inflight -= 1

        client._post = watched
        try:
            return await asyncio.gather(*(client.judge("q", ["Paris"], "Paris") for _ in range(8)))
        finally:
            await client.close()

    results = asyncio.run(go())
    assert [r.score for r in results] == [1.0] * 8 and peak == 2


def test_parse_verdict():
    assert parse_verdict("CORRECT") == "correct"
    assert parse_verdict("incorrect.") == "incorrect"
    assert parse_verdict("Partially correct") == "partial"
    assert parse_verdict("<think>correct? incorrect?</think> INCORRECT") == "incorrect"
    assert parse_verdict("uncorrectable") is None
    assert parse_verdict("") is None
    assert parse_verdict("PARTIAL_CORRECT") == "partial"  # not "correct": the tag is a whole token
    assert parse_verdict("<think>CORRECT") is None  # an unclosed think block has no answer yet


PUBLISHED_RUBRIC = """Grade it.
Question: {question}
Standard: {ground_truth}
Predicted answer: {model_answer}
Braces {like_this} stay. Tags: <ANSWER_CORRECT> <ANSWER_PARTIAL_CORRECT> <ANSWER_INCORRECT>
"""


def published_settings(url: str, rubric: str, **kw) -> JudgeSettings:
    """The published judge's numbers (verl/utils/reward_score/mem_agent.py: compute_score): 800 tokens,
    temperature 1.0, no top_p sent, CORRECT only when <ANSWER_CORRECT> is in the final part."""
    return JudgeSettings(url=url, model="gpt-oss", max_tokens=800, temperature=1.0, rubric_file=rubric,
                         correct_tag=PUBLISHED_TAGS[0], partial_tag=PUBLISHED_TAGS[1],
                         incorrect_tag=PUBLISHED_TAGS[2], verdict_rule="contains_correct", **kw)


@pytest.mark.parametrize("rule, expected", [
    # contains_correct (published): the correct tag anywhere in the final part wins; single: one verdict only
    ("contains_correct", {"r-field": (1.0, "correct", None), "r-only": (0.0, "error", "no_verdict"),
                          "harmony": (1.0, "correct", None), "harmony-wrong": (0.0, "incorrect", None),
                          "harmony-cut": (0.0, "error", "no_verdict"), "think": (0.0, "partial", None),
                          "two-tags": (1.0, "correct", None), "words": (0.0, "error", "no_verdict"),
                          "boom": (0.0, "error", "http_error")}),
    ("single", {"r-field": (1.0, "correct", None), "r-only": (0.0, "error", "no_verdict"),
                "harmony": (1.0, "correct", None), "harmony-wrong": (0.0, "incorrect", None),
                "harmony-cut": (0.0, "error", "no_verdict"), "think": (0.0, "partial", None),
                "two-tags": (0.0, "error", "garbled"), "words": (0.0, "error", "no_verdict"),
                "boom": (0.0, "error", "http_error")}),
])
def test_reasoning_judge_with_the_published_settings(judge_server, tmp_path, rule, expected):
    """The verdict is read from the final answer only: never from reasoning_content / reasoning, never from
    harmony's analysis channel or a think block; a reply cut off while reasoning has no verdict."""
    rubric = tmp_path / "rubric.txt"
    rubric.write_text(PUBLISHED_RUBRIC)
    settings = published_settings(judge_server.url, str(rubric), timeout_s=2.0, retries=1, backoff_s=0.01)
    cfg = dataclasses.replace(settings, verdict_rule=rule)
    preds = list(expected)
    results, client = run_all(cfg, preds)
    assert {p: (r.score, r.verdict, r.error) for p, r in zip(preds, results, strict=True)} == expected
    body = judge_server.bodies[0]
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("gpt-oss", 800, 1.0)
    assert "top_p" not in body  # the published call sends none
    prompt = body["messages"][0]["content"]
    assert prompt.startswith("Grade it.\nQuestion: What is the capital of France?\nStandard: Paris\n")
    assert "Braces {like_this} stay." in prompt
    errors = {k: v for k, v in client.counters.items() if k.startswith("judge_error_")}
    want = {f"judge_error_{k}": sum(1 for e in expected.values() if e[2] == k)
            for k in ("no_verdict", "garbled", "http_error") if any(e[2] == k for e in expected.values())}
    assert errors == want


def test_judge_settings_are_checked(tmp_path):
    with pytest.raises(ValueError, match="workflow.judge.on_failure must be one of zero, exclude, got 'skip'"):
        JudgeSettings(on_failure="skip")
    with pytest.raises(ValueError, match="workflow.judge.verdict_rule must be one of"):
        JudgeSettings(verdict_rule="any")
    bad = tmp_path / "r.txt"
    bad.write_text("Question: {question}\nAnswer: {answer}\n")
    with pytest.raises(ValueError, match=r"rubric_file=.*r.txt: no placeholder for gold, prediction"):
        JudgeSettings(rubric_file=str(bad))
    with pytest.raises(ValueError, match="rubric_file=.*missing.txt: cannot be read"):
        JudgeSettings(rubric_file=str(tmp_path / "missing.txt"))
    with pytest.raises(ValueError, match="three different non-empty strings"):
        JudgeSettings(correct_tag="X", partial_tag="x")
    s = JudgeSettings(url="http://127.0.0.1:1", api_key_env="MEMRL_TEST_JUDGE_KEY", top_p=0.9)
    from memrl.config import ConfigError

    with pytest.raises(ConfigError, match="api_key_env=MEMRL_TEST_JUDGE_KEY: that environment variable is not set"):
        JudgeClient(s)
    import os

    os.environ["MEMRL_TEST_JUDGE_KEY"] = "sk-judge"
    try:
        c = JudgeClient(s)
    finally:
        del os.environ["MEMRL_TEST_JUDGE_KEY"]
    assert c.api_key == "sk-judge" and "sk-judge" not in repr(c) and "sk-judge" not in repr(c.config)
    assert c.body("q", ["a"], "p")["top_p"] == 0.9


def test_workflow_judge_overrides_parse_from_the_command_line_spelling(tmp_path):
    from memrl.config import ConfigError, load_config
    from memrl.eval.runner import EvalConfig, workflow_config

    cfg = load_config(EvalConfig, ["workflow=memact", "workflow.judge.url=http://127.0.0.1:9/v1",
                                   "workflow.judge.max_tokens=800", "workflow.judge.temperature=1.0",
                                   "workflow.judge.on_failure=exclude", "workflow.judge.top_p=0.95"])
    _, wf = workflow_config(cfg)
    j = wf.judge
    assert (j.url, j.max_tokens, j.temperature, j.top_p, j.on_failure) == ("http://127.0.0.1:9/v1", 800, 1.0,
                                                                           0.95, "exclude")
    with pytest.raises(ConfigError, match="workflow.judge_url is now spelled workflow.judge.url"):
        workflow_config(load_config(EvalConfig, ["workflow=memact", "workflow.judge_url=http://x"]))


def test_memact_reward_is_the_judges_verdict_when_judge_url_is_set(judge_server):
    """workflow.judge_url: the judge scores the text after FINAL_ANSWER: (the rule reward would say the
    opposite here); a judge failure scores 0 and is counted as judge_error; no judge_url = the rule."""
    from doubles import KeywordRetriever, ScriptedEngine

    from memrl.services.base import Document
    from memrl.tools.search import register_retriever
    from memrl.types import Task
    from memrl.workflows import get_workflow
    from memrl.workflows.memact import MemActConfig, run
    from memrl.workflows.rollouts import apply_score, score_trajectory

    register_retriever("kw_judge", KeywordRetriever([Document("d1", "Paris", "Paris is in France.")]))
    task = Task("t1", "What is the capital of France?", "", ["Lyon"])  # the rule reward says 0 for "Paris"

    def trajectory(reply: str, judge_url: str | None, on_failure: str = "zero"):
        cfg = MemActConfig(retriever_kind="kw_judge", no_prune_prob=0.0, temperature=0.0,
                           judge=JudgeSettings(url=judge_url, model="judge-m", timeout_s=2.0, on_failure=on_failure))
        traj = asyncio.run(run(task, ScriptedEngine([reply]), cfg, random.Random(0)))
        # the score stage: the reward (the judge's verdict) returned as a Score, then applied
        apply_score(traj, asyncio.run(score_trajectory(get_workflow("memact"), task, traj)))
        return traj, traj.reward

    traj, r = trajectory("FINAL_ANSWER: Paris", judge_server.url)
    assert r == 1.0 and traj.info["judge"] == {"score": 1.0, "verdict": "correct", "error": None}
    assert traj.metrics["judge_error"] == 0.0 and traj.metrics["judge_correct"] == 1.0
    traj, r = trajectory("FINAL_ANSWER: London", judge_server.url)
    assert r == 0.0 and traj.info["judge"]["verdict"] == "incorrect"
    traj, r = trajectory("FINAL_ANSWER: boom", judge_server.url)  # HTTP 500 from the judge
    assert r == 0.0 and traj.metrics["judge_error"] == 1.0 and traj.info["judge"]["error"] == "http_error"
    assert {k: v for k, v in traj.metrics.items() if k.startswith("judge_error_")} == {
        "judge_error_http_error": 1.0, "judge_error_timeout": 0.0, "judge_error_no_verdict": 0.0,
        "judge_error_garbled": 0.0}
    assert traj.metrics["judge_excluded"] == 0.0 and "exclude_from_group" not in traj.info
    assert judge_server.preds() == ["Paris", "London"] + ["boom"] * 3  # 2 retries after the first 500
    traj, r = trajectory("FINAL_ANSWER: garbage", judge_server.url, on_failure="exclude")
    assert r == 0.0 and traj.info["judge"]["error"] == "no_verdict"
    assert traj.metrics["judge_excluded"] == 1.0 and traj.info["exclude_from_group"] is True
    traj, r = trajectory("no marker at all", judge_server.url)  # empty final answer: 0, no call
    assert r == 0.0 and traj.info["judge"]["verdict"] == "empty" and traj.metrics["judge_error"] == 0.0
    assert len(judge_server.bodies) == 6
    traj, r = trajectory("FINAL_ANSWER: Paris", None)
    assert r == 0.0 and "judge" not in traj.info and "judge_error" not in traj.metrics


def test_memrl_rubric_asks_for_the_configured_tags():
    """Without rubric_file, memrl's rubric names the tags that will be read: with the published tags (the
    memact_official preset) it asks for them, not for memrl's words, which those tags would never match."""
    from memrl.rewards.judge import RUBRIC

    published = JudgeSettings(url="http://127.0.0.1:9/v1", correct_tag=PUBLISHED_TAGS[0], partial_tag=PUBLISHED_TAGS[1],
                              incorrect_tag=PUBLISHED_TAGS[2], verdict_rule="contains_correct")
    rubric = published.rubric_text()
    assert rubric == RUBRIC.replace("Reply with exactly one word: CORRECT, PARTIAL or INCORRECT.",
                                    "Reply with exactly one of: <ANSWER_CORRECT> (correct), <ANSWER_PARTIAL_CORRECT> "
                                    "(partial) or <ANSWER_INCORRECT> (incorrect).")
    assert rubric != RUBRIC and JudgeSettings(url="http://127.0.0.1:9/v1").rubric_text() == RUBRIC


def test_required_judge_needs_its_url():
    with pytest.raises(ValueError, match=r"^workflow\.judge\.url is required \(workflow\.judge\.required=true"):
        JudgeSettings(required=True)
    assert JudgeSettings(required=True, url="http://127.0.0.1:9/v1").url == "http://127.0.0.1:9/v1"
    assert JudgeSettings().url is None  # not required: no url = the rule reward
