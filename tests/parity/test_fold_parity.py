"""FoldAgent as its public code runs it (sunnweiwei/FoldAgent agents/fold_agent.py `process_item`,
agents/utils.py `Agent`), against what memrl's fold workflow and foldgrpo estimator give under the
fold_official preset. Every expected value is derived by hand from that code in the comments."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import random

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.algorithms.base import options_kwargs
from memrl.algorithms.fold import foldgrpo_estimator, process_rewards_of
from memrl.config import load_config
from memrl.services.base import Document
from memrl.tools.search import register_retriever
from memrl.training.config import TrainConfig
from memrl.types import Group, Task
from memrl.workflows.fold import FoldConfig
from memrl.workflows.fold import run as fold_run

AGENT = "agents/fold_agent.py"  # sunnweiwei/FoldAgent
UTILS = "agents/utils.py"
TOK = CharTokenizer()
DOCS = [Document("d1", "Paris", "Paris is the capital of France.")]
COMMON = dict(retriever_kind="kw_fold_parity", temperature=0.0, max_turn_tokens=400, system_template="S",
              user_template="{question}|{answer_format}")


def preset(*overrides: str) -> TrainConfig:
    return load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu", *overrides],
                       preset="fold_official")


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


# main t0 opens branch 0; branch t1 searches without a query (an error answer), t2 returns; main t3 calls
# branch again and is refused (max_branches=1, published max_session), t4 searches without a query (an error
# answer in the main thread), t5 answers.
REPLIES = [call("branch", description="France", prompt="Find the capital."), call("search"),
           call("return", message="Paris"), call("branch", description="again", prompt="More."), call("search"),
           "FINAL_ANSWER: Paris"]


def rollout(reward: float, scope: int, over: bool):
    """One trajectory of REPLIES with its outcome reward and the branch's scope verdict; `over`: the main
    thread's unfolded tokens pass 0.5 x the budget (the budget in info set around them)."""
    register_retriever("kw_fold_parity", KeywordRetriever(DOCS))
    traj = asyncio.run(fold_run(Task("t1", "Q", "", ["Paris"]), ScriptedEngine(list(REPLIES)),
                                FoldConfig(**COMMON, max_branches=1), random.Random(0)))
    unfolded = int(traj.metrics["final_context_tokens"]) - traj.info["main_head_tokens"]
    traj.info["context_budget"] = 2 * unfolded - 1 if over else 4 * unfolded
    traj.info["branch_scope"] = [scope]
    traj.reward, traj.trajectory_id = reward, f"r{reward}"
    return traj


def per_turn(seg, q):
    """{turn: Q} read at each turn's first sampled token (a turn's tokens all carry its value)."""
    return {t: q[a] for t, a, _b in seg.info["turn_spans"]}


def test_fold_workflow_records_refused_branch_calls():
    branch, main = rollout(1.0, 1, True).segments
    assert main.info["branch_turns"] == [0] and main.info["branch_call_turns"] == [0, 3]
    assert main.info["error_turns"] == [1, 4] and [s[0] for s in main.info["turn_spans"]] == [0, 3, 4, 5]
    assert [s[0] for s in branch.info["turn_spans"]] == [1, 2]


def test_process_rewards_as_process_item_sets_them():
    opts = preset().algorithm.foldgrpo
    assert (opts.success_only, opts.combine, opts.failure_rows, opts.unfolded_spares) == (
        True, "replace", "branch", "called")
    # success (score[1] > 0), main past 0.5 x the budget, the branch judged in scope (+1):
    # main: bad_turn = turns without "<function=branch>" / finish: t4 only -> -1 (t3's refused branch call is
    #   spared); the tool-error loop runs over `branches` only, so t4's error adds nothing (set_process_reward
    #   sets -1 again); len(agent) == 2: no no_branch term.
    # branch: scope +1 -> +0.2 on range(len(chat) - 1): t1 (t2, the return turn, is the last message); then
    #   the tool-error loop: set_process_reward(i - 1, -1) on t1, which REPLACES +0.2 (utils.py
    #   Agent.set_process_reward writes additional_info[i]["process_reward"] = reward).
    t = rollout(1.0, 1, True)
    branch, main = t.segments
    assert per_turn(main, process_rewards_of(t, main, opts)) == {0: 0.0, 3: 0.0, 4: -1.0, 5: 0.0}
    assert per_turn(branch, process_rewards_of(t, branch, opts)) == {1: -1.0, 2: 0.0}
    # below the threshold: no unfolded term, and the main thread's error turn t4 is not penalised
    t = rollout(1.0, 1, False)
    assert per_turn(t.segments[1], process_rewards_of(t, t.segments[1], opts)) == {0: 0.0, 3: 0.0, 4: 0.0, 5: 0.0}
    # a failed trajectory (score[1] == 0): the `else` branch sets nothing ('[flat,scope]' names neither
    # drop_fail nor reward_scope), so even the in-scope branch gets no +0.2
    t = rollout(0.0, 1, True)
    assert per_turn(t.segments[0], process_rewards_of(t, t.segments[0], opts)) == {1: 0.0, 2: 0.0}
    assert per_turn(t.segments[1], process_rewards_of(t, t.segments[1], opts)) == {0: 0.0, 3: 0.0, 4: 0.0, 5: 0.0}


