"""The needle reader (memrl.demonstrators.evidence.needle_evidence / EvidenceDemonstrator.for_needles): the SFT-only
baseline of the needle recipe keeps, in its memory, the sentences of a RULER context that hold a gold value, and
boxes the gold values. Expected memories derived by hand from the character tokenizer's chunks (one token per
character)."""

from __future__ import annotations

import logging

from doubles import CharTokenizer

from memrl.demonstrators import ScriptedEngine
from memrl.demonstrators.evidence import EvidenceDemonstrator, needle_evidence
from memrl.rewards.verifiers import get_verifier
from memrl.runtime import rollout_once
from memrl.types import Task
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"


def test_the_sentences_holding_a_gold_value_whole_words_only():
    noise = Task("a", "Which number for red-fox?", "Rain fell.\nThe number for red-fox is: 1234567.\nRain fell.\n"
                 "The number for tan-owl is: 12345678.\n", ["1234567"])
    assert needle_evidence(noise) == (["The number for red-fox is: 1234567."], "1234567")
    # an essay haystack: the needle sits between sentences of one line
    essay = Task("b", "?", "He left at 9. The number for red-fox is: 42. It rained at 42nd street.", ["42"])
    assert needle_evidence(essay) == (["The number for red-fox is: 42."], "42")
    chain = Task("c", "?", "VAR AB = 5\nnoise\nVAR CD = VAR AB\nVAR ABC = 7\nVAR EF = VAR CD\n", ["AB", "CD", "EF"])
    assert needle_evidence(chain) == (["VAR AB = 5", "VAR CD = VAR AB", "VAR EF = VAR CD"], "AB, CD, EF")


def test_the_memory_carries_the_needle_through_the_chunks_and_the_final_call_boxes_it(caplog):
    # 12 + 30 + 12 characters: chunk 1 (16 characters) is noise, the needle ends in chunk 3
    ctx = "Rain fell.\n\nThe key is: 1234567.\nA dog slept."
    tasks = [Task("t1", "The key?", ctx, ["1234567"]),
             Task("t2", "The key?", ctx.replace("1234567", "7654321"), ["7654321"]),  # the same question: left out
             Task("t3", "None?", "Rain fell.", ["999"])]  # no gold value in its context: left out
    wf = MemAgentConfig(chunk_tokens=16, max_memory_tokens=40, max_final_tokens=20, memory_template=MT,
                        final_template=FT)
    with caplog.at_level(logging.INFO, logger="memrl.demonstrators.evidence"):
        reader, playable = EvidenceDemonstrator.for_needles(wf, tasks)
    assert [t.task_id for t in playable] == ["t1"]
    assert caplog.records[-1].getMessage() == ("needle demonstrations: 2 task(s) left out (1 ask a question another "
                                               "task asks with other evidence, 1 hold no gold value in their context)")
    tok = CharTokenizer()
    groups = rollout_once(playable, get_workflow("memagent"), ScriptedEngine(reader, tokenizer=tok), wf, n=1)
    replies = [tok.decode(s.response_ids, skip_special_tokens=True) for s in groups[0].trajectories[0].segments]
    # chunks [0:16) "Rain fell.\n\nThe ", [16:32) "key is: 1234567.", [32:45): the needle [12:32) is split
    # across the first two, so it is in neither (as the evidence reader treats a split sentence) and the memory
    # keeps the placeholder; the final call still boxes the gold value
    assert replies == [wf.no_memory_text] * 3 + ["\\boxed{1234567}"]
    whole = Task("t4", "Where?", "Rain fell here.\nThe key is: 1234567.\nA dog slept.", ["1234567"])
    wf40 = MemAgentConfig(chunk_tokens=40, max_memory_tokens=40, max_final_tokens=20, memory_template=MT,
                          final_template=FT)
    reader, playable = EvidenceDemonstrator.for_needles(wf40, [whole])
    groups = rollout_once(playable, get_workflow("memagent"), ScriptedEngine(reader, tokenizer=tok), wf40, n=1)
    traj = groups[0].trajectories[0]
    replies = [tok.decode(s.response_ids, skip_special_tokens=True) for s in traj.segments]
    # chunk 1 = [0:40) "Rain fell here.\nThe key is: 1234567.\nA d" holds the needle whole; chunk 2 nothing new
    assert replies == ["The key is: 1234567.", "The key is: 1234567.", "\\boxed{1234567}"]
    assert traj.reward == 1.0


def test_ruler_match_is_rulers_string_match_all():
    verify = get_verifier("ruler_match")
    assert verify("The values: AB and cd.", ["AB", "CD", "EF"]) == 2 / 3
    assert verify("\\boxed{1234567}", ["1234567"]) == 1.0
    assert verify("", ["1234567"]) == 0.0
