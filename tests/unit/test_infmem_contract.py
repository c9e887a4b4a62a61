"""Contract tests: the InfMem workflow against a scripted engine with a character tokenizer (one token per
character), so chunks, passages, prompts and the retrieval scores can be written out by hand."""

from __future__ import annotations

import asyncio
import math
import random

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.rewards import early_stop as rw
from memrl.services.in_document import DocumentRetriever, OkapiBM25, Passage, cut_passages
from memrl.types import Task
from memrl.workflows import get_workflow, parse_workflow
from memrl.workflows.infmem import InfMemConfig, parse_plan, reward, run, step_rewards

PLAN = "P:{problem}|H:{history}|M:{memory}"
MEM = "P:{problem}|H:{history}|R:{retrieved}|C:{chunk}|M:{memory}"
FIN = "P:{problem}|M:{memory}|answer:"
CALL = '<tool_call>{"name": "retrieve", "arguments": {"query": "xq", "top_k": 2}}</tool_call>'


def cfg(**kw) -> InfMemConfig:
    base = dict(chunk_tokens=4, retrieve_passage_tokens=4, max_memory_tokens=30, max_final_tokens=30,
                max_plan_tokens=200, temperature=0.0, plan_template=PLAN, memory_template=MEM, final_template=FIN,
                plan_history_header="{step}/{max_steps}", memory_history_header="s{step}/{max_steps}",
                history_line="{i}:{query}:{top_k}", retrieved_item="#{rank}={text}", no_retrieval_text="none",
                retrieval_scorer="okapi")
    base.update(kw)
    return InfMemConfig(**base)


def user(text: str) -> str:
    return f"<user>{text}</user><assistant>"


def run_one(task: Task, engine: ScriptedEngine, c: InfMemConfig):
    return asyncio.run(run(task, engine, c, random.Random(0)))


def test_retrieve_write_stop_exact_prompts_and_rewards():
    # context "xy zz xq ww"... cut to 11 chars: chunks (= passages, 4 tokens) "xy z", "z xq", " ww"
    task = Task("t1", "Q?", "xy zz xq ww"[:4] + "z xq ww", ["X"])
    assert task.context == "xy zz xq ww"
    engine = ScriptedEngine([CALL, "m1", "nothing to do", "m2 X", "STOP", r"so \boxed{X}"])
    traj = run_one(task, engine, cfg())
    prompts = [c.prompt_text for c in engine.calls]
    # okapi over words: only passage 1 ("z xq") holds "xq"; top_k 2 = it, then passage 0 (zero score, doc order)
    assert prompts == [
        user("P:Q?|H:0/3|M:No previous memory"),
        user("P:Q?|H:s1/3\n1:xq:2|R:#1=z xq\n\n#2=xy z|C:xy z|M:No previous memory"),
        user("P:Q?|H:1/3\n1:xq:2|M:m1"),
        user("P:Q?|H:s2/3\n1:xq:2|R:none|C:z xq|M:m1"),  # no call this step: nothing retrieved
        user("P:Q?|H:2/3\n1:xq:2|M:m2 X"),
        user("P:Q?|M:m2 X|answer:"),
    ]
    assert [s.info["kind"] for s in traj.segments] == ["plan", "memory", "plan", "memory", "plan", "final"]
    assert [s.info.get("action") for s in traj.segments[::2]] == ["retrieve", "none", "stop"]
    # plan t -> 2t, memory t -> 2t + 1, final -> 2 x 3 chunks, also after a stop
    assert [s.step for s in traj.segments] == [0, 1, 2, 3, 4, 6]
    assert traj.segments[0].info["retrievals"] == [{"query": "xq", "top_k": 2, "well_formed": True}]
    tok = CharTokenizer()
    assert traj.segments[0].response_ids == tok.encode(CALL) + [tok.eos_token_id]  # token in, token out
    assert traj.final_answer == "X"
    m = traj.metrics
    # 6 model calls where MemAgent makes 4 (3 chunks + final); the stop saved reading chunk 3
    assert (m["model_calls"], m["retrievals"], m["stopped"], m["stop_step"], m["tokens_read"]) == (6, 1, 1, 2, 8)
    # answer first in memory 1 (step 1), stop at step 2: d = 1 -> 0.6^0 = 1; outcome 1; protocol 1 + 1
    score = reward(task, traj)
    assert score.metrics == {"infmem_outcome": 1.0, "infmem_early_stop": 1.0, "infmem_calls_ok": 1.0,
                             "infmem_memories_ok": 1.0}
    assert score.reward == pytest.approx(0.6 * 1 + 0.6 * 1 + 0.5 + 0.5)
    # step rewards: plans none; memory gains 0 ("m1"), 1 ("m2 X" holds X); the final's one box: 1
    assert step_rewards(task, traj) == [None, 0.0, None, 1.0, None, 1.0]


