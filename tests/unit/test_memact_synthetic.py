"""The MemAct CPU task (memrl.data.synthetic_memact) and its scripted agent (memrl.demonstrators.memact)."""

from __future__ import annotations

import asyncio

import pytest

from memrl.data.synthetic_memact import ATTRIBUTES, Entity, MemActTaskConfig, make_tasks, names
from memrl.demonstrators.memact import (
    MemActDemonstrator,
    answer_reply,
    parse_document,
    parse_memory,
    prune_reply,
    search_reply,
)


def test_every_task_has_its_own_fact_sheet():
    cfg = MemActTaskConfig(num_names=32, entities_per_task=6, sub_questions=[2, 3])
    tasks = make_tasks(cfg, 40, seed=9)
    assert tasks == make_tasks(cfg, 40, seed=9) and tasks != make_tasks(cfg, 40, seed=10)
    assert {len(t.answers) for t in tasks} == {2, 3}
    sheets = set()
    for t in tasks:
        docs = t.meta["documents"]
        facts = [parse_document(d) for d in docs]
        assert len(docs) == 24 and None not in facts  # 6 names x 4 attributes, one document per fact
        held = {n for n, _, _ in facts}
        assert len(held) == 6 and held <= set(names(cfg))
        assert all(sum(f[0] == n and f[1] == a for f in facts) == 1 for n in held for a in ATTRIBUTES)
        table = {(n, a): v for n, a, v in facts}
        asked, attrs = t.meta["entities"], t.meta["attributes"]
        assert len(set(asked)) == len(asked) and set(asked) <= held
        assert t.answers == [table[(n, a)] for n, a in zip(asked, attrs, strict=True)]
        assert t.meta["sub_answers"] == [[a] for a in t.answers]
        lines = t.question.split("\n")
        assert lines[0] == f"Answer the following {len(asked)} questions."
        assert lines[1:] == [f"{i}. {a} of {n}?" for i, (a, n) in enumerate(zip(attrs, asked, strict=True), 1)]
        sheets.add(frozenset(docs))
    assert len(sheets) == 40  # drawn per task: nothing to memorize across tasks


def test_document_text_hand_checked():
    e = Entity("Kalo", (("color", "red"), ("pet", "owl")))
    assert e.documents() == ["Kalo color red", "Kalo pet owl"]
    assert e.value("pet") == "owl"
    assert parse_document("Kalo color red") == ("Kalo", "color", "red")
    assert parse_document("Kalo color owl") is None and parse_document("Kalo age red") is None
    assert parse_document("Search results for x") is None


def test_attribute_values_are_distinct_one_word_sets():
    words = [v for vs in ATTRIBUTES.values() for v in vs]
    assert len(words) == len(set(words)) == 48 and all(" " not in w for w in words)
    assert [len(vs) for vs in ATTRIBUTES.values()] == [16, 16, 8, 8]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="num_names"):
        MemActTaskConfig(num_names=0)
    with pytest.raises(ValueError, match="entities_per_task"):
        MemActTaskConfig(num_names=4, entities_per_task=5)
    with pytest.raises(ValueError, match="sub_questions"):
        MemActTaskConfig(entities_per_task=3, sub_questions=[4])
    with pytest.raises(ValueError, match="late_prob"):
        MemActDemonstrator(late_prob=1.5)


def test_bm25_search_of_a_sub_question_finds_the_fact_then_another_fact_of_the_name():
    from memrl.tools.search import task_retriever

    for t in make_tasks(MemActTaskConfig(), 20, seed=3):
        ret = task_retriever(t)
        for n, a, v in (parse_document(d) for d in t.meta["documents"]):
            hits = asyncio.run(ret.retrieve([f"{a} of {n}"], 2))[0]
            assert hits[0].document.text == f"{n} {a} {v}"
            second = hits[1].document.text.split()
            assert second[0] == n and second[1] != a  # the distractor: the same name, another attribute


# ------------------------------------------------------------------------------------ the scripted agent

HEAD = ("<sys>tools</sys><user>Answer the following 3 questions.\n1. color of Kalo?\n2. pet of Mira?\n"
        "3. food of Tovi?\n\nAnswer all 3 questions.</user>")
R1 = "[r1] Search results for \"color of Kalo\":\n\n(1) Kalo color red\n\n(2) Kalo pet cat"
R2 = "[r2] Search results for \"pet of Mira\":\n\n(1) Mira pet owl\n\n(2) Mira color blue"
R3 = "[r4] Search results for \"food of Tovi\":\n\n(1) Tovi food rice\n\n(2) Tovi stone jade"
Q2 = "<user>Answer the following 2 questions.\n1. color of Kalo?\n2. pet of Mira?\n\nAnswer.</user>"


