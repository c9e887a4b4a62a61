"""Tool-call formats: the xml format of qwen3-coder-style templates beside Hermes JSON, under the same noise
(what small models emit: invisible characters, code fences, text around the call) and a seeded fuzz of both;
the format chosen by the template or by setting; MemAct's cap on consecutive invalid calls."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.services.base import Document
from memrl.tools.calls import (
    ToolCall,
    detect_call_format,
    format_call,
    parse_tool_calls,
    schema_index,
    tools_fallback_text,
)
from memrl.tools.search import PRUNE_SCHEMA, SEARCH_SCHEMA, register_retriever
from memrl.types import Task
from memrl.workflows.memact import MemActConfig, run

OK = ToolCall("search", {"query": "a"})
SCHEMAS = schema_index([SEARCH_SCHEMA, PRUNE_SCHEMA])
CANONICAL = {
    "hermes": '{"name": "search", "arguments": {"query": "a"}}',
    "xml": "<function=search>\n<parameter=query>\na\n</parameter>\n</function>",
}
# The Hermes sanitizer cases of test_memact_tools.py, as edits of either format's block: (edit, sanitized)
NOISE = [
    (lambda b, lang: b, False),
    (lambda b, lang: f"\n{b}\n", False),
    (lambda b, lang: "\ufeff" + b, True),  # BOM
    (lambda b, lang: b.replace("search", "sea\u200brch", 1), True),  # zero-width space
    (lambda b, lang: b.replace("search", "search\u200e", 1), True),  # bidirectional mark
    (lambda b, lang: b.replace("search", "\u200fse\u202b\u202carch", 1), True),  # marks and embeddings
    (lambda b, lang: b.replace("search", "sea\u2060rch", 1), True),  # word joiner
    (lambda b, lang: f"```{lang}\n{b}\n```", True),  # code fence
    (lambda b, lang: f"Sure! {b} hope this helps }}", True),  # text around the call
]


def parse(text: str, fmt: str, **kw):
    return parse_tool_calls(text, call_format=fmt, schemas=SCHEMAS, **kw)


@pytest.mark.parametrize("fmt", ["hermes", "xml"])
@pytest.mark.parametrize("case", range(len(NOISE)))
def test_both_formats_recover_the_same_noise(fmt, case):
    edit, sanitized = NOISE[case]
    block = edit(CANONICAL[fmt], "json" if fmt == "hermes" else "xml")
    res = parse(f"think <tool_call>{block}</tool_call> done", fmt)
    assert (res.calls, res.errors, res.sanitized, res.valid) == ([OK], [], int(sanitized), [True])


@pytest.mark.parametrize("fmt", ["hermes", "xml"])
def test_seeded_fuzz_never_raises_and_accounts_for_every_block(fmt):
    """500 random corruptions (characters of the tags dropped, doubled or inserted) of a three-call text:
    parsing never raises, and every block is a call, a dropped call or an error, in `valid` order."""
    calls = [OK, ToolCall("search", {"query": "b c", "topk": 3}),
             ToolCall("prune_context", {"memory": "m", "delete_ids": ["r1", "r2"]})]
    text = "x " + " ".join(format_call(c, fmt) for c in calls)
    assert parse(text, fmt).calls == calls  # the uncorrupted text round-trips
    rng = random.Random(0)
    alphabet = "<>/={}[]\":,\n `\ufeff\u200b" + "tool_call function parameter"
    for _ in range(500):
        chars = list(text)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(chars))
            op = rng.random()
            if op < 0.4:
                del chars[i]
            elif op < 0.7:
                chars.insert(i, chars[i])
            else:
                chars.insert(i, rng.choice(alphabet))
        res = parse("".join(chars), fmt, max_calls=2)
        assert len(res.valid) == len(res.calls) + res.dropped + len(res.errors)
        assert res.valid.count(True) == len(res.calls) + res.dropped
        assert all(isinstance(c.arguments, dict) and c.name for c in res.calls)


@pytest.mark.parametrize("block, error", [
    ("search(query=a)", "the tool call has no <function=NAME> block"),
    ("<function=>\n<parameter=query>\na\n</parameter>\n</function>", "the tool call has an empty function name"),
    ("<function=search></function><function=search></function>",
     "the tool call holds 2 <function=...> blocks; write one per <tool_call>"),
    ("<function=search>\n<parameter=query>\na\n<parameter=topk>\n2\n</parameter>\n</function>",
     "parameter 'query' of 'search' is not closed with </parameter>"),
    ("<function=search>\n<parameter=query>\na\n</parameter>\n<parameter=query>\nb\n</parameter>\n</function>",
     "parameter 'query' of 'search' is given twice"),
    ("<function=search>\n<parameter=>\na\n</parameter>\n</function>", "a parameter of 'search' has an empty name"),
])
def test_xml_malformed_blocks_are_one_line_errors(block, error):
    res = parse(f"<tool_call>{block}</tool_call>", "xml")
    assert (res.calls, res.errors, res.valid) == ([], [error], [False])


def test_xml_recoveries_of_its_own_and_the_unclosed_block():
    # no </function>, spaces around the name, text before the first parameter: cleaned (sanitized)
    res = parse("<tool_call><function= search >\nok:\n<parameter=query>a</parameter></tool_call>"
                "<tool_call>\n<function=search>", "xml")
    assert res.calls == [OK] and res.sanitized == 1
    assert res.errors == ["a <tool_call> block was not closed with </tool_call>"] and res.valid == [True, False]
    # the tool's schema types the values; what does not convert stays text for the tool to refuse
    res = parse("<tool_call><function=search><parameter=query>\n1990\n</parameter><parameter=topk>\n3\n"
                "</parameter></function></tool_call><tool_call><function=search><parameter=topk>three"
                "</parameter></function></tool_call><tool_call><function=prune_context><parameter=delete_ids>"
                '["r1", "r2"]</parameter><parameter=memory>\n two lines\nkept \n</parameter></function></tool_call>'
                "<tool_call><function=other><parameter=n>5</parameter><parameter=xs>[1, 2]</parameter>"
                "</function></tool_call>", "xml")
    assert res.calls == [ToolCall("search", {"query": "1990", "topk": 3}), ToolCall("search", {"topk": "three"}),
                         ToolCall("prune_context", {"delete_ids": ["r1", "r2"], "memory": " two lines\nkept "}),
                         ToolCall("other", {"n": "5", "xs": [1, 2]})]
    with pytest.raises(ValueError, match="tool call format must be one of hermes, xml, got 'yaml'"):
        parse_tool_calls("x", call_format="yaml")
    with pytest.raises(ValueError, match="parser 'published' reads the hermes format only"):
        parse_tool_calls("x", parser="published", call_format="xml")


def test_the_template_picks_the_format():
    class Tok:
        def __init__(self, template):
            self.chat_template = template

    coder = "{%- for t in tools %}...<tool_call>\\n<function=name>\\n<parameter=...{%- endfor %}"
    assert detect_call_format(Tok(coder)) == "xml"
    assert detect_call_format(Tok({"default": "x", "tool_use": coder})) == "xml"
    assert detect_call_format(Tok('<tool_call>\\n{"name": ...}')) == "hermes"
    assert detect_call_format(Tok(None)) == detect_call_format(CharTokenizer()) == "hermes"


# ---- MemAct with the xml format and the invalid-call cap (character tokenizer, scripted replies) ----

DOCS = [Document("d1", "Paris", "Paris is the capital of France.")]
FMT = "End with one line: FINAL_ANSWER: <short answer>."


def xml_search(query: str) -> str:
    return f"<tool_call><function=search><parameter=query>{query}</parameter></function></tool_call>"


def run_one(replies: list[str], **kw):
    register_retriever("kw_formats", KeywordRetriever(DOCS))
    base = dict(retriever_kind="kw_formats", no_prune_prob=0.0, temperature=0.0, max_turn_tokens=400,
                system_template="S", system_noprune_template="N", user_template="{question}|{answer_format}")
    engine = ScriptedEngine(replies)
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, MemActConfig(**{**base, **kw}), random.Random(0)))
    return traj, engine


def test_memact_xml_calls_run_and_the_prompt_teaches_the_format():
    traj, engine = run_one([xml_search("capital"), "FINAL_ANSWER: Paris"], tool_call_format="xml")
    tools = [SEARCH_SCHEMA, PRUNE_SCHEMA]
    assert engine.calls[0].prompt_text == (f"<system>S{tools_fallback_text(tools, 'xml')}</system>"
                                           f"<user>Q|{FMT}</user><assistant>")
    assert "<parameter=ARGUMENT-NAME>" in engine.calls[0].prompt_text
    assert traj.metrics["searches"] == 1.0 and traj.metrics["xml_tool_calls"] == 1.0
    assert traj.final_answer == "Paris" and traj.info["stop"] == "answer"
    # a malformed xml call is answered with the xml example
    traj, engine = run_one(["<tool_call><function=search></tool_call>x", "FINAL_ANSWER: Paris"],
                           tool_call_format="xml")
    assert traj.metrics["malformed_calls"] == 0.0  # a call without parameters is well-formed: search refuses it
    assert traj.metrics["bad_arguments"] == 1.0
    traj, engine = run_one(["<tool_call>search</tool_call>", "FINAL_ANSWER: Paris"], tool_call_format="xml")
    assert ("Error: the tool call has no <function=NAME> block. Write each call as <tool_call><function=NAME>"
            "<parameter=ARG>value</parameter></function></tool_call>.") in engine.calls[1].prompt_text
    with pytest.raises(ValueError, match="tool_parser=published reads Hermes JSON calls only"):
        MemActConfig(tool_call_format="xml", tool_parser="published")
    with pytest.raises(ValueError, match="tool_call_format must be one of auto, hermes, xml, got 'json'"):
        MemActConfig(tool_call_format="json")


BAD = "<tool_call>{bad</tool_call>"
GOOD = "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": "capital"}}) + "</tool_call>"
UNKNOWN = "<tool_call>" + json.dumps({"name": "browse", "arguments": {}}) + "</tool_call>"


@pytest.mark.parametrize("replies, cap, turns, stop, streak", [
    # three malformed turns, cap 2: the second ends the trajectory (streak 1, then 2)
    ([BAD, BAD, BAD, "FINAL_ANSWER: Paris"], 2, 2, "invalid_tool_calls", 2),
    # a valid call resets the count: 1, 0, 1, then the answer
    ([BAD, GOOD, BAD, "FINAL_ANSWER: Paris"], 2, 4, "answer", 1),
    # in the order written within a turn: BAD GOOD BAD -> 1, 0, 1; then BAD -> 2 = cap
    ([BAD + GOOD + BAD, BAD, "FINAL_ANSWER: Paris"], 2, 2, "invalid_tool_calls", 2),
    # a call to a tool not offered counts; an unclosed block counts
    ([UNKNOWN, "<tool_call>{", "FINAL_ANSWER: Paris"], 2, 2, "invalid_tool_calls", 2),
    # 0 = off: the streak is still measured
    ([BAD, BAD, BAD, "FINAL_ANSWER: Paris"], 0, 4, "answer", 3),
])
def test_consecutive_invalid_calls_end_the_trajectory(replies, cap, turns, stop, streak):
    traj, _ = run_one(replies, max_consecutive_invalid_tool_calls=cap)
    m = traj.metrics
    assert (m["turns"], traj.info["stop"], m["invalid_call_streak"]) == (turns, stop, streak)
    assert m["stop_invalid_tool_calls"] == float(stop == "invalid_tool_calls")
