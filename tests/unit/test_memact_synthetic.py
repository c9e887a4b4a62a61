"""The MemAct CPU task (memrl.data.synthetic_memact) and its scripted agent (memrl.demonstrators.memact)."""

from __future__ import annotations

import asyncio
import json

import pytest

from memrl.data.synthetic_memact import (
    ATTRIBUTES,
    Entity,
    MemActTaskConfig,
    make_tasks,
    make_world,
    name_pool,
    world_documents,
    write_corpus,
)
from memrl.demonstrators.memact import (
    MemActDemonstrator,
    answer_reply,
    parse_document,
    parse_memory,
    prune_reply,
    search_reply,
)


def test_world_documents_one_per_fact():
    cfg = MemActTaskConfig(num_entities=6)
    world = make_world(cfg, seed=3)
    names = [e.name for e in world]
    assert len(set(names)) == 6 and names == sorted(names)
    e = world[0]
    assert [a for a, _ in e.facts] == list(ATTRIBUTES)
    assert all(v in ATTRIBUTES[a] for a, v in e.facts)
    docs = world_documents(world)
    assert len(docs) == 24 and [d.id for d in docs[:5]] == ["e0-0", "e0-1", "e0-2", "e0-3", "e1-0"]
    a = dict(e.facts)
    assert [d.text for d in docs[:4]] == [f"{e.name} age {a['age']}", f"{e.name} room {a['room']}",
                                          f"{e.name} floor {a['floor']}", f"{e.name} code {a['code']}"]
    assert all(len(e.name) == 3 and e.name.isdigit() for e in world)
    # the held-out world keeps the names and draws the facts again
    other = make_world(cfg, seed=4)
    assert [x.name for x in other] == names and [x.facts for x in other] != [x.facts for x in world]
    assert make_world(cfg, seed=3) == world


def test_document_text_hand_checked():
    e = Entity("417", (("age", "38"), ("room", "12")))
    assert e.documents() == ["417 age 38", "417 room 12"]
    assert e.value("room") == "12"
    assert parse_document("417 age 38") == ("417", "age", "38")
    assert parse_document("417 age 5") is None and parse_document("417 color 38") is None
    assert parse_document("Search results for x") is None


def test_name_pool_is_three_digit_numbers_and_values_two():
    pool = name_pool()
    assert pool[0] == "100" and pool[-1] == "999" and len(pool) == 900
    assert all(vs == tuple(str(i) for i in range(10, 100)) for vs in ATTRIBUTES.values())


def test_tasks_ask_distinct_names_and_answer_from_the_world():
    cfg = MemActTaskConfig(num_entities=10, sub_questions=[2, 3])
    world = make_world(cfg, 0)
    by_name = {e.name: e for e in world}
    tasks = make_tasks(cfg, world, 40, seed=9)
    assert {len(t.answers) for t in tasks} == {2, 3}
    assert tasks == make_tasks(cfg, world, 40, seed=9) and tasks != make_tasks(cfg, world, 40, seed=10)
    for t in tasks:
        names, attrs = t.meta["entities"], t.meta["attributes"]
        assert len(set(names)) == len(names)
        assert t.answers == [by_name[n].value(a) for n, a in zip(names, attrs, strict=True)]
        assert t.meta["sub_answers"] == [[a] for a in t.answers]
        lines = t.question.split("\n")
        assert lines[0] == f"Answer the following {len(names)} questions."
        assert lines[1:] == [f"{i}. {a} of {n}?" for i, (a, n) in enumerate(zip(attrs, names, strict=True), 1)]


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="num_entities"):
        MemActTaskConfig(num_entities=2)
    with pytest.raises(ValueError, match="sub_questions"):
        MemActTaskConfig(num_entities=5, sub_questions=[5])
    with pytest.raises(ValueError, match="late_prob"):
        MemActDemonstrator(late_prob=1.5)


def test_bm25_search_of_a_sub_question_finds_the_fact_then_another_fact_of_the_name(tmp_path):
    from memrl.services.retrieval import BM25Retriever

    world = make_world(MemActTaskConfig(num_entities=30), 0)
    ret = BM25Retriever.from_file(write_corpus(tmp_path / "c.jsonl", world))
    for e in world[:10]:
        for a in ATTRIBUTES:
            hits = asyncio.run(ret.retrieve([f"{a} of {e.name}"], 2))[0]
            assert hits[0].document.text == f"{e.name} {a} {e.value(a)}"
            second = hits[1].document.text.split()
            assert second[0] == e.name and second[1] != a  # the distractor: the same name, another attribute


# ------------------------------------------------------------------------------------ the scripted agent

HEAD = ("<sys>tools</sys><user>Answer the following 3 questions.\n1. age of 417?\n2. room of 523?\n"
        "3. code of 610?\n\nAnswer all 3 questions.</user>")
