"""The viewer shows a fold trajectory's branches (what each was asked, what it searched, what it folded into)
and the main thread, and a summarize trajectory's summary, from a real training dump of those workflows."""

from __future__ import annotations

import asyncio
import json
import random
import shutil

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.services.base import Document
from memrl.tools.search import register_retriever
from memrl.training.config import TrainConfig
from memrl.training.monitor.dump import TrajectoryDump
from memrl.types import Group, Task
from memrl.viewer.server import make_server, serve_in_thread, url_of
from memrl.workflows.fold import FoldConfig
from memrl.workflows.fold import run as fold_run
from memrl.workflows.summarize import SummarizeConfig
from memrl.workflows.summarize import run as summarize_run

pytestmark = pytest.mark.slow


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def _fold_dump(tmp):
    register_retriever("kw_view", KeywordRetriever([Document("d1", "Paris", "Paris is the capital of France.")]))
    r = [call("branch", description="France", prompt="Find the capital of France."), call("search", query="France"),
         call("return", message="Paris"), "FINAL_ANSWER: Paris"]
    cfg = FoldConfig(retriever_kind="kw_view", temperature=0.0, max_turn_tokens=400, system_template="S",
                     user_template="{question}|{answer_format}")
    task = Task("f0", "Capital of France?", "", ["Paris"])
    traj = asyncio.run(fold_run(task, ScriptedEngine(r), cfg, random.Random(0)))
    traj.set_id("f0#0")
    traj.reward = 1.0
    # a summarize trajectory: a search, then (the prompt past 0.75 of the budget) the summary, then the answer
    r2 = [call("search", query="France"), "<summary>Paris is the capital.</summary>", "FINAL_ANSWER: Paris"]
    scfg = SummarizeConfig(retriever_kind="kw_view", temperature=0.0, max_turn_tokens=400, system_template="S",
                           user_template="{question}|{answer_format}", max_context_tokens=1400,
                           summary_fraction=0.75)
    task2 = Task("s0", "Capital of France?", "", ["Paris"])
    summ = asyncio.run(summarize_run(task2, ScriptedEngine(r2), scfg, random.Random(0)))
    assert summ.metrics["summaries"] == 1.0
    summ.set_id("s0#0")
    summ.reward = 1.0
    tc = TrainConfig()
    tc.trainer.dump_every, tc.trainer.dump_trajectories = 1, 4
    out = tmp / "train"
    out.mkdir()
    TrajectoryDump(out, tc.trainer, "fold", CharTokenizer()).write(1, [Group("f0", [traj], task),
                                                                        Group("s0", [summ], task2)])
    return out


def test_fold_branches_in_the_page(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH")
    from playwright.sync_api import sync_playwright

    srv = make_server([str(_fold_dump(tmp_path))], "127.0.0.1", 0)
    serve_in_thread(srv)
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(url_of(srv) + "#run=0&idx=0")
            page.wait_for_selector(".fold.branch")
            branch = page.locator(".fold.branch").inner_text()
            assert "branch 0: france" in branch.lower() and "task: Find the capital of France." in branch
            assert "searched: France" in branch and "folded into: Paris" in branch
            assert page.locator(".fold.main").inner_text().endswith("branches opened at turns 0")
            page.goto(url_of(srv) + "#run=0&idx=1")
            page.wait_for_selector(".fold.summary")
            assert page.locator(".fold.summary").inner_text().endswith("Paris is the capital.")
            assert errors == []
            browser.close()
    finally:
        srv.shutdown()
        srv.server_close()
