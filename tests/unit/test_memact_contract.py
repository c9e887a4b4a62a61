"""Contract tests: the MemAct workflow against a scripted engine with a character tokenizer.

One token per character, so every context, segment row and mask can be written out by hand. The
tokenizer's template has no tools support, so the tool schemas go into the system prompt (fallback).
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.engines.base import Completion
from memrl.runtime import rollout_once
from memrl.services.base import Document
from memrl.tools.calls import tools_fallback_text
from memrl.tools.search import PRUNE_SCHEMA, SEARCH_SCHEMA, register_retriever
from memrl.types import Task
from memrl.workflows import get_workflow
from memrl.workflows.memact import MemActConfig, run

TOK = CharTokenizer()
EOS = TOK.eos_token_id
DOCS = [
    Document("d1", "Paris", "Paris is the capital of France."),
    Document("d2", "Berlin", "Berlin is the capital of Germany."),
    Document("d3", "Rome", "Rome is the capital of Italy."),
]
FMT = "End with one line: FINAL_ANSWER: <short answer>."


def enc(text: str) -> list[int]:
    return TOK.encode(text)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def cfg(**kw) -> MemActConfig:
    base = dict(retriever_kind="kw_test", no_prune_prob=0.0, temperature=0.0, max_turn_tokens=400,
                system_template="S", user_template="{question}|{answer_format}")
    base.update(kw)
    return MemActConfig(**base)


def head(prune: bool = True) -> list[int]:
    tools = [SEARCH_SCHEMA, PRUNE_SCHEMA] if prune else [SEARCH_SCHEMA]
    return enc("<system>S" + tools_fallback_text(tools) + f"</system><user>Q|{FMT}</user>")


HDR = enc("<assistant>")
END = enc("</assistant>")


def gen(reply: str) -> list[int]:
    return enc(reply) + [EOS]


def tool(content: str) -> list[int]:
    return enc(f"<tool>{content}</tool>")


def asst(reply: str) -> list[int]:
    return HDR + gen(reply) + END


def run_one(replies, retriever=None, task=None, **kw):
    register_retriever("kw_test", retriever or KeywordRetriever(DOCS))
    engine = ScriptedEngine(replies)
    traj = asyncio.run(run(task or Task("t1", "Q", "", ["Paris"]), engine, cfg(**kw), random.Random(0)))
    return traj, engine


def results(query: str, *docs: Document) -> str:
    return f'Search results for "{query}":\n\n' + "\n\n".join(
        f"({k}) {d.title}\n{d.text}" for k, d in enumerate(docs, 1))


def test_exact_context_ids_at_every_turn():
    r0 = call("search", query="France", topk=1)
    r1 = call("search", query="Germany", topk=1) + call("search", query="Italy", topk=1)
    r2 = "It is Paris.\nFINAL_ANSWER: Paris"
    traj, engine = run_one([r0, r1, r2])
    t1 = tool("[r1] " + results("France", DOCS[0]))
    t2 = tool("[r2] " + results("Germany", DOCS[1]))
    t3 = tool("[r3] " + results("Italy", DOCS[2]))
    assert engine.calls[0].prompt_ids == head() + HDR
    assert engine.calls[1].prompt_ids == head() + asst(r0) + t1 + HDR
    assert engine.calls[2].prompt_ids == head() + asst(r0) + t1 + asst(r1) + t2 + t3 + HDR
    assert traj.final_answer == "Paris"
    assert traj.info["stop"] == "answer"
    # no prune: one segment, the whole trajectory; tool output and template text masked out
    (seg,) = traj.segments
    assert seg.prompt_ids == head() + HDR
    assert seg.response_ids == gen(r0) + END + t1 + HDR + gen(r1) + END + t2 + t3 + HDR + gen(r2)
    assert seg.loss_mask == ([1] * len(gen(r0)) + [0] * len(END + t1 + HDR) + [1] * len(gen(r1))
                             + [0] * len(END + t2 + t3 + HDR) + [1] * len(gen(r2)))
    m = traj.metrics
    assert (m["turns"], m["searches"], m["prunes"], m["malformed_calls"]) == (3.0, 3.0, 0.0, 0.0)
    assert m["generated_tokens"] == len(gen(r0) + gen(r1) + gen(r2))
    assert m["peak_context_tokens"] == len(engine.calls[2].prompt_ids)
    assert m["mean_context_tokens"] == sum(len(c.prompt_ids) for c in engine.calls) / 3


def test_three_prunes_segment_rows_and_masks_by_hand():
    r = [
        call("search", query="France", topk=1),                                    # t0 -> r1
        call("prune_context", memory="m1", delete_ids=["r1"]),                      # t1 -> r2; t0 goes
        call("search", query="Germany", topk=1) + call("search", query="Italy", topk=1),  # t2 -> r3, r4
        call("prune_context", memory="m2", delete_ids=["r3"]),                      # t3 -> r5; t2 stays (r4)
        call("prune_context", memory="m3", delete_ids=["r4"]),                      # t4 -> r6; t2 goes now
        "FINAL_ANSWER: Paris",                                                      # t5
    ]
    traj, engine = run_one(r)
    T = {1: tool("[r1] " + results("France", DOCS[0])),
         2: tool("[r2] Removed r1. Your memory note stays in your prune_context call above."),
         3: tool("[r3] " + results("Germany", DOCS[1])),
         4: tool("[r4] " + results("Italy", DOCS[2])),
         5: tool("[r5] Removed r3. Your memory note stays in your prune_context call above."),
         6: tool("[r6] Removed r4. Your memory note stays in your prune_context call above.")}
    H = head()
    # the contexts the engine saw: t0's turn is gone after the first prune, t2's after the third
    assert engine.calls[2].prompt_ids == H + asst(r[1]) + T[2] + HDR
    assert engine.calls[4].prompt_ids == H + asst(r[1]) + T[2] + asst(r[2]) + T[4] + asst(r[3]) + T[5] + HDR
    assert engine.calls[5].prompt_ids == H + asst(r[1]) + T[2] + asst(r[3]) + T[5] + asst(r[4]) + T[6] + HDR

    s1, s2, s3, fin = traj.segments
    assert [s.info["kind"] for s in traj.segments] == ["prune", "prune", "prune", "final"]
    # segment 1: turns 0-1 before deleting r1
    assert s1.prompt_ids == H + HDR
    assert s1.response_ids == gen(r[0]) + END + T[1] + HDR + gen(r[1])
    assert s1.loss_mask == [1] * len(gen(r[0])) + [0] * len(END + T[1] + HDR) + [1] * len(gen(r[1]))
    # segment 2: turns 2-3; the kept prune turn 1 is prompt (mask 0: never trained twice)
    assert s2.prompt_ids == H + asst(r[1]) + T[2] + HDR
    assert s2.response_ids == gen(r[2]) + END + T[3] + T[4] + HDR + gen(r[3])
    assert s2.loss_mask == [1] * len(gen(r[2])) + [0] * len(END + T[3] + T[4] + HDR) + [1] * len(gen(r[3]))
    # segment 3: turn 4 alone; t2 is still there (partially deleted: r4 kept)
    assert s3.prompt_ids == H + asst(r[1]) + T[2] + asst(r[2]) + T[4] + asst(r[3]) + T[5] + HDR
    assert s3.response_ids == gen(r[4]) and s3.loss_mask == [1] * len(gen(r[4]))
    # final segment: only the answer turn trains
    assert fin.prompt_ids == engine.calls[5].prompt_ids
    assert fin.response_ids == gen(r[5]) and fin.loss_mask == [1] * len(gen(r[5]))
    assert [s.info["turns"] for s in traj.segments] == [[0, 1], [2, 3], [4], [5]]
    assert [s.info.get("removed_turns") for s in traj.segments[:3]] == [[0], [], [2]]
    assert traj.info["memories"] == ["m1", "m2", "m3"]
    assert [s.step for s in traj.segments] == [0, 1, 2, 3]
    # every generated token trains exactly once over the trajectory
    assert sum(s.num_trained_tokens for s in traj.segments) == sum(len(gen(x)) for x in r)
    assert traj.metrics["prunes"] == 3.0 and traj.metrics["failed_prunes"] == 0.0
    for s in traj.segments:
        assert all(lp == (-0.5 if k else 0.0) for lp, k in zip(s.response_logprobs, s.loss_mask, strict=True))


class VaryingLogprobs(ScriptedEngine):
    """The scripted engine with a distinct logprob per token, recording every completion."""

    def __init__(self, script):
        super().__init__(script)
        self.outs: list[Completion] = []

    async def generate(self, prompt_ids, sampling):
        out = await super().generate(prompt_ids, sampling)
        k = len(self.calls)
        out = Completion(out.token_ids, [-(k + j / 1000) for j in range(len(out.token_ids))], out.finish_reason)
        self.outs.append(out)
        return out


def test_training_rows_hold_the_engines_ids_and_logprobs_exactly():
    r = [call("search", query="France"), call("prune_context", memory="m", delete_ids=["r1"]), "FINAL_ANSWER: x"]
    register_retriever("kw_test", KeywordRetriever(DOCS))
    engine = VaryingLogprobs(r)
    traj = asyncio.run(run(Task("t1", "Q", "", ["x"]), engine, cfg(), random.Random(0)))
    trained = [(i, lp) for s in traj.segments
               for i, lp, k in zip(s.response_ids, s.response_logprobs, s.loss_mask, strict=True) if k]
    sampled = [(i, lp) for o in engine.outs for i, lp in zip(o.token_ids, o.logprobs, strict=True)]
    assert trained == sampled


def test_failed_prunes_leave_the_context_unchanged():
    r = [call("search", query="France", topk=1),
         call("prune_context", memory="m", delete_ids=[]),
         call("prune_context", memory="", delete_ids=["r1"]),
         call("prune_context", memory="m", delete_ids=["r9"]),
         "FINAL_ANSWER: Paris"]
    traj, engine = run_one(r)
    t1 = tool("[r1] " + results("France", DOCS[0]))
    errs = [tool("[r2] Error: delete_ids must be a non-empty list of result ids. Nothing was removed."),
            tool('[r3] Error: prune_context needs a non-empty "memory" string. Nothing was removed.'),
            tool("[r4] Error: unknown result id(s) r9; current ids: r1, r2, r3. Nothing was removed.")]
    assert engine.calls[4].prompt_ids == (head() + asst(r[0]) + t1 + asst(r[1]) + errs[0] + asst(r[2]) + errs[1]
                                          + asst(r[3]) + errs[2] + HDR)
    assert traj.metrics["failed_prunes"] == 3.0 and traj.metrics["prunes"] == 0.0
    assert len(traj.segments) == 1  # failed prunes close no segment


def test_withheld_prune_tool():
    r = [call("prune_context", memory="m", delete_ids=["r1"]), "FINAL_ANSWER: x"]
    traj, engine = run_one(r, prune_tool=False, system_noprune_template="N")
    head_np = enc("<system>N" + tools_fallback_text([SEARCH_SCHEMA]) + f"</system><user>Q|{FMT}</user>")
    assert engine.calls[0].prompt_ids == head_np + HDR
    err = tool("[r1] Error: unknown tool 'prune_context'; available tools: search.")
    assert engine.calls[1].prompt_ids == head_np + asst(r[0]) + err + HDR
    assert traj.metrics["prune_withheld"] == 1.0 and traj.metrics["unknown_tools"] == 1.0
    assert traj.metrics["prunes"] == 0.0
    # no_prune_prob draws from the trajectory's rng: fixed per seed, both outcomes over seeds
    register_retriever("kw_test", KeywordRetriever(DOCS))
    withheld = []
    for seed in range(12):
        e = ScriptedEngine(["FINAL_ANSWER: x"])
        t = asyncio.run(run(Task("t", "Q", "", ["x"]), e, cfg(no_prune_prob=0.5), random.Random(seed)))
        withheld.append(t.metrics["prune_withheld"])
        assert withheld[-1] == float(random.Random(seed).random() < 0.5)
    assert 0 < sum(withheld) < 12


def test_malformed_and_excess_calls_are_counted_not_raised():
    six = "".join(call("search", query=w, topk=1) for w in ["France", "Germany", "Italy", "Paris", "Rome", "x"])
    r0 = "<tool_call>not json</tool_call><tool_call>[1]</tool_call>" + six + '<tool_call>{"name": "search"'
    traj, engine = run_one([r0, "FINAL_ANSWER: x"], max_turn_tokens=2000)
    m = traj.metrics
    assert (m["malformed_calls"], m["dropped_calls"], m["searches"]) == (3.0, 1.0, 5.0)
    text = TOK.decode(engine.calls[1].prompt_ids)
    assert "[r6] Error: the tool call is not valid JSON (Expecting value at character 0)" in text
    assert "[r7] Error: the tool call must be a JSON object, got list" in text
    assert "[r8] Error: a <tool_call> block was not closed with </tool_call>" in text
    assert "[r9] Error: at most 5 tool calls run per turn; 1 more were not run." in text
    # excess_tool_calls=drop (MemAct-Anonymized @ 9b65b84a, mem_agent_loop.py MemAgentLoop.run runs
    # tool_calls[:max_parallel_calls]): the sixth call is skipped without a message; still counted
    traj, engine = run_one([r0, "FINAL_ANSWER: x"], max_turn_tokens=2000, excess_tool_calls="drop")
    text = TOK.decode(engine.calls[1].prompt_ids)
    assert traj.metrics["dropped_calls"] == 1.0 and "tool calls run per turn" not in text and "[r9]" not in text
    assert "[r8] Error: a <tool_call> block was not closed with </tool_call>" in text
    with pytest.raises(ValueError, match="excess_tool_calls must be reply_error or drop, got 'skip'"):
        cfg(excess_tool_calls="skip")


def test_long_tool_output_is_truncated_in_the_middle():
    doc = Document("d", "", "x " + "A" * 30 + "B" * 30)
    traj, engine = run_one([call("search", query="x"), "FINAL_ANSWER: x"],
                           retriever=KeywordRetriever([doc]), max_tool_response_chars=20)
    body = 'Search results for "x":\n\n(1) x ' + "A" * 30 + "B" * 30
    assert len(body) == 91
    want = body[:10] + "\n...[71 characters truncated]...\n" + body[-10:]
    assert engine.calls[1].prompt_ids == head() + asst(call("search", query="x")) + tool("[r1] " + want) + HDR
    assert traj.metrics["tool_truncations"] == 1.0


def test_published_truncation_keeps_half_the_budget_from_each_end_around_the_given_marker():
    """tool_truncation_marker (MemAct-Anonymized @ 9b65b84a, mem_agent_loop.py MemAgentLoop._call_tool,
    truncate side "middle"): length = max // 2; text[:length] + marker + text[-length:]."""
    doc = Document("d", "", "x " + "A" * 30 + "B" * 30)
    body = 'Search results for "x":\n\n(1) x ' + "A" * 30 + "B" * 30  # 91 characters
    r = [call("search", query="x"), "FINAL_ANSWER: x"]
    # an odd budget, 21: memrl keeps 10 + 11 characters and names the 70 cut
    _, engine = run_one(r, retriever=KeywordRetriever([doc]), max_tool_response_chars=21)
    want = body[:10] + "\n...[70 characters truncated]...\n" + body[-11:]
    assert engine.calls[1].prompt_ids == head() + asst(r[0]) + tool("[r1] " + want) + HDR
    # published: 21 // 2 = 10 from each end around the marker
    traj, engine = run_one(r, retriever=KeywordRetriever([doc]), max_tool_response_chars=21,
                           tool_truncation_marker="...(cut)...")
    want = body[:10] + "...(cut)..." + body[-10:]
    assert want == 'Search res...(cut)...BBBBBBBBBB'
    assert engine.calls[1].prompt_ids == head() + asst(r[0]) + tool("[r1] " + want) + HDR
    assert traj.metrics["tool_truncations"] == 1.0


