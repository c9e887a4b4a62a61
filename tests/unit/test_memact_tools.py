"""Tool-call parsing and sanitizing, prune_context on message lists, the multi-question reward."""

from __future__ import annotations

import pytest

from memrl.rewards.multiq import parse_prediction, score
from memrl.tools import context as ctx
from memrl.tools.calls import ToolCall, parse_tool_calls, render_system, sanitize
from memrl.tools.search import SEARCH_SCHEMA, retriever_factory, truncate_middle
from memrl.types import Task

OK = ToolCall("search", {"query": "a"})


@pytest.mark.parametrize("block, sanitized", [
    ('{"name": "search", "arguments": {"query": "a"}}', False),
    ('\n{"name": "search", "arguments": {"query": "a"}}\n', False),
    ('\ufeff{"name": "search", "arguments": {"query": "a"}}', True),
    ('{"name": "sea\u200brch", "arguments": {"query": "a"}}', True),
    # bidirectional marks (U+200E, U+200F) and embeddings / overrides (U+202A-U+202E), as the public
    # sanitizer strips them (MemAct tool_parser.py, HermesToolParser._sanitize_json_block)
    ('{"name": "search\u200e", "arguments": {"query": "a"}}', True),
    ('{"name": "\u200fsearch", "arguments": {"query": "a\u202a"}}', True),
    ('{"name": "se\u202b\u202carch", "arguments": {"query": "\u202da\u202e"}}', True),
    ('```json\n{"name": "search", "arguments": {"query": "a"}}\n```', True),
    ('Sure! {"name": "search", "arguments": {"query": "a"}} hope this helps }', True),
    ('{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}', True),
    ('{"name": "search", "parameters": {"query": "a"}}', False),
])
def test_sanitizer_recovers_what_small_models_emit(block, sanitized):
    res = parse_tool_calls(f"think <tool_call>{block}</tool_call> done")
    assert res.calls == [OK] and res.errors == [] and res.sanitized == int(sanitized)


def test_sanitize_cuts_to_the_first_json_object():
    assert sanitize('x ```\n{"a": {"b": 1}} trailing {"c": 2}\n```') == '{"a": {"b": 1}}'


def test_malformed_blocks_become_errors_in_order_and_the_cap_drops_the_rest():
    text = ("<tool_call>{bad</tool_call><tool_call>{\"arguments\": {}}</tool_call>"
            "<tool_call>{\"name\": \"s\", \"arguments\": [1]}</tool_call>"
            + "<tool_call>{\"name\": \"search\", \"arguments\": {\"query\": \"a\"}}</tool_call>" * 3
            + "<tool_call>{\"name\": \"x\"")
    res = parse_tool_calls(text, max_calls=2)
    assert res.calls == [OK, OK] and res.dropped == 1 and res.attempted
    assert res.errors == [
        "the tool call is not valid JSON (Expecting property name enclosed in double quotes at character 1)",
        'the tool call has no "name" string',
        "the arguments of 's' must be a JSON object, got list",
        "a <tool_call> block was not closed with </tool_call>",
    ]
    assert not parse_tool_calls("FINAL_ANSWER: x").attempted


def test_truncate_middle():
    assert truncate_middle("abcdef", 6) == ("abcdef", False)
    assert truncate_middle("abcdefghij", 4) == ("ab\n...[6 characters truncated]...\nij", True)
    assert truncate_middle("abcdefghij", 5) == ("ab\n...[5 characters truncated]...\nhij", True)


def _msgs():
    """head, turn 0 (calls -> r1, r2), turn 1 (prune call -> r3), turn 2 (-> r4)."""
    h = ctx.head_message([1, 2], "h")
    a0 = ctx.assistant_message([9], [10, 11], [-0.1, -0.2], [8], 0, "a0")
    a0.call_ids = ["r1", "r2"]
    a1 = ctx.assistant_message([9], [12], [-0.3], [8], 1, "a1")
    a1.call_ids, a1.has_prune = ["r3"], True
    a2 = ctx.assistant_message([9], [13], [-0.4], [8], 2, "a2")
    a2.call_ids = ["r4"]
    return [h, a0, ctx.tool_message([20], 0, "r1", "t1"), ctx.tool_message([21], 0, "r2", "t2"),
            a1, ctx.tool_message([22], 1, "r3", "t3"), a2, ctx.tool_message([23], 2, "r4", "t4")]


