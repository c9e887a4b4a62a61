"""The evidence reader (memrl.demonstrators.evidence): MemAgent's scripted reader on real multi-hop QA, the
cold start that gives a pretrained model its first boxed answers. Expected memories derived by hand from the
character tokenizer's chunks (one token per character)."""

from __future__ import annotations

import pytest
from doubles import CharTokenizer

from memrl.demonstrators import ScriptedEngine
from memrl.demonstrators.evidence import EvidenceDemonstrator, supporting_sentences
from memrl.runtime import rollout_once
from memrl.types import Task
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"
CONTEXT = "Document 1:\nA\n s0. s1.\n\nDocument 2:\nB\nt0. t1."  # 22 + 2 + 21 characters


def source(tid: str, question: str, facts: list[list]) -> Task:
    paragraphs = [{"title": "A", "sentences": [" s0.", " s1."]}, {"title": "B", "sentences": ["t0.", " t1."]}]
    return Task(tid, question, CONTEXT, ["gold " + tid], meta={"paragraphs": paragraphs, "supporting_facts": facts})


def test_supporting_sentences_in_the_facts_order_stripped_and_unknown_facts_skipped():
    task = source("q", "?", [["B", 0], ["A", 1], ["C", 0], ["A", 5], ["A", 1]])
    assert supporting_sentences(task) == ["t0.", "s1."]


def test_memory_keeps_the_sections_evidence_and_the_final_call_boxes_the_gold_answer():
    srcs = [source("q1", "Who one?", [["A", 1], ["B", 0]]), source("q2", "Who two?", [["A", 0]])]
    tasks = [Task(s.task_id, s.question, s.context, s.answers) for s in srcs]  # a built file keeps no facts
    wf = MemAgentConfig(chunk_tokens=24, max_memory_tokens=40, max_final_tokens=20, memory_template=MT,
                        final_template=FT)
    reader = EvidenceDemonstrator(MT, FT, {t.question: (supporting_sentences(s), t.answers[0])
                                     for t, s in zip(tasks, srcs, strict=True)})
    assert reader.evidence == EvidenceDemonstrator.for_tasks(wf, tasks, srcs).evidence
    groups = rollout_once(tasks, get_workflow("memagent"), ScriptedEngine(reader, tokenizer=CharTokenizer()), wf, n=1)
    tok = CharTokenizer()
    replies = {g.task.task_id: [tok.decode(s.response_ids, skip_special_tokens=True)
                                for s in g.trajectories[0].segments] for g in groups}
    # chunk 1 = the first 24 characters (document 1 and the blank line), chunk 2 = document 2
    assert replies["q1"] == ["s1.", "s1.\nt0.", "\\boxed{gold q1}"]
    # q2: chunk 1 shows s0.; chunk 2 shows nothing new, so the memory is kept as it was
    assert replies["q2"] == ["s0.", "s0.", "\\boxed{gold q2}"]
    assert [g.trajectories[0].reward for g in groups] == [1.0, 1.0]


def test_unknown_questions_and_missing_facts_are_one_line_errors():
    src = source("q1", "Who one?", [["A", 1]])
    wf = MemAgentConfig(memory_template=MT, final_template=FT)
    with pytest.raises(ValueError, match=r"1 task\(s\) have no supporting facts .*task id 'q9'"):
        EvidenceDemonstrator.for_tasks(wf, [Task("q9", "Other?", CONTEXT, ["x"])], [src])
    reader = EvidenceDemonstrator.for_tasks(wf, [Task("q1", "Who one?", CONTEXT, ["x"])], [src])
    with pytest.raises(ValueError, match="no evidence for the question 'Other\\?'"):
        reader("Q: Other?\nM: none\nA:")
    with pytest.raises(ValueError, match="matches neither the memory nor the final template"):
        reader("something else")