def test_published_tool_result_format_by_hand(tmp_path):
    """tool_result_format=published (MemAct-Anonymized @ 9b65b84a): a search result is
    json.dumps({"success": True, "tool_call_id": ID, "result": <the service's result lists>}) with its
    \\uXXXX escapes turned back into characters (verl/tools/utils/search_r1_like_utils.py
    perform_single_search_batch, DCPO/tool_service/search_tool_single.py); a prune result is
    json.dumps({"success": ..., "message": ..., "tool_call_id": ID}) (mem_agent_loop.py
    prune_actual_messages_prompt_ids). memrl's ID: sha256("<task id>:<counter>")[:8]:
    sha256("t1:1") = 4db5deff..., "t1:2" = 19bbd547..., "t1:3" = 73dc1133...; texts from the user's file."""
    texts = tmp_path / "texts.json"
    texts.write_text(json.dumps({"prune_done": "Deleted {n} records.", "prune_no_ids_or_memory": "Need both."}))
    doc = Document("z1", "Zürich", "Zürich lies on a lake.")
    r = [call("search", query="Zürich", topk=1),                       # t0 -> 4db5deff
         call("prune_context", memory="m", delete_ids=[]),             # t1 -> 19bbd547: fails, nothing given
         call("prune_context", memory="m", delete_ids=["4db5deff"]),   # t2 -> 73dc1133: removes t0's result
         "FINAL_ANSWER: x"]
    traj, engine = run_one(r, retriever=KeywordRetriever([doc]), tool_result_format="published",
                           tool_texts_file=str(texts))
    # json.dumps writes "Z\u00fcrich"; the public tool turns the escape back into "ü"; no "[rK] " prefix
    t1 = ('{"success": true, "tool_call_id": "4db5deff", "result": [[{"document": {"title": "Zürich", '
          '"text": "Zürich lies on a lake."}}]]}')
    t2 = '{"success": false, "message": "Need both.", "tool_call_id": "19bbd547"}'
    t3 = '{"success": true, "message": "Deleted 1 records.", "tool_call_id": "73dc1133"}'
    assert engine.calls[1].prompt_ids == head() + asst(r[0]) + tool(t1) + HDR
    assert engine.calls[2].prompt_ids == head() + asst(r[0]) + tool(t1) + asst(r[1]) + tool(t2) + HDR
    # the id names the search result exactly (prune_id_match=exact): it goes, and turn 0 with it
    assert engine.calls[3].prompt_ids == head() + asst(r[1]) + tool(t2) + asst(r[2]) + tool(t3) + HDR
    assert traj.segments[0].info["deleted"] == ["4db5deff"] and traj.final_answer == "x"
    with pytest.raises(ValueError, match="tool_texts_file .*unknown key\\(s\\) prune"):
        (tmp_path / "bad.json").write_text('{"prune": "x"}')
        cfg(tool_texts_file=str(tmp_path / "bad.json"))