def test_foldgrpo_advantages_under_the_published_rules():
    opts = preset().algorithm.foldgrpo
    a, b = rollout(1.0, 1, True), rollout(0.0, 1, True)
    (per_group,) = foldgrpo_estimator([Group("t1", [a, b])], **options_kwargs(opts))
    # R = 1, 0: mean 1/2, unbiased std sqrt(1/2); A = (clip(R + Q, 0, 1) - 1/2) / (std + 1e-6)
    hi, lo = 0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)
    (a_branch, a_main), (b_branch, b_main) = per_group
    assert per_turn(a.segments[1], a_main) == pytest.approx({0: hi, 3: hi, 4: lo, 5: hi})
    assert per_turn(a.segments[0], a_branch) == pytest.approx({1: lo, 2: hi})  # clip(1 - 1) = 0 on t1
    assert per_turn(b.segments[0], b_branch) == pytest.approx({1: lo, 2: lo})  # no +0.2 on a failure
    assert per_turn(b.segments[1], b_main) == pytest.approx({0: lo, 3: lo, 4: lo, 5: lo})


def test_each_thread_may_grow_by_the_response_budget_and_a_call_needs_ten_tokens():
    """agents/utils.py `Agent.step`: max_len = prompt_ids_len (the thread's first prompt, the same messages
    for a branch) + response_length; `CallLLM._create_completion`: max_len = min(max_len, prompt_length +
    response_length), max_tokens = min(max_len - len(input_ids), turn_max_new_tokens), and a call with
    max_tokens < 10 is skipped (step returns None: the thread stops)."""
    cfg = preset().workflow
    assert (cfg["response_budget"], cfg["min_call_tokens"], cfg["max_context_tokens"]) == (32768, 10, 40960)
    register_retriever("kw_fold_parity", KeywordRetriever(DOCS))
    replies = [call("search", query="France", topk=1), "FINAL_ANSWER: Paris"]

    def play(**kw):
        engine = ScriptedEngine(list(replies))
        traj = asyncio.run(fold_run(Task("t1", "Q", "", ["Paris"]), engine, FoldConfig(**COMMON, **kw),
                                    random.Random(0)))
        return traj, engine

    _, engine = play()
    head = len(engine.calls[0].prompt_ids) - len(TOK.encode("<assistant>"))  # the first prompt P0
    p0, p1 = (len(c.prompt_ids) for c in engine.calls)
    # budget P0 + R with R = p1 - P0 + 10: call 0 may generate min(400, P0 + R - p0); call 1 exactly 10
    r = p1 - head + 10
    traj, engine = play(response_budget=r, min_call_tokens=10)
    assert [c.sampling.max_tokens for c in engine.calls] == [min(400, head + r - p0), 10]
    # one token less: call 1 has 9 < 10 left and is not made; the trajectory stops on its budget
    traj, engine = play(response_budget=r - 1, min_call_tokens=10)
    assert len(engine.calls) == 1 and traj.info["stop"] == "context_budget"
    # memrl's rule (response_budget 0): a prompt of p1 <= max_context_tokens is sampled in full
    traj, engine = play(max_context_tokens=p1)
    assert [c.sampling.max_tokens for c in engine.calls] == [400, 400] and traj.info["stop"] == "answer"


def test_a_branch_has_its_own_turn_budget():
    """agents/fold_agent.py `process_item` with max_turn = 3: the main loop's iteration 1 samples t0 (a
    branch call); `react(max_turn=3)` lets the branch sample t1, t2 and t3 (its return) whatever the main
    thread used; then `iteration += 3` gives 4 >= 3 and the main loop ends without an answer."""
    assert preset().workflow["branch_turn_budget"] == "own"
    register_retriever("kw_fold_parity", KeywordRetriever(DOCS))
    replies = [call("branch", description="France", prompt="Find it."), call("search", query="France", topk=1),
               call("search", query="capital", topk=1), call("return", message="Paris"), "FINAL_ANSWER: Paris"]

    def play(**kw):
        engine = ScriptedEngine(list(replies))
        traj = asyncio.run(fold_run(Task("t1", "Q", "", ["Paris"]), engine,
                                    FoldConfig(**COMMON, max_assistant_turns=3, **kw), random.Random(0)))
        return traj, engine

    traj, engine = play(branch_turn_budget="own")
    assert len(engine.calls) == 4 and traj.info["stop"] == "max_turns"
    assert traj.info["branches"][0]["end"] == "returned" and traj.info["branches"][0]["returned"] == "Paris"
    # memrl's shared budget: the branch stops after t1, t2 (3 turns in all), unreturned
    traj, engine = play()
    assert len(engine.calls) == 3 and traj.info["branches"][0]["end"] == "max_turns"


def test_a_failed_scope_judgement_counts_out_of_scope(tmp_path):
    """agents/verifier.py `judge_scope`: +1 when the reply holds <good>, 0 for <fine>, else -1; a failed
    call (utils.py `call_openai` returns its "Error after 3 attempts" text) holds neither, so -1."""
    from memrl.rewards.fold import fold_score
    from memrl.rewards.judge import JudgeResult, JudgeSettings
    from memrl.types import Trajectory

    class FailingJudge:
        rubric = ""

        async def judge(self, question, golds, prediction):
            return JudgeResult(0.0, "error", "http_error")

    class Services:
        def judge(self, settings):
            return FailingJudge()

    rubric = tmp_path / "scope.txt"
    rubric.write_text("{question} {gold} {prediction}")
    settings = dataclasses.asdict(JudgeSettings(url="http://judge.invalid/v1", rubric_file=str(rubric)))
    assert preset().workflow["scope_unjudged"] == "out"

    def verdicts(unjudged):
        t = Trajectory("t1", "a", [], final_answer="Paris",
                       info={"branches": [{"prompt": "Find it.", "description": "France", "returned": "Paris"}],
                             "scope_judge": settings, "scope_unjudged": unjudged})
        score = asyncio.run(fold_score(Task("t1", "Q", "", ["Paris"]), t, Services()))
        return score.info["branch_scope"], score.metrics["scope_judge_error"]

    assert verdicts("out") == ([-1], 1.0)
    assert verdicts("none") == ([0], 1.0)  # memrl: no verdict