def test_prune_partial_and_whole_assistant_messages():
    msgs = _msgs()
    out = ctx.prune(msgs, ["r1"])  # r2 remains: turn 0 stays whole
    assert out.error is None and out.removed_turns == []
    assert ctx.context_ids(out.messages) == [1, 2, 9, 10, 11, 8, 21, 9, 12, 8, 22, 9, 13, 8, 23]
    out = ctx.prune(out.messages, ["r2", "r4", "r3"])  # turns 0 and 2 go; the prune turn 1 stays
    assert out.removed_turns == [0, 2]
    assert ctx.context_ids(out.messages) == [1, 2, 9, 12, 8]


@pytest.mark.parametrize("ids, error", [
    ([], "delete_ids must be a non-empty list of result ids"),
    (["r1", " "], "delete_ids must be a non-empty list of result ids"),
    (["r1", "r7"], "unknown result id(s) r7; current ids: r1, r2, r3, r4"),
])
def test_prune_errors_change_nothing(ids, error):
    msgs = _msgs()
    out = ctx.prune(msgs, ids)
    assert out.error == error and out.messages is msgs


def test_chat_format_of_the_tiny_models_template():
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    fmt = ctx.ChatFormat.from_tokenizer(tok)
    assert fmt == ctx.ChatFormat("<|im_start|>assistant\n", "<|im_end|>\n", "<|im_start|>tool\n", "<|im_end|>\n")
    text, native = render_system(tok, "S", "U", [SEARCH_SCHEMA])
    assert not native  # ChatML without tools support: schemas go into the system prompt
    assert text.startswith("<|im_start|>system\nS\n\n# Tools\n") and text.endswith("<|im_start|>user\nU<|im_end|>\n")


MULTI = Task("m", "1. a? 2. b? 3. c?", "", ["Paris", "1990", "Ada Lovelace"],
             meta={"sub_questions": ["a?", "b?", "c?"],
                   "sub_answers": [["Paris"], ["1990"], ["Ada Lovelace", "Augusta Ada King"]]})


@pytest.mark.parametrize("text, reward, ems, fallback, unparsed", [
    ('FINAL_ANSWER: {"1": "paris", "2": 1990, "3": "Augusta Ada King"}', 1.0, [1, 1, 1], 0, 0),
    ('FINAL_ANSWER: ["The Paris", "1990", "Ada Lovelace"]', 1.0, [1, 1, 1], 0, 0),
    ('FINAL_ANSWER: {"q3": "Ada", "q1": "Paris", "q2": "1990"}', 0.0, [1, 1, 0], 0, 0),
    ('FINAL_ANSWER: ```json\n{"1": "Paris", "2": "1990", "3": "Ada Lovelace"}\n``` done', 1.0, [1, 1, 1], 1, 0),
    ('FINAL_ANSWER: {"1": "x"} then FINAL_ANSWER: {"1": "Paris", "2": "1991"}', 0.0, [1, 0, 0], 0, 0),
    ("FINAL_ANSWER: Paris, 1990, Ada Lovelace", 0.0, [0, 0, 0], 0, 1),
    ("", 0.0, [0, 0, 0], 0, 1),
])
def test_multiq_reward(text, reward, ems, fallback, unparsed):
    s = score(text, MULTI)
    assert s["reward"] == reward and s["em"] == ems
    assert s["metrics"]["answer_parse_fallback"] == fallback and s["metrics"]["answer_unparsed"] == unparsed
    assert s["metrics"]["multiq_correct"] == sum(ems) and s["metrics"]["multiq_questions"] == 3


def test_multiq_single_question_and_partial_f1():
    single = Task("s", "q", "", ["Ada Lovelace", "Lovelace"])
    assert score("FINAL_ANSWER: lovelace\nextra line", single)["reward"] == 1.0
    assert score('FINAL_ANSWER: {"answer": "Ada Lovelace"}', single)["reward"] == 1.0  # one value: the answer
    assert score('FINAL_ANSWER: ["Ada", "Lovelace"]', single)["answers"] == ["Ada, Lovelace"]
    s = score('FINAL_ANSWER: {"1": "Paris", "2": "1990", "3": "Ada"}', MULTI)
    assert s["f1"] == [1.0, 1.0, pytest.approx(2 / 3)] and s["metrics"]["multiq_f1_mean"] == pytest.approx(8 / 9)
    assert parse_prediction('FINAL_ANSWER: ["a"]', 2).answers == ["a", None]