def test_search_failure_names_the_endpoint_and_is_counted():
    failing = KeywordRetriever(DOCS, fail_with="POST http://127.0.0.1:9/retrieve: connection refused")
    traj, engine = run_one([call("search", query="France", topk=50), "FINAL_ANSWER: x"], retriever=failing)
    assert "[r1] Error: search failed: POST http://127.0.0.1:9/retrieve: connection refused" in \
        TOK.decode(engine.calls[1].prompt_ids)
    assert traj.metrics["search_errors"] == 1.0 and traj.metrics["topk_clamped"] == 1.0
    assert failing.calls == [(["France"], 20)]


def test_stops_on_max_turns_and_on_the_context_budget():
    loop = call("search", query="France", topk=1)
    traj, engine = run_one([loop] * 3, max_assistant_turns=3)
    assert len(engine.calls) == 3 and traj.info["stop"] == "max_turns" and traj.final_answer == ""
    assert traj.segments[0].response_ids[-len(gen(loop)):] == gen(loop)  # trailing tool output not in the row
    budget = len(head()) + len(HDR) + len(asst(loop)) + 10
    traj, engine = run_one([loop] * 3, max_context_tokens=budget)
    assert len(engine.calls) == 1 and traj.info["stop"] == "context_budget"
    assert traj.metrics["stop_context_budget"] == 1.0
    traj, engine = run_one([loop], max_context_tokens=5)  # no turn fits: counted, no segment, no crash
    assert engine.calls == [] and traj.segments == [] and traj.metrics["stop_context_budget"] == 1.0


