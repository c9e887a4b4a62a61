"""Contract tests: the MEM1 workflow against a scripted engine with a character tokenizer: the exact
contexts each turn sees (prompt + latest internal state + latest observation), token-exact carry-over,
and the defining property: the context of a call is flat in the number of turns and objectives, while
the full-history baseline's grows linearly."""

from __future__ import annotations

import asyncio
import random

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.data.multiobjective import combined_question
from memrl.types import Task
from memrl.workflows import parse_workflow
from memrl.workflows.mem1 import Mem1Config, kept_span, reward, run

PROMPT = "Q:{question}"


def cfg(**kw) -> Mem1Config:
    base = dict(max_turns=4, max_turn_tokens=200, temperature=0.0, prompt_template=PROMPT, retriever_scope="task",
                hint_turns_left="{n} left", hint_last_turn="last")
    base.update(kw)
    return Mem1Config(**base)


def run_one(task: Task, engine: ScriptedEngine, c: Mem1Config):
    return asyncio.run(run(task, engine, c, random.Random(0)))


def obs(hint: str, body: str) -> str:
    return f"\n\n<information>{hint}\n\n{body}</information>\n\n"


def test_exact_contexts_latest_state_only():
    task = Task("t", "Where?", "", ["Italy", "France"],
                meta={"documents": ["Rome is in Italy", "Paris is in France"],
                      "sub_answers": [["Italy"], ["France"]]})
    engine = ScriptedEngine(["<IS>s0</IS><search>Rome</search> extra", "x<IS>s1</IS><search>Paris</search>",
                             "<IS>s2</IS><answer>Italy; france</answer>"])
    traj = run_one(task, engine, cfg())
    head = "<user>Q:Where?</user><assistant>"
    o0 = obs("3 left", "(1) Rome is in Italy")
    o1 = obs("2 left", "(1) Paris is in France")
    assert [c.prompt_text for c in engine.calls] == [
        head,
        head + "<IS>s0</IS><search>Rome</search>" + o0,  # the text after the action and the EOS are cut
        head + "<IS>s1</IS><search>Paris</search>" + o1,  # turn 0 is gone; the "x" before <IS> too
    ]
    tok = CharTokenizer()
    # the carried ids are the sampled ones (a slice of turn 1's response ids), not re-encoded text
    assert engine.calls[2].prompt_ids[len(head):len(head) + 33] == traj.segments[1].response_ids[1:34]
    assert [s.info["internal_state"] for s in traj.segments] == ["s0", "s1", "s2"]
    assert [s.info["action"] for s in traj.segments] == ["search", "search", "answer"]
    # kept: "<IS>s0</IS><search>Rome</search>" = 32 ids, "<IS>s1</IS><search>Paris</search>" = 33
    assert [s.info["context_tokens"] for s in traj.segments] == [len(head), len(head) + 32 + len(o0),
                                                                 len(head) + 33 + len(o1)]
    assert traj.segments[0].response_ids == tok.encode("<IS>s0</IS><search>Rome</search> extra") + [tok.eos_token_id]
    assert traj.segments[0].loss_mask == [1] * len(traj.segments[0].response_ids)
    assert traj.final_answer == "Italy; france"
    assert (traj.metrics["turns"], traj.metrics["searches"], traj.metrics["answered"]) == (3, 2, 1)
    # peak = the last call: its context + its 41 reply ids + EOS
    assert traj.metrics["peak_context_tokens"] == len(head) + 33 + len(o1) + 42
    # the mean prompt over the three calls (the MEM1 demo's mean context)
    assert traj.metrics["mean_context_tokens"] == (3 * len(head) + 32 + len(o0) + 33 + len(o1)) / 3
    s = reward(task, traj)
    assert (s.reward, s.metrics["multiq_all_correct"], s.metrics["multiq_correct"]) == (1.0, 1.0, 2.0)


def test_reward_scales_and_invalid_turn():
    task = Task("t", "q", "", ["b1", "c1"], meta={"documents": ["alpha"], "sub_answers": [["b1"], ["c1"]]})
    traj = run_one(task, ScriptedEngine(["<IS>x</IS><answer>b1; zz</answer>"]), cfg())
    assert reward(task, traj).reward == 0.5  # one of two objectives right: mean
    traj = run_one(task, ScriptedEngine(["<IS>x</IS><answer>B1; c1.</answer>"]), cfg(reward_scale="sum"))
    assert reward(task, traj).reward == 2.0  # the released count
    traj = run_one(task, ScriptedEngine(["no action here"]), cfg())
    assert (traj.metrics["invalid_turn"], traj.final_answer, reward(task, traj).reward) == (1.0, "", 0.0)