def test_building_the_retriever(tmp_path):
    import asyncio

    from memrl.config import ConfigError
    from memrl.data.io import DataError
    from memrl.tools.search import build_retriever

    with pytest.raises(ConfigError, match="a retriever is needed: set workflow.retriever_url, workflow.retriever_corpus"):
        build_retriever("bm25", None, None)
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "title": "T", "text": "alpha beta"}\n{"id": "b", "text": "beta"}\n')
    r = build_retriever("keyword", str(corpus), None)
    assert build_retriever("keyword", str(corpus), None) is r  # built once per source
    hits = asyncio.run(r.retrieve(["alpha beta", "gamma"], 5))
    assert [[(h.document.id, h.score) for h in hs] for hs in hits] == [[("a", 2.0), ("b", 1.0)], []]
    with pytest.raises(ConfigError, match="workflow.retriever_kind='bad' is unknown"):
        build_retriever("bad", str(corpus), None)
    (tmp_path / "bad.jsonl").write_text('{"id": "a"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: line 1 is not a corpus row with id and text"):
        build_retriever("keyword", str(tmp_path / "bad.jsonl"), None)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(DataError, match=r"retriever_corpus=.*empty.jsonl: .*the corpus is empty"):
        build_retriever("keyword", str(tmp_path / "empty.jsonl"), None)


@retriever_factory
def marked_factory(corpus: str):
    """A factory a config may name (tests.unit.test_memact_tools:marked_factory)."""
    from doubles import KeywordRetriever

    return KeywordRetriever.from_jsonl(corpus)


def unmarked_factory(corpus: str):  # pragma: no cover - must never be called
    raise AssertionError("an unmarked callable was called")


def test_import_paths_resolve_only_to_marked_retriever_factories(tmp_path):
    """module:attr names only @retriever_factory objects (by identity); anything else is refused before
    it is called: os:system with a shell command creates no file."""
    from memrl.config import ConfigError
    from memrl.tools.search import build_retriever, resolve_factory
    from memrl.workflows import parse_workflow

    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"id": "a", "title": "T", "text": "alpha"}\n')
    assert resolve_factory(f"{__name__}:marked_factory") is marked_factory
    r = build_retriever(f"{__name__}:marked_factory", str(corpus), None)
    assert [d.id for d in r.documents] == ["a"]
    marker = tmp_path / "pwned"
    for kind, msg in [("os:system", "is not a retriever factory"), ("builtins:exec", "is not a retriever factory"),
                      (f"{__name__}:unmarked_factory", "is not a retriever factory"),
                      ("os:nope", "module 'os' has no attribute 'nope'"),
                      ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
                      ("os:system; touch x", "expected bm25, keyword")]:
        with pytest.raises(ConfigError, match=msg):
            build_retriever(kind, f"touch {marker}", None)
        with pytest.raises(ConfigError, match=msg):  # refused when the config is parsed, too
            parse_workflow({"name": "memact", "retriever_kind": kind, "retriever_corpus": f"touch {marker}"})
    assert not marker.exists()


def test_task_layout_files_round_trip_and_bad_rows_are_named(tmp_path):
    from memrl.data.io import DataError
    from memrl.data.tasks_jsonl import is_task_layout, load_task_file, write_tasks

    path = tmp_path / "t.jsonl"
    write_tasks(path, [MULTI, Task("s", "q", "", ["a"])])
    assert is_task_layout(path) and load_task_file(path) == [MULTI, Task("s", "q", "", ["a"])]
    (tmp_path / "e.json").write_text('[{"input": "q", "answers": ["a"], "context": "c"}]')
    assert not is_task_layout(tmp_path / "e.json")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "x", "question": "q", "answers": ["a", "b"], "meta": {"sub_answers": [["a"]]}}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: row 0: meta.sub_answers has 1 entries, answers has 2"):
        load_task_file(bad)