def test_native_tools_template_gets_the_schemas():
    class ToolsTokenizer(CharTokenizer):
        def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, tools=None, **kw):
            text = super().apply_chat_template(messages, False, add_generation_prompt)
            if tools:
                text = "<tools>" + ",".join(t["function"]["name"] for t in tools) + "</tools>" + text
            return self.encode(text) if tokenize else text

    register_retriever("kw_test", KeywordRetriever(DOCS))
    engine = ScriptedEngine(["FINAL_ANSWER: x"], tokenizer=ToolsTokenizer())
    traj = asyncio.run(run(Task("t1", "Q", "", ["x"]), engine, cfg(), random.Random(0)))
    assert engine.calls[0].prompt_text == f"<tools>search,prune_context</tools><system>S</system><user>Q|{FMT}</user><assistant>"
    assert traj.metrics["native_tools_template"] == 1.0


def test_registered_and_multiq_reward_through_rollout():
    spec = get_workflow("memact")
    register_retriever("kw_test", KeywordRetriever(DOCS))
    task = Task("m1", "1. capital of France? 2. of Germany?", "", ["Paris", "Berlin"],
                meta={"sub_questions": ["capital of France?", "of Germany?"], "sub_answers": [["Paris"], ["Berlin"]]})
    engine = ScriptedEngine(['FINAL_ANSWER: {"1": "Paris", "2": "Berlin"}'])
    (group,) = rollout_once([task], spec, engine, cfg())
    (traj,) = group.trajectories
    assert traj.reward == 1.0 and traj.metrics["multiq_all_correct"] == 1.0
    assert '"1": "<answer 1>", "2": "<answer 2>"' in engine.calls[0].prompt_text