def test_max_turns_without_answer_scores_zero():
    task = Task("t", "q", "", ["a"], meta={"documents": ["a b"]})
    traj = run_one(task, ScriptedEngine(["<IS>x</IS><search>a</search>"] * 2), cfg(max_turns=2))
    assert traj.info["stop"] == "max_turns" and traj.final_answer == "" and reward(task, traj).reward == 0.0


@pytest.mark.parametrize("k", [2, 4, 8, 16])
def test_context_flat_in_turns_and_objectives_full_history_linear(k):
    # k objectives, one search per objective, then the answer: k + 1 calls. Each search reply is 68 chars
    # (+ EOS = 69 ids), of which the 68 up to </search> are kept; each observation is the same text.
    subs = [f"question {i}?" for i in range(k)]
    task = Task("t", combined_question(subs), "", [f"a{i}" for i in range(k)],
                meta={"documents": ["qq is here", "other text"]})
    search = "<IS>" + "s" * 40 + "</IS><search>qq</search>"
    answer = "<IS>" + "s" * 40 + "</IS><answer>" + ";".join(f"a{i}" for i in range(k)) + "</answer>"
    o = obs("", "(1) qq is here")
    head = len(f"<user>Q:{task.question}</user><assistant>")
    assert len(search) == 68
    contexts = {}
    for mode in ("latest_state", "full_history"):
        c = cfg(max_turns=k + 1, context=mode, hint_turns_left="", hint_last_turn="")
        traj = run_one(task, ScriptedEngine([search] * k + [answer]), c)
        assert traj.metrics["turns"] == k + 1 and traj.final_answer.startswith("a0;")
        contexts[mode] = [s.info["context_tokens"] for s in traj.segments]
    # MEM1: after the first call every context is the prompt + one kept reply + one observation
    assert contexts["latest_state"] == [head] + [head + 68 + len(o)] * k
    # full history: turn t sees t kept replies and t observations, so the peak grows linearly with k
    assert contexts["full_history"] == [head + t * (68 + len(o)) for t in range(k + 1)]
    assert max(contexts["latest_state"]) - head == 68 + len(o)  # flat: the same for k = 2 ... 16


def test_context_cap_keeps_the_last_tokens():
    task = Task("t", "Where?", "", ["Italy"], meta={"documents": ["Rome is in Italy"]})
    engine = ScriptedEngine(["<IS>s0</IS><search>Rome</search>", "<IS>s1</IS><answer>Italy</answer>"])
    run_one(task, engine, cfg(max_context_tokens=40))
    full = "<user>Q:Where?</user><assistant>" + "<IS>s0</IS><search>Rome</search>" + obs("3 left", "(1) Rome is in Italy")
    assert engine.calls[0].prompt_text == "<user>Q:Where?</user><assistant>"  # 32 tokens: under the cap
    assert engine.calls[1].prompt_text == full[-40:]  # the head (the question first) is what goes


def test_kept_span_and_config_errors():
    tok = CharTokenizer()
    ids = tok.encode("ab<IS>z</IS><search>q</search>cd") + [tok.eos_token_id]
    assert kept_span(tok, ids, "IS") == (2, 30)
    ids = tok.encode("plain reply") + [tok.eos_token_id]
    assert kept_span(tok, ids, "IS") == (0, 11)  # no tag, no action: the reply without its EOS
    with pytest.raises(ValueError, match="Mem1Config.context must be one of latest_state, full_history"):
        Mem1Config(context="all")
    with pytest.raises(ValueError, match="state_tag"):
        Mem1Config(state_tag="<IS>")
    spec, c = parse_workflow({"name": "mem1", "topk": 5}, stage="eval")
    assert (spec.name, c.topk, c.temperature, c.max_turns) == ("mem1", 5, 0.0, 6)


def test_kept_span_on_a_bpe_tokenizer():
    # the tiny model's byte-level BPE may merge characters across the tags; the kept ids still decode to a
    # text that holds the whole state and action, and nothing of the reply's tail
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    reply = "thinking first <IS>Kalo is red; Miran</IS><search>stone of Tonbel?</search> and more text"
    ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
    start, end = kept_span(tok, ids, "IS")
    kept = tok.decode(ids[start:end])
    assert "<IS>Kalo is red; Miran</IS><search>stone of Tonbel?</search>" in kept
    assert "thinking" not in kept and "more" not in kept
    assert tok.decode(ids[start + 1:end]).find("<IS>") < 0  # the first kept token opens the tag