def test_published_topk_by_hand():
    """MemAct-Anonymized @ 9b65b84a: DCPO/tool_service/search_tool_single.py SearchTool.execute takes
    min(int(topk), 20), falling back to its default 5 when int() fails; search_search_services.py replaces
    a falsy topk (0) with the service's default (5, its --topk default)."""
    from memrl.tools.search import published_topk

    assert published_topk(3) == (3, False)
    assert published_topk("7") == (7, False)  # int("7")
    assert published_topk(2.9) == (2, False)  # int(2.9) = 2 (memrl's clamp rule: an argument error)
    assert published_topk(True) == (1, False)  # int(True) = 1
    assert published_topk(50) == (20, True)  # the tool's cap
    assert published_topk(0) == (5, True)  # 0 reaches the service, which uses its default
    assert published_topk("2.5") == (5, True) and published_topk(None) == (5, True)  # int() fails: default
    assert published_topk(-3) == (1, True)  # not reproduced (the service hands it to its index)


def test_run_search_topk_rules():
    import asyncio

    from memrl.services.base import Document, Hit
    from memrl.tools.search import run_search

    class Recording:
        def __init__(self):
            self.asked = []

        async def retrieve(self, queries, topk):
            self.asked.append(topk)
            return [[Hit(Document(f"d{i}", "", f"text {i}"), 1.0) for i in range(topk)]]

    r = Recording()
    clamp = asyncio.run(run_search(r, {"query": "q", "topk": 0}))
    published = asyncio.run(run_search(r, {"query": "q", "topk": 0}, "published"))
    assert r.asked == [1, 5] and clamp.clamped and published.clamped
    assert published.text.count("\n(") == 5 and clamp.text.count("\n(") == 1
    bad = asyncio.run(run_search(r, {"query": "q", "topk": 2.9}))
    assert bad.error == "arguments" and r.asked == [1, 5]  # memrl: no search ran
    ok = asyncio.run(run_search(r, {"query": "q", "topk": 2.9}, "published"))
    assert ok.error is None and r.asked == [1, 5, 2]


@pytest.mark.parametrize("block, memrl, published", [
    ('{"name": "search", "arguments": {"query": "a"}}', OK, OK),
    # no "parameters" alias and no default arguments in the public parser (function_call["arguments"])
    ('{"name": "search", "parameters": {"query": "a"}}', OK, 'the tool call needs a "name" string and an '
                                                           '"arguments" object'),
    ('{"name": "search"}', ToolCall("search", {}), 'the tool call needs a "name" string and an "arguments" object'),
    # arguments as a JSON string: memrl decodes it; published passes the string on (the call fails when run)
    ('{"name": "search", "arguments": "{\\"query\\": \\"a\\"}"}', OK,
     "the arguments of 'search' must be a JSON object, got str"),
    # the public cleaning keeps the first "{" to the LAST "}": 47 characters of JSON (positions 0-46), a
    # space, then "hope this helps }": json reports the extra data where it starts, after the space: 48
    ('Sure! {"name": "search", "arguments": {"query": "a"}} hope this helps }', OK,
     "the tool call is not valid JSON (Extra data at character 48)"),
    # U+2060 (word joiner) is not among the public parser's invisible characters; names are used as written
    ('{"name": "sea\u2060rch", "arguments": {"query": "a"}}', OK, ToolCall("sea\u2060rch", {"query": "a"})),
    ('{"name": " search ", "arguments": {"query": "a"}}', OK, ToolCall(" search ", {"query": "a"})),
    ('```json\n{"name": "search", "arguments": {"query": "a"}}\n```', OK, OK),
])
def test_published_parser_is_stricter(block, memrl, published):
    """tool_parser=published: MemAct-Anonymized @ 9b65b84a, verl/experimental/agent_loop/tool_parser.py
    HermesToolParser.extract_tool_calls / _sanitize_json_block."""
    for parser, want in (("memrl", memrl), ("published", published)):
        res = parse_tool_calls(f"<tool_call>{block}</tool_call>", parser=parser)
        if isinstance(want, ToolCall):
            assert (res.calls, res.errors) == ([want], []), parser
        else:
            assert (res.calls, res.errors) == ([], [want]), parser
    with pytest.raises(ValueError, match="tool call parser must be one of memrl, published"):
        parse_tool_calls("x", parser="vllm")