def test_async_and_failing_rewards_in_the_rollout_runner():
    import dataclasses

    base = get_workflow("memact")
    register_retriever("kw_test", KeywordRetriever(DOCS))
    task = Task("a", "Q", "", ["x"])

    async def judged(task, traj):
        await asyncio.sleep(0)
        return 0.25

    def broken(task, traj):
        raise ConnectionError("judge at http://127.0.0.1:9 unreachable")

    (g,) = rollout_once([task], dataclasses.replace(base, reward=judged), ScriptedEngine(["A"]), cfg())
    assert g.trajectories[0].reward == 0.25
    (g,) = rollout_once([task], dataclasses.replace(base, reward=broken), ScriptedEngine(["A"]), cfg())
    assert g.trajectories[0].reward == 0.0 and g.trajectories[0].metrics["reward_error"] == 1.0


def test_chatml_tokenizer_context_is_the_concatenation_of_message_ids():
    """With the tiny models' real tokenizer: EOS (<|im_end|>) is sampled, only '\\n' is appended after it,
    and the context after a prune is the concatenation of the kept messages' ids."""
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    register_retriever("kw_test", KeywordRetriever(DOCS))
    r = [call("search", query="France", topk=1), call("prune_context", memory="Paris", delete_ids=["r1"]),
         "FINAL_ANSWER: Paris"]
    engine = ScriptedEngine(r, tokenizer=tok)
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, cfg(), random.Random(0)))

    def e(text):
        return tok.encode(text, add_special_tokens=False)

    head_ids = e("<|im_start|>system\nS" + tools_fallback_text([SEARCH_SCHEMA, PRUNE_SCHEMA])
                 + f"<|im_end|>\n<|im_start|>user\nQ|{FMT}<|im_end|>\n")
    hdr, nl = e("<|im_start|>assistant\n"), e("\n")
    g = [tok.encode(x) + [tok.eos_token_id] for x in r]
    t1 = e("<|im_start|>tool\n[r1] " + results("France", DOCS[0]) + "<|im_end|>\n")
    t2 = e("<|im_start|>tool\n[r2] Removed r1. Your memory note stays in your prune_context call above.<|im_end|>\n")
    assert engine.calls[1].prompt_ids == head_ids + hdr + g[0] + nl + t1 + hdr
    assert engine.calls[2].prompt_ids == head_ids + hdr + g[1] + nl + t2 + hdr
    s1, fin = traj.segments
    assert s1.response_ids == g[0] + nl + t1 + hdr + g[1]
    assert fin.prompt_ids == engine.calls[2].prompt_ids and fin.response_ids == g[2]
    assert traj.reward is None and traj.final_answer == "Paris"