def test_replies_are_hermes_calls_and_a_json_answer():
    assert search_reply("color", "Kalo") == (
        '<tool_call>{"name": "search", "arguments": {"query": " color of Kalo", "topk": 2}}</tool_call>')
    assert prune_reply([("Kalo", "color", "red"), ("Mira", "pet", "owl")], ["r1", "r2"]) == (
        '<tool_call>{"name": "prune_context", "arguments": {"memory": " Kalo color red; Mira pet owl", '
        '"delete_ids": ["r1", "r2"]}}</tool_call>')
    assert answer_reply(["red", "owl"]) == 'FINAL_ANSWER: {"1": " red", "2": " owl"}'
    assert parse_memory(" Kalo color red; Mira pet owl") == [("Kalo", "color", "red"), ("Mira", "pet", "owl")]


def test_agent_searches_prunes_the_needed_facts_searches_on_and_answers():
    agent = MemActDemonstrator(late_prob=0.0)
    assert agent(HEAD) == search_reply("color", "Kalo")
    assert agent(HEAD + R1) == search_reply("pet", "Mira")
    # two results held and a question left: prune, the note keeps the asked facts (not the distractors)
    prune = agent(HEAD + R1 + R2)
    assert prune == prune_reply([("Kalo", "color", "red"), ("Mira", "pet", "owl")], ["r1", "r2"])
    after = HEAD + "<assistant>" + prune + "</assistant>[r3] Removed r1, r2."
    assert agent(after) == search_reply("food", "Tovi")
    assert agent(after + R3) == answer_reply(["red", "owl", "rice"])


def test_topk_one_agent_reads_a_result_closed_by_the_chat_marker():
    """With one passage per search the fact's line is the last of the tool message, so the decoded prompt
    has the chat marker right after it ("(1) Kalo color red<|im_end|>"): the fact must still count as held."""
    agent = MemActDemonstrator(late_prob=0.0, topk=1)
    assert agent(HEAD) == search_reply("color", "Kalo", topk=1) == (
        '<tool_call>{"name": "search", "arguments": {"query": " color of Kalo", "topk": 1}}</tool_call>')
    r1 = "<|im_start|>tool\n[r1] Search results for \"color of Kalo\":\n\n(1) Kalo color red<|im_end|>\n"
    r2 = "<|im_start|>tool\n[r2] Search results for \"pet of Mira\":\n\n(1) Mira pet owl<|im_end|>\n"
    assert agent(HEAD + r1) == search_reply("pet", "Mira", topk=1)
    assert agent(HEAD + r1 + r2) == prune_reply([("Kalo", "color", "red"), ("Mira", "pet", "owl")], ["r1", "r2"])
    with pytest.raises(ValueError, match="topk"):
        MemActDemonstrator(topk=0)


def test_late_agent_searches_on_instead_of_pruning():
    assert MemActDemonstrator(late_prob=1.0)(HEAD + R1 + R2) == search_reply("food", "Tovi")
    # the coin depends on the prompt and seed only: the same prompt always gets the same reply
    agent = MemActDemonstrator(late_prob=0.5, seed=1)
    assert len({agent(HEAD + R1 + R2) for _ in range(5)}) == 1
    # a 2-question task never needs the prune: with both facts held it answers
    assert MemActDemonstrator(late_prob=0.0)(Q2 + R1 + R2) == answer_reply(["red", "owl"])


def test_keep_results_one_prunes_after_every_search_and_deletes_the_old_prune_result():
    agent = MemActDemonstrator(keep_results=1, late_prob=0.0)
    first = agent(HEAD + R1)
    assert first == prune_reply([("Kalo", "color", "red")], ["r1"])
    ctx = HEAD + "<assistant>" + first + "</assistant>[r2] Removed r1." + R2.replace("[r2]", "[r3]")
    assert agent(ctx) == prune_reply([("Mira", "pet", "owl")], ["r2", "r3"])


def test_late_share_over_many_prompts_matches_late_prob():
    agent = MemActDemonstrator(late_prob=0.6, seed=0)
    late = sum(agent(HEAD + R1 + R2 + f"<pad{i}>") == search_reply("food", "Tovi") for i in range(2000))
    assert abs(late / 2000 - 0.6) < 0.035  # binomial s.e. 0.011


def test_write_splits_keeps_sft_in_memory_and_writes_rl_and_heldout(tmp_path):
    from memrl.data.synthetic_memact import write_splits
    from memrl.data.tasks_jsonl import load_task_file

    cfg = MemActTaskConfig()
    splits = write_splits(cfg, tmp_path / "data", sft=(3, 500), rl=(4, 100), heldout=(2, 987654))
    assert [t.task_id for t in splits.sft_tasks] == ["sft500-0", "sft500-1", "sft500-2"]
    assert splits.sft_tasks == make_tasks(cfg, 3, 500, prefix="sft")
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["heldout_tasks.jsonl", "train_tasks.jsonl"]
    rl = load_task_file(tmp_path / "data" / "train_tasks.jsonl")
    assert [t.task_id for t in rl] == ["rl100-0", "rl100-1", "rl100-2", "rl100-3"]
    assert [t.task_id for t in splits.eval_tasks] == ["heldout987654-0", "heldout987654-1"]
    held = load_task_file(tmp_path / "data" / "heldout_tasks.jsonl")
    assert [(t.question, t.answers) for t in held] == [(t.question, t.answers) for t in splits.eval_tasks]