R1 = "[r1] Search results for \"age of 417\":\n\n(1) 417 age 38\n\n(2) 417 room 12"
R2 = "[r2] Search results for \"room of 523\":\n\n(1) 523 room 71\n\n(2) 523 age 40"
R3 = "[r4] Search results for \"code of 610\":\n\n(1) 610 code 55\n\n(2) 610 floor 19"
Q2 = "<user>Answer the following 2 questions.\n1. age of 417?\n2. room of 523?\n\nAnswer.</user>"


def test_replies_are_hermes_calls_and_a_json_answer():
    assert search_reply("age", "417") == (
        '<tool_call>{"name": "search", "arguments": {"query": " age of 417", "topk": 2}}</tool_call>')
    assert prune_reply([("417", "age", "38"), ("523", "room", "71")], ["r1", "r2"]) == (
        '<tool_call>{"name": "prune_context", "arguments": {"memory": " 417 age 38; 523 room 71", '
        '"delete_ids": ["r1", "r2"]}}</tool_call>')
    assert answer_reply(["38", "71"]) == 'FINAL_ANSWER: {"1": " 38", "2": " 71"}'
    assert parse_memory(" 417 age 38; 523 room 71") == [("417", "age", "38"), ("523", "room", "71")]


def test_agent_searches_prunes_the_needed_facts_searches_on_and_answers():
    agent = MemActDemonstrator(late_prob=0.0)
    assert agent(HEAD) == search_reply("age", "417")
    assert agent(HEAD + R1) == search_reply("room", "523")
    # two results held and a question left: prune, the note keeps the asked facts (not the distractors)
    prune = agent(HEAD + R1 + R2)
    assert prune == prune_reply([("417", "age", "38"), ("523", "room", "71")], ["r1", "r2"])
    after = HEAD + "<assistant>" + prune + "</assistant>[r3] Removed r1, r2."
    assert agent(after) == search_reply("code", "610")
    assert agent(after + R3) == answer_reply(["38", "71", "55"])


def test_topk_one_agent_reads_a_result_closed_by_the_chat_marker():
    """With one passage per search the fact's line is the last of the tool message, so the decoded prompt
    has the chat marker right after it ("(1) 417 age 38<|im_end|>"): the fact must still count as held."""
    agent = MemActDemonstrator(late_prob=0.0, topk=1)
    assert agent(HEAD) == search_reply("age", "417", topk=1) == (
        '<tool_call>{"name": "search", "arguments": {"query": " age of 417", "topk": 1}}</tool_call>')
    r1 = "<|im_start|>tool\n[r1] Search results for \"age of 417\":\n\n(1) 417 age 38<|im_end|>\n"
    r2 = "<|im_start|>tool\n[r2] Search results for \"room of 523\":\n\n(1) 523 room 71<|im_end|>\n"
    assert agent(HEAD + r1) == search_reply("room", "523", topk=1)
    assert agent(HEAD + r1 + r2) == prune_reply([("417", "age", "38"), ("523", "room", "71")], ["r1", "r2"])
    with pytest.raises(ValueError, match="topk"):
        MemActDemonstrator(topk=0)


def test_late_agent_searches_on_instead_of_pruning():
    assert MemActDemonstrator(late_prob=1.0)(HEAD + R1 + R2) == search_reply("code", "610")
    # the coin depends on the prompt and seed only: the same prompt always gets the same reply
    agent = MemActDemonstrator(late_prob=0.5, seed=1)
    assert len({agent(HEAD + R1 + R2) for _ in range(5)}) == 1
    # a 2-question task never needs the prune: with both facts held it answers
    assert MemActDemonstrator(late_prob=0.0)(Q2 + R1 + R2) == answer_reply(["38", "71"])


def test_keep_results_one_prunes_after_every_search_and_deletes_the_old_prune_result():
    agent = MemActDemonstrator(keep_results=1, late_prob=0.0)
    first = agent(HEAD + R1)
    assert first == prune_reply([("417", "age", "38")], ["r1"])
    ctx = HEAD + "<assistant>" + first + "</assistant>[r2] Removed r1." + R2.replace("[r2]", "[r3]")
    assert agent(ctx) == prune_reply([("523", "room", "71")], ["r2", "r3"])


def test_late_share_over_many_prompts_matches_late_prob():
    agent = MemActDemonstrator(late_prob=0.6, seed=0)
    late = sum(agent(HEAD + R1 + R2 + f"<pad{i}>") == search_reply("code", "610") for i in range(2000))
    assert abs(late / 2000 - 0.6) < 0.035  # binomial s.e. 0.011


def test_corpus_file_rows(tmp_path):
    world = make_world(MemActTaskConfig(num_entities=3, sub_questions=[2]), 0)
    rows = [json.loads(x) for x in write_corpus(tmp_path / "c.jsonl", world).read_text().splitlines()]
    assert [r["id"] for r in rows] == [f"e{i}-{j}" for i in range(3) for j in range(4)]
    assert all(r["title"] == "" for r in rows) and rows[0]["text"] == world[0].documents()[0]