def test_task_scope_searches_the_tasks_own_documents():
    """retriever_scope=task: BM25 over task.meta["documents"] (texts or rows), never the shared retriever."""
    rows = [{"id": "x1", "title": "Oslo", "text": "Oslo is the capital of Norway."}, "Lima is the capital of Peru."]
    task = Task("t9", "Q", "", ["Oslo"], meta={"documents": rows})
    r0 = call("search", query="capital of Norway", topk=1)
    traj, engine = run_one([r0, "FINAL_ANSWER: Oslo"], task=task, retriever_scope="task")
    oslo = Document("x1", "Oslo", rows[0]["text"])
    assert engine.calls[1].prompt_ids == head() + asst(r0) + tool("[r1] " + results("capital of Norway", oslo)) + HDR
    assert traj.final_answer == "Oslo" and traj.metrics["searches"] == 1.0
    r0 = call("search", query="Peru", topk=1)
    traj, engine = run_one([r0, "FINAL_ANSWER: Lima"], task=task, retriever_scope="task")
    lima = '[r1] Search results for "Peru":\n\n(1) Lima is the capital of Peru.'  # a text row: no title
    assert engine.calls[1].prompt_ids == head() + asst(r0) + tool(lima) + HDR


def test_task_scope_without_documents_names_the_task():
    import pytest

    with pytest.raises(ValueError, match="task 't1'.*documents"):
        run_one(["FINAL_ANSWER: x"], retriever_scope="task")
    with pytest.raises(ValueError, match=r"documents\[1\]"):
        run_one(["FINAL_ANSWER: x"], task=Task("t2", "Q", "", ["x"], meta={"documents": ["a b", {"title": "no text"}]}),
                retriever_scope="task")
    with pytest.raises(ValueError, match="retriever_scope"):
        cfg(retriever_scope="everywhere")


