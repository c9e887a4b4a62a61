"""The MemAgent / InfMem reading oracle (memrl.demonstrators.infmem.ReadingDemonstrator) on prompts rendered through
the InfMem demo's short templates and the workflows' default ones: each call's reply, written by hand."""

from __future__ import annotations

import pytest

from memrl.demonstrators.infmem import ReadingDemonstrator, answer_reply, retrieve_reply
from memrl.recipes.infmem import ARMS
from memrl.workflows import parse_workflow


def _cfg(section: dict) -> object:
    return parse_workflow({**section, "chunk_tokens": 8, "final_template": "Q: {problem}\nM: {memory}\nA:"})[1]


@pytest.mark.parametrize("section", [ARMS["infmem"].workflow, {"name": "infmem"}])
def test_infmem_oracle_retrieves_the_asked_key_then_stops(section):
    cfg = _cfg(section) if "plan_template" in section else parse_workflow(section)[1]
    plan, mem, fin = cfg.templates()
    oracle = ReadingDemonstrator.for_config("infmem", cfg)
    q = "what is Kalo"
    # nothing in memory: retrieve the asked key, top_k 1
    reply = oracle(plan.render(problem=q, history="0/8", memory="No previous memory"), 0)
    assert reply == retrieve_reply("Kalo", 1) == '<tool_call>{"name": "retrieve", "arguments": {"query": "Kalo", ' \
                                                '"top_k": 1}}</tool_call>'
    # the memory holds a distractor only: still retrieve; it holds the fact: STOP
    assert oracle(plan.render(problem=q, history="1/8", memory="- Miran is blue"), 0) == retrieve_reply("Kalo")
    assert oracle(plan.render(problem=q, history="1/8", memory="- Kalo is red"), 0) == "STOP"
    # memory call: the fact in the retrieved passage (not in the section) becomes the memory
    m = mem.render(problem=q, history="1/8\nKalo", retrieved=" Kalo is red the of", chunk=" Miran is blue and",
                   memory="No previous memory")
    assert oracle(m, 1) == "- Kalo is red"
    # neither shows it: the old memory is kept
    m = mem.render(problem=q, history="1/8\nKalo", retrieved="none", chunk=" Miran is blue and", memory="- Tor is ox")
    assert oracle(m, 1) == "- Tor is ox"
    assert oracle(fin.render(problem=q, memory="- Kalo is red"), 2) == answer_reply("red") == "\\boxed{ red}"
    assert oracle(fin.render(problem=q, memory="- Miran is blue"), 2) == "\\boxed{ unknown}"


def test_memagent_oracle_keeps_the_fact_from_the_section():
    cfg = _cfg(ARMS["memagent"].workflow)
    mem, fin = cfg.templates()
    oracle = ReadingDemonstrator.for_config("memagent", cfg)
    q = "what is Kalo"
    assert oracle(mem.render(problem=q, memory="No previous memory", chunk=" Miran is blue the"), 0) == \
        "No previous memory"
    assert oracle(mem.render(problem=q, memory="No previous memory", chunk=" Kalo is red the"), 1) == "- Kalo is red"
    # the kept fact survives a later section with another fact
    assert oracle(mem.render(problem=q, memory="- Kalo is red", chunk=" Miran is blue the"), 2) == "- Kalo is red"
    assert oracle(fin.render(problem=q, memory="- Kalo is red"), 3) == "\\boxed{ red}"


def test_oracle_refuses_a_prompt_of_no_template_and_an_unknown_workflow():
    cfg = _cfg(ARMS["memagent"].workflow)
    with pytest.raises(ValueError, match="^ReadingDemonstrator: prompt matches none of its templates"):
        ReadingDemonstrator.for_config("memagent", cfg)("hello", 0)
    with pytest.raises(ValueError, match="^ReadingDemonstrator: workflow must be memagent or infmem, got 'mem1'$"):
        ReadingDemonstrator.for_config("mem1", cfg)
