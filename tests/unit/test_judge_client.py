"""JudgeClient against a fake OpenAI-compatible judge on 127.0.0.1 (free port), started and stopped here.

The fake judge answers by the prediction it finds in the rubric prompt, so every path is exercised:
correct / partial / incorrect verdicts, garbage text, HTTP 500, a reply slower than the timeout, and
an unreachable server. Failures score 0, are counted, and never raise.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memrl.rewards.judge import JudgeClient, JudgeConfig, JudgeResult, parse_verdict

REPLIES = {  # prediction -> (status, reply text or None for a malformed body, delay s)
    "Paris": (200, "CORRECT", 0.0),
    "the city of Paris, France": (200, "Verdict: correct", 0.0),
    "Paris and Lyon": (200, "PARTIALLY CORRECT", 0.0),
    "London": (200, "INCORRECT", 0.0),
    "garbage": (200, "I am not sure what you mean.", 0.0),
    "both": (200, "CORRECT or INCORRECT", 0.0),
    "boom": (500, "internal error", 0.0),
    "slow": (200, "CORRECT", 1.5),
    "nobody": (200, None, 0.0),
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


def run_all(cfg: JudgeConfig, preds: list[str]) -> tuple[list[JudgeResult], JudgeClient]:
    async def go():
        client = JudgeClient(cfg)
        try:
            return await asyncio.gather(*(client.judge("What is the capital of France?", ["Paris"], p)
                                          for p in preds)), client
        finally:
            await client.close()

    return asyncio.run(go())


def test_verdicts_and_failures_score_and_count(judge_server):
    cfg = JudgeConfig(base_url=judge_server.url, model="judge-m", timeout_s=0.5, retries=1, backoff_s=0.01,
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
        "garbage": (0.0, "error", "garbled"),
        "both": (0.0, "error", "garbled"),
        "boom": (0.0, "error", "http_status"),
        "slow": (0.0, "error", "timeout"),
        "nobody": (0.0, "error", "bad_response"),
    }
    c = client.counters
    assert c["judge_calls"] == 9 and c["judge_error"] == 5
    assert (c["judge_error_garbled"], c["judge_error_http_status"], c["judge_error_timeout"],
            c["judge_error_bad_response"]) == (2, 1, 1, 1)
    assert (c["judge_correct"], c["judge_partial"], c["judge_incorrect"]) == (2, 1, 1)
    # 500 and timeout are retried once (2 attempts each); verdicts, garbage and bad bodies are not
    assert sorted(judge_server.preds()) == sorted(preds + ["boom", "slow"])
    assert c["judge_retries"] == 2
    body = judge_server.bodies[0]
    assert body["model"] == "judge-m" and body["temperature"] == 0.0 and body["max_tokens"] == 8
    assert "Gold answer(s): Paris\n" in body["messages"][0]["content"]


def test_unreachable_judge_scores_zero_after_retries():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = JudgeConfig(base_url=f"http://127.0.0.1:{port}", model="m", timeout_s=1, retries=2, backoff_s=0.01)
    [r], client = run_all(cfg, ["Paris"])
    assert (r.score, r.verdict, r.error) == (0.0, "error", "unreachable")
    assert f"http://127.0.0.1:{port}/v1/chat/completions: ConnectError" in r.raw
    assert client.counters["judge_error_unreachable"] == 1 and client.counters["judge_retries"] == 2


def test_concurrency_cap(judge_server):
    cfg = JudgeConfig(base_url=judge_server.url, model="m", timeout_s=5, retries=0, max_concurrency=2)
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


def test_memact_reward_is_the_judges_verdict_when_judge_url_is_set(judge_server):
    """workflow.judge_url: the judge scores the text after FINAL_ANSWER: (the rule reward would say the
    opposite here); a judge failure scores 0 and is counted as judge_error; no judge_url = the rule."""
    from memrl.services.base import Document
    from memrl.testing import KeywordRetriever, ScriptedEngine
    from memrl.tools.search import register_retriever
    from memrl.types import Task
    from memrl.workflows.memact import MemActConfig, reward, run

    register_retriever("kw_judge", KeywordRetriever([Document("d1", "Paris", "Paris is in France.")]))
    task = Task("t1", "What is the capital of France?", "", ["Lyon"])  # the rule reward says 0 for "Paris"

    def trajectory(reply: str, judge_url: str | None):
        cfg = MemActConfig(retriever_kind="kw_judge", no_prune_prob=0.0, temperature=0.0, judge_url=judge_url,
                           judge_model="judge-m", judge_timeout_s=2.0)
        traj = asyncio.run(run(task, ScriptedEngine([reply]), cfg, random.Random(0)))
        return traj, reward(task, traj)

    traj, r = trajectory("FINAL_ANSWER: Paris", judge_server.url)
    assert r == 1.0 and traj.info["judge"] == {"score": 1.0, "verdict": "correct", "error": None}
    assert traj.metrics["judge_error"] == 0.0
    traj, r = trajectory("FINAL_ANSWER: London", judge_server.url)
    assert r == 0.0 and traj.info["judge"]["verdict"] == "incorrect"
    traj, r = trajectory("FINAL_ANSWER: boom", judge_server.url)  # HTTP 500 from the judge
    assert r == 0.0 and traj.metrics["judge_error"] == 1.0 and traj.info["judge"]["error"] is not None
    assert judge_server.preds() == ["Paris", "London"] + ["boom"] * 3  # 2 retries after the first 500
    traj, r = trajectory("FINAL_ANSWER: Paris", None)
    assert r == 0.0 and "judge" not in traj.info and "judge_error" not in traj.metrics