def test_segments_carry_the_oldest_policy_version_of_their_turns():
    """Asynchronous training: turn k runs under policy version k here (a sync between every two calls);
    each row is labelled with the oldest version among its turns (memrl.engines.versioned)."""
    from memrl.engines.versioned import VERSION_KEY, VersionedEngine

    class EverySync(VersionedEngine):
        async def generate(self, prompt_ids, sampling):
            out = await super().generate(prompt_ids, sampling)
            self.version += 1  # the next call runs on the next version
            return out

    r = [
        call("search", query="France", topk=1),                                    # t0 -> r1
        call("prune_context", memory="m1", delete_ids=["r1"]),                      # t1
        call("search", query="Germany", topk=1) + call("search", query="Italy", topk=1),  # t2
        call("prune_context", memory="m2", delete_ids=["r3"]),                      # t3
        call("prune_context", memory="m3", delete_ids=["r4"]),                      # t4
        "FINAL_ANSWER: Paris",                                                      # t5
    ]
    register_retriever("kw_test", KeywordRetriever(DOCS))
    engine = EverySync(ScriptedEngine(r), version=0)
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, cfg(), random.Random(0)))
    assert [s.info["turns"] for s in traj.segments] == [[0, 1], [2, 3], [4], [5]]
    assert [s.info[VERSION_KEY] for s in traj.segments] == [0, 2, 4, 5]