def test_published_switches_qwen_agent_calls_after_think_open_user():
    c = cfg(call_format="qwen_agent", require_top_k=True, memory_write="after_think", planner_frame="open_user",
            max_steps_count="floor", first_step_rule="published", retrieval_scorer="okapi_published",
            tool_name="retrievesearch")
    task = Task("t2", "Q?", "abcdefghij", ["X"])  # chunks abcd / efgh / ij; floor(10 / 4) = 2 steps shown
    bad_call = "\u273fFUNCTION\u273f: retrievesearch\n\u273fARGS\u273f: {\"query\": \"efgh\"}"  # no top_k
    engine = ScriptedEngine([bad_call, "<think>r</think>X mem", "", "no think tag", "", "</think>Y",
                             r"\boxed{X}"])
    traj = run_one(task, engine, c)
    p = [x.prompt_text for x in engine.calls]
    assert p[0] == "<user>P:Q?|H:0/2|M:No previous memory"  # the user turn left open, no assistant header
    # the ill-formed call searches the problem "Q?" with top_k 5; character-indexed passages never match the
    # two-character word "q?", so every passage scores 0 and all three come back in document order
    assert p[1] == user("P:Q?|H:s1/2\n1:Q?:5|R:#1=abcd\n\n#2=efgh\n\n#3=ij|C:abcd|M:No previous memory")
    assert p[3] == user("P:Q?|H:s2/2\n1:Q?:5|R:none|C:efgh|M:X mem")
    # "no think tag" has no </think>: the memory stays "X mem" and the write counts as unfinished
    assert p[5] == user("P:Q?|H:s3/2\n1:Q?:5|R:none|C:ij|M:X mem")
    assert p[6] == user("P:Q?|M:Y|answer:")
    assert [s.info.get("memory_finished") for s in traj.segments if s.info["kind"] == "memory"] == [True, False, True]
    # never stopped, answer found at step 0: the published rule gives no early-stop reward; calls and
    # memories both failed their protocol term -> R = 0.6 * outcome only
    score = reward(task, traj)
    assert score.metrics == {"infmem_outcome": 1.0, "infmem_early_stop": 0.0, "infmem_calls_ok": 0.0,
                             "infmem_memories_ok": 0.0}
    assert score.reward == pytest.approx(0.6)
    assert traj.metrics["stop_step"] == 3 and traj.metrics["stopped"] == 0
    # memrl's rule counts step 0: 3 memories written, found at 0 -> d = 3 -> 0.6^2
    assert rw.early_stop_reward(0, 3, False, 0.6, "counted") == pytest.approx(0.36)


def test_early_stop_reward_by_hand():
    assert rw.early_stop_reward(None, 5, True) == 0.0  # the answer never reached the memory
    assert rw.early_stop_reward(2, 3, True) == 1.0  # stopped right after: 0.6^0
    assert rw.early_stop_reward(2, 5, True) == pytest.approx(0.36)  # two steps late: 0.6^2
    assert rw.early_stop_reward(0, 1, True, first_step_rule="published") == 1.0  # a stop is counted either way
    assert rw.answer_in_memory("The  Capital is\nNEW   york.", ["new york"]) is True
    assert rw.answer_in_memory("abc", ["", "  "]) is False
    assert rw.mixed_reward(0.0, 0.36, True, False) == pytest.approx(0.6 * 0.36 + 0.5)


def test_okapi_scores_by_hand():
    # passages "xy z" (2 words), "z xq" (2), "ww" (1): avgdl 5/3; "xq" in one of 3: idf ln(2.5) - ln(1.5)
    bm = OkapiBM25(["xy z", "z xq", "ww"])
    idf = math.log(2.5) - math.log(1.5)
    denom = 1 + 1.5 * (1 - 0.75 + 0.75 * 2 / (5 / 3))  # tf 1, dl 2
    assert bm.scores("xq") == pytest.approx([0.0, idf * 2.5 / denom, 0.0])
    # a word in all 3 passages has a negative idf (ln 0.5 - ln 3.5): it becomes 0.25 x the mean idf
    bm3 = OkapiBM25(["a b", "a c", "a"])
    idfs = {"a": math.log(0.5) - math.log(3.5), "b": math.log(2.5) - math.log(1.5), "c": math.log(2.5) - math.log(1.5)}
    assert bm3.idf["a"] == pytest.approx(0.25 * sum(idfs.values()) / 3)
    # characters (the released index): "b" matches passage "ab" by its character
    # (query lower-cased, passages not), never a whole word; idf ln(2.5) - ln(1.5), dl = avgdl = 2
    chars = OkapiBM25(["ab", "cd", "eB"], terms="chars")
    assert chars.scores("B") == pytest.approx([idf * 2.5 / 2.5, 0.0, 0.0])
    assert chars.scores("ab") == [0.0, 0.0, 0.0]


def test_passages_and_bm25s_scorer():
    tok = CharTokenizer()
    ps = cut_passages(tok.encode("paris rome oslo"), tok, 6)
    assert ps == [Passage("paris ", 0, 6), Passage("rome o", 6, 12), Passage("slo", 12, 15)]
    r = DocumentRetriever(ps, "bm25s")
    hits = asyncio.run(r.retrieve(["rome"], 5))[0]
    assert [h.document.id for h in hits] == ["p1"]  # bm25s: positive scores only
    assert DocumentRetriever([], "okapi").search_one("x", 3) == []


def test_plan_parsing_and_bad_config():
    c = cfg()
    a = parse_plan('<tool_call>{"name": "other", "arguments": {}}</tool_call>' + CALL, "Q", c)
    assert (a.stop, a.calls) == (False, [(None, None, True), ("xq", 2, True)])
    a = parse_plan('<tool_call>{"name": "retrieve", "arguments": {"query": "k", "top_k": "0"}}</tool_call>', "Q", c)
    assert a.calls == [("k", 5, True)]  # top_k < 1: the default 5
    a = parse_plan("<tool_call>{broken</tool_call>", "Q", c)
    assert a.calls == [("Q", 5, False)]
    assert parse_plan("I will STOP here " + CALL, "Q", c).stop is True
    with pytest.raises(ValueError, match="call_format must be one of hermes, qwen_agent"):
        cfg(call_format="json")
    with pytest.raises(ValueError, match="history_line"):
        cfg(history_line="{nope}")
    spec, conf = parse_workflow({"name": "infmem", "chunk_tokens": 7}, stage="train")
    assert spec is get_workflow("infmem") or spec.name == "infmem"
    assert (conf.chunk_tokens, conf.max_chunks) == (7, 8)


def test_stopword_only_document_finds_nothing():
    tok = CharTokenizer()
    r = DocumentRetriever(cut_passages(tok.encode("the a an"), tok, 100), "bm25s")
    assert r.search_one("the", 3) == []


def test_rememr1_advantages_on_infmem_trajectories_by_hand():
    from memrl.algorithms.advantages import compute_group_advantages
    from memrl.types import Group

    task = Task("t", "Q?", "abcdefghij", ["X"])  # 3 chunks
    c = cfg(retrieval_scorer="bm25s")
    t1 = run_one(task, ScriptedEngine(["go", "m1", "go", "X", "STOP", r"\boxed{X}"]), c)  # stops at step 2
    t2 = run_one(task, ScriptedEngine(["go", "m1", "go", "m2", "go", "m3", r"\boxed{Y}"]), c)  # reads all 3
    for i, t in enumerate((t1, t2)):
        t.trajectory_id, t.reward = f"t#{i}", reward(task, t).reward
    # t1: outcome 1, early stop 1 (found at 1, stopped at 2), protocols 1 + 1 -> 2.2; t2: 0 + 0 + 0.5 + 0.5 = 1.0
    assert (t1.reward, t2.reward) == (pytest.approx(2.2), pytest.approx(1.0))
    steps = [[step_rewards(task, t1), step_rewards(task, t2)]]
    # memory gains: t1 [0 (m1), 1 (X)], t2 [0, 0, 0]; plans None; finals 1 (one box each)
    assert steps == [[[None, 0.0, None, 1.0, None, 1.0], [None, 0.0, None, 0.0, None, 0.0, 1.0]]]
    adv = compute_group_advantages([Group("t", [t1, t2], task)], "rememr1", step_rewards=steps)
    # A_out = R - mean(2.2, 1.0) = +-0.6; A_state by step key: memory 0 (key 1) 0 / 0; memory 1 (key 3) 1 vs 0
    # -> +-0.5; memory 2 (key 5) only t2 -> 0; finals 1 vs 1 -> 0; plans carry none -> 0.
    # A = 0.8 A_out + 0.2 A_state
    assert adv[0][0] == pytest.approx([0.48, 0.48, 0.48, 0.58, 0.48, 0.48])
    assert adv[0][1] == pytest.approx([-0.48, -0.48, -0.48, -0.58, -0.48, -0.48, -0.48])
