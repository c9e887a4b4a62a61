"""The MemAct rollout switches (MemActConfig's "rollout rules" block): memrl's default and the published
value of each, on hand-made replies through the scripted engine and the character tokenizer (one token
per character, so every context and segment is written out by hand). Published behaviour: upstream
verl/experimental/agent_loop/mem_agent_loop.py (MemAgentLoop.run, prune_actual_messages_prompt_ids)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.services.base import Document
from memrl.tools.calls import tools_fallback_text
from memrl.tools.search import PRUNE_SCHEMA, SEARCH_SCHEMA, register_retriever
from memrl.types import Task
from memrl.workflows.memact import MemActConfig, run

TOK = CharTokenizer()
DOCS = [Document("d1", "Paris", "Paris is the capital of France."),
        Document("d2", "Berlin", "Berlin is the capital of Germany.")]
FMT = "End with one line: FINAL_ANSWER: <short answer>."
NOTE = "Your memory note stays in your prune_context call above."


def enc(text: str) -> list[int]:
    return TOK.encode(text)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def head(prune: bool = True) -> list[int]:
    tools = [SEARCH_SCHEMA, PRUNE_SCHEMA] if prune else [SEARCH_SCHEMA]
    system = "S" if prune else "N"
    return enc(f"<system>{system}" + tools_fallback_text(tools) + f"</system><user>Q|{FMT}</user>")


HDR, END = enc("<assistant>"), enc("</assistant>")


def gen(reply: str) -> list[int]:
    return enc(reply) + [TOK.eos_token_id]


def asst(reply: str) -> list[int]:
    return HDR + gen(reply) + END


def tool(content: str) -> list[int]:
    return enc(f"<tool>{content}</tool>")


def found(query: str, doc: Document) -> str:
    return f'Search results for "{query}":\n\n(1) {doc.title}\n{doc.text}'


def run_one(replies: list[str], **kw):
    register_retriever("kw_switch", KeywordRetriever(DOCS))
    base = dict(retriever_kind="kw_switch", no_prune_prob=0.0, temperature=0.0, max_turn_tokens=400,
                system_template="S", system_noprune_template="N", user_template="{question}|{answer_format}")
    engine = ScriptedEngine(replies)
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, MemActConfig(**{**base, **kw}), random.Random(0)))
    return traj, engine


def test_switch_values_are_checked():
    with pytest.raises(ValueError, match="unparsable_tool_calls must be reply_error or end, got 'stop'"):
        MemActConfig(unparsable_tool_calls="stop")
    with pytest.raises(ValueError, match="unknown_tool_calls must be reply_error or end, got 'skip'"):
        MemActConfig(unknown_tool_calls="skip")
    with pytest.raises(ValueError, match="prune_id_match must be exact or substring, got 'prefix'"):
        MemActConfig(prune_id_match="prefix")


# ---------------------------------------------------------------- unparsable_tool_calls
def test_a_reply_with_no_parsable_call_ends_the_trajectory_only_under_end():
    bad = "<tool_call>not json</tool_call>"
    r = [bad, "FINAL_ANSWER: Paris"]
    # memrl: an error message answers the block and the loop goes on to the answer
    traj, engine = run_one(r)
    err = tool("[r1] Error: the tool call is not valid JSON (Expecting value at character 0). Write each call as "
               '<tool_call>{"name": ..., "arguments": {...}}</tool_call>.')
    assert engine.calls[1].prompt_ids == head() + asst(bad) + err + HDR
    assert (traj.info["stop"], traj.final_answer, traj.metrics["turns"]) == ("answer", "Paris", 2.0)
    # published: the reply is the last one; its text is the answer (no FINAL_ANSWER in it)
    traj, engine = run_one(r, unparsable_tool_calls="end")
    assert len(engine.calls) == 1
    assert (traj.info["stop"], traj.final_answer, traj.metrics["turns"]) == ("unparsable_calls", "", 1.0)
    assert traj.info["answer_text"] == bad
    m = traj.metrics
    assert (m["malformed_calls"], m["stop_unparsable_calls"], m["stop_answer"]) == (1.0, 1.0, 0.0)
    (seg,) = traj.segments
    assert seg.prompt_ids == head() + HDR and seg.response_ids == gen(bad) and seg.loss_mask == [1] * len(gen(bad))


def test_malformed_blocks_beside_a_good_call_get_no_reply_under_end():
    r0 = "<tool_call>[1]</tool_call>" + call("search", query="France", topk=1)
    traj, engine = run_one([r0, "FINAL_ANSWER: Paris"], unparsable_tool_calls="end")
    # the search runs (r1); the malformed block is counted, not answered
    assert engine.calls[1].prompt_ids == head() + asst(r0) + tool("[r1] " + found("France", DOCS[0])) + HDR
    assert (traj.metrics["malformed_calls"], traj.metrics["searches"], traj.final_answer) == (1.0, 1.0, "Paris")
    # memrl's default answers it after the call's result
    _, engine = run_one([r0, "FINAL_ANSWER: Paris"])
    assert "[r2] Error: the tool call must be a JSON object, got list" in TOK.decode(engine.calls[1].prompt_ids)


# ---------------------------------------------------------------- unknown_tool_calls
def test_a_call_to_an_unknown_tool_ends_the_trajectory_only_under_end():
    r0 = call("browse", url="x") + call("search", query="France", topk=1)
    traj, engine = run_one([r0, "FINAL_ANSWER: Paris"])
    err = tool("[r1] Error: unknown tool 'browse'; available tools: search, prune_context.")
    assert engine.calls[1].prompt_ids == head() + asst(r0) + err + tool("[r2] " + found("France", DOCS[0])) + HDR
    assert (traj.info["stop"], traj.final_answer) == ("answer", "Paris")
    # published: the search still runs, then the loop ends on this reply
    traj, engine = run_one([r0, "FINAL_ANSWER: Paris"], unknown_tool_calls="end")
    assert len(engine.calls) == 1 and traj.info["stop"] == "tool_error" and traj.final_answer == ""
    m = traj.metrics
    assert (m["unknown_tools"], m["searches"], m["stop_tool_error"], m["turns"]) == (1.0, 1.0, 1.0, 1.0)
    assert traj.info["transcript"][-1]["text"] == "[r1] " + found("France", DOCS[0])
    (seg,) = traj.segments  # the tool output after the last reply is not part of the row
    assert seg.response_ids == gen(r0) and seg.loss_mask == [1] * len(gen(r0))


# ---------------------------------------------------------------- last_turn_runs_tools
def test_the_last_turns_calls_run_only_by_default():
    r = [call("search", query="France", topk=1), call("prune_context", memory="m", delete_ids=["r1"])]
    traj, _ = run_one(r, max_assistant_turns=2)
    # memrl: the prune in turn 2 (the last) runs and closes a segment; the final segment is then empty
    assert (traj.metrics["prunes"], traj.info["stop"], [s.info["kind"] for s in traj.segments]) == (
        1.0, "max_turns", ["prune"])
    traj, _ = run_one(r, max_assistant_turns=2, last_turn_runs_tools=False)
    # published: the limit ends the loop first; the one segment is both turns, up to the prune call
    assert (traj.metrics["prunes"], traj.info["stop"], traj.final_answer) == (0.0, "max_turns", "")
    (seg,) = traj.segments
    assert seg.info["kind"] == "final" and seg.prompt_ids == head() + HDR
    assert seg.response_ids == gen(r[0]) + END + T1 + HDR + gen(r[1])
    assert traj.info["transcript"][-1]["kind"] == "assistant"  # no tool message after the last reply


# ---------------------------------------------------------------- prune_id_match, prune_turns_deletable
R = [
    call("search", query="France", topk=1),                          # t0 -> r1
    call("search", query="Germany", topk=1),                         # t1 -> r2
    call("prune_context", memory="m1", delete_ids=["r1", "nope"]),   # t2 -> r3
    call("prune_context", memory="m2", delete_ids=["r3"]),           # t3 -> r4
    "FINAL_ANSWER: Paris",                                           # t4
]
T1, T2 = tool("[r1] " + found("France", DOCS[0])), tool("[r2] " + found("Germany", DOCS[1]))


def test_exact_ids_fail_the_whole_prune_on_one_unknown_id():
    traj, engine = run_one(R)
    err = tool("[r3] Error: unknown result id(s) nope; current ids: r1, r2. Nothing was removed.")
    assert engine.calls[3].prompt_ids == head() + asst(R[0]) + T1 + asst(R[1]) + T2 + asst(R[2]) + err + HDR
    assert (traj.metrics["failed_prunes"], traj.metrics["prunes"]) == (1.0, 1.0)


def test_substring_ids_delete_what_matches_and_ignore_the_rest():
    # "r1" occurs in r1's text ("[r1] ..."), nowhere else; "nope" matches nothing and is ignored: r1 goes and
    # t0 with it. Then "r3" matches the prune's own result "[r3] Removed r1. ...": it goes; the prune turn t2
    # stays by default (its memory lives there) ...
    traj, engine = run_one(R, prune_id_match="substring")
    T3 = tool(f"[r3] Removed r1. {NOTE}")
    T4 = tool(f"[r4] Removed r3. {NOTE}")
    assert engine.calls[3].prompt_ids == head() + asst(R[1]) + T2 + asst(R[2]) + T3 + HDR
    assert engine.calls[4].prompt_ids == head() + asst(R[1]) + T2 + asst(R[2]) + asst(R[3]) + T4 + HDR
    assert (traj.metrics["failed_prunes"], traj.metrics["prunes"]) == (0.0, 2.0)
    # ... and goes with its result when prune turns are deletable (published): memory m1 is gone
    traj, engine = run_one(R, prune_id_match="substring", prune_turns_deletable=True)
    assert engine.calls[4].prompt_ids == head() + asst(R[1]) + T2 + asst(R[3]) + T4 + HDR
    assert traj.segments[1].info["removed_turns"] == [2]


def test_substring_matches_longer_ids_and_any_text_that_mentions_one():
    # "r1" is a substring of "[r12] ..." too: ids r1..r12 from twelve searches; deleting ["r1"] takes r1, r10,
    # r11 and r12 (and the four turns that made them)
    searches = [call("search", query="France", topk=1) for _ in range(12)]
    prune = call("prune_context", memory="m", delete_ids=["r1"])
    traj, engine = run_one([*searches, prune, "FINAL_ANSWER: Paris"], prune_id_match="substring")
    assert traj.segments[0].info["deleted"] == ["r1", "r10", "r11", "r12"]
    assert traj.segments[0].info["removed_turns"] == [0, 9, 10, 11]
    text = TOK.decode(engine.calls[-1].prompt_ids)
    assert "[r13] Removed r1, r10, r11, r12." in text and "[r2] " in text and "[r12] Search" not in text


def test_prune_turn_protection_is_the_default_under_exact_ids_too():
    r = [call("search", query="France", topk=1),
         call("prune_context", memory="m1", delete_ids=["r1"]),      # t1 -> r2
         call("prune_context", memory="m2", delete_ids=["r2"]),      # t2 -> r3: r2 was t1's only result
         "FINAL_ANSWER: Paris"]
    T3 = tool(f"[r3] Removed r2. {NOTE}")  # r2 ("Removed r1. ...") is gone: t1 keeps only its call text
    _, engine = run_one(r)
    assert engine.calls[3].prompt_ids == head() + asst(r[1]) + asst(r[2]) + T3 + HDR
    traj, engine = run_one(r, prune_turns_deletable=True)
    assert engine.calls[3].prompt_ids == head() + asst(r[2]) + T3 + HDR
    assert traj.info["memories"] == ["m1", "m2"]  # still recorded in the trajectory, gone from the context


# ---------------------------------------------------------------- failed_prune_closes_segment
def test_a_failed_prune_closes_a_segment_only_when_switched_on():
    r = [call("search", query="France", topk=1), call("prune_context", memory="m", delete_ids=["r9"]),
         "FINAL_ANSWER: Paris"]
    T2 = tool("[r2] Error: unknown result id(s) r9; current ids: r1. Nothing was removed.")
    ctx = head() + asst(r[0]) + T1 + asst(r[1]) + T2 + HDR  # the context is unchanged either way
    traj, engine = run_one(r)
    assert engine.calls[2].prompt_ids == ctx
    (seg,) = traj.segments
    assert seg.info["kind"] == "final" and seg.prompt_ids == head() + HDR
    traj, engine = run_one(r, failed_prune_closes_segment=True)
    assert engine.calls[2].prompt_ids == ctx
    first, final = traj.segments
    assert first.info == {"kind": "failed_prune", "prune_turn": 1, "turns": [0, 1]}
    assert first.prompt_ids == head() + HDR
    assert first.response_ids == gen(r[0]) + END + T1 + HDR + gen(r[1])
    assert first.loss_mask == [1] * len(gen(r[0])) + [0] * len(END + T1 + HDR) + [1] * len(gen(r[1]))
    # the final segment starts after the failed prune turn: the earlier turns are its prompt (mask 0)
    assert final.prompt_ids == ctx and final.response_ids == gen(r[2]) and final.info["turns"] == [2]
    assert (traj.metrics["failed_prunes"], traj.metrics["prunes"], traj.metrics["segments"]) == (1.0, 0.0, 2.0)


# ---------------------------------------------------------------- withheld_prune_runs
def test_a_prune_call_in_a_withheld_rollout_runs_only_when_switched_on():
    r = [call("search", query="France", topk=1), call("prune_context", memory="m", delete_ids=["r1"]),
         "FINAL_ANSWER: Paris"]
    traj, engine = run_one(r, prune_tool=False)
    err = tool("[r2] Error: unknown tool 'prune_context'; available tools: search.")
    assert engine.calls[2].prompt_ids == head(False) + asst(r[0]) + T1 + asst(r[1]) + err + HDR
    assert (traj.metrics["unknown_tools"], traj.metrics["prunes"], len(traj.segments)) == (1.0, 0.0, 1)
    traj, engine = run_one(r, prune_tool=False, withheld_prune_runs=True)
    # the prompt still offers search only, but the call prunes: r1 and t0 go, the prune turn stays
    assert engine.calls[2].prompt_ids == head(False) + asst(r[1]) + tool(f"[r2] Removed r1. {NOTE}") + HDR
    m = traj.metrics
    assert (m["prune_withheld"], m["unknown_tools"], m["prunes"], len(traj.segments)) == (1.0, 0.0, 1.0, 2)


# ---------------------------------------------------------------- final_segment
def test_the_final_row_trains_the_whole_final_context_only_under_whole_context():
    """final_segment=whole_context: MemAct-Anonymized @ 9b65b84a, mem_agent_loop.py MemAgentLoop.run builds
    the last row with get_trajactories(actual_messages, -1): the first prompt, then every message of the
    final working context, mask 1 on every assistant turn (prune_num -1), 0 on tool results."""
    r = [call("search", query="France", topk=1),                   # t0 -> r1
         call("prune_context", memory="m", delete_ids=["r1"]),     # t1 -> r2; t0 and r1 go
         call("search", query="Germany", topk=1),                  # t2 -> r3
         "FINAL_ANSWER: Paris"]                                    # t3
    TP, T3 = tool(f"[r2] Removed r1. {NOTE}"), tool("[r3] " + found("Germany", DOCS[1]))
    final_ctx = head() + asst(r[1]) + TP + asst(r[2]) + T3 + HDR
    traj, engine = run_one(r)
    assert engine.calls[3].prompt_ids == final_ctx
    prune_row, fin = traj.segments
    # memrl: the turns after the prune (t2, t3); the kept prune turn t1 is prompt
    assert fin.prompt_ids == head() + asst(r[1]) + TP + HDR
    assert fin.response_ids == gen(r[2]) + END + T3 + HDR + gen(r[3])
    assert fin.loss_mask == [1] * len(gen(r[2])) + [0] * len(END + T3 + HDR) + [1] * len(gen(r[3]))
    assert fin.info["turns"] == [2, 3]
    assert sum(s.num_trained_tokens for s in traj.segments) == sum(len(gen(x)) for x in r)  # each once

    traj2, engine2 = run_one(r, final_segment="whole_context")
    assert [c.prompt_ids for c in engine2.calls] == [c.prompt_ids for c in engine.calls]  # same rollout
    prune_row2, fin2 = traj2.segments
    assert (prune_row2.prompt_ids, prune_row2.response_ids, prune_row2.loss_mask) == (
        prune_row.prompt_ids, prune_row.response_ids, prune_row.loss_mask)  # the prune row is unchanged
    # published: the first prompt, then t1 (the prune call with the memory), its result, t2, r3, t3
    assert fin2.prompt_ids == head() + HDR
    assert fin2.response_ids == gen(r[1]) + END + TP + HDR + gen(r[2]) + END + T3 + HDR + gen(r[3])
    assert fin2.loss_mask == ([1] * len(gen(r[1])) + [0] * len(END + TP + HDR) + [1] * len(gen(r[2]))
                              + [0] * len(END + T3 + HDR) + [1] * len(gen(r[3])))
    assert fin2.info["turns"] == [1, 2, 3]
    # the prune turn t1 trains twice: in its prune row and in the final row
    assert sum(s.num_trained_tokens for s in traj2.segments) == sum(len(gen(x)) for x in r) + len(gen(r[1]))

    # a trajectory that ends on a prune turn (turn limit 2): memrl has no final row, published re-trains
    # the kept prune turn t1 (t0 went with r1; what follows t1's last sampled token is cut)
    r2 = r[:2]
    traj3, _ = run_one(r2, max_assistant_turns=2)
    assert [s.info["kind"] for s in traj3.segments] == ["prune"]
    traj4, _ = run_one(r2, max_assistant_turns=2, final_segment="whole_context")
    prune4, fin4 = traj4.segments
    assert fin4.prompt_ids == head() + HDR and fin4.response_ids == gen(r[1])
    assert fin4.loss_mask == [1] * len(gen(r[1])) and fin4.info["turns"] == [1]
    with pytest.raises(ValueError, match="final_segment must be one of after_last_prune, whole_context"):
        MemActConfig(final_segment="all")


# ---------------------------------------------------------------- answer_source
def test_the_answer_is_read_from_the_whole_final_context_only_under_final_context():
    """answer_source=final_context: MemAct-Anonymized @ 9b65b84a, agent_loop.py
    AgentLoopManager.generate_sequences scores tokenizer.decode(output[-1].response_ids) (special tokens
    kept): the final row's response, i.e. every message after the first prompt; mem_agent.py
    extract_solution_str reads after its last "FINAL_ANSWER: "."""
    r0 = "FINAL_ANSWER: Paris " + call("search", query="France", topk=1)  # a marker in a tool-call turn
    r = [r0, "done"]                                                     # the last reply has none
    traj, _ = run_one(r, require_final_answer=True)
    assert (traj.info["stop"], traj.final_answer, traj.metrics["no_final_marker"]) == ("answer", "", 1.0)
    assert traj.info["answer_text"] == "done"
    traj, _ = run_one(r, require_final_answer=True, answer_source="final_context")
    # the decoded context after the head, special tokens kept (the character tokenizer writes EOS as
    # "<eos>"): <assistant>r0<eos></assistant><tool>[r1] ...</tool><assistant>done<eos></assistant>; the
    # text after "FINAL_ANSWER: ", stripped ("<|im_end|>" is not in it)
    expected = ("Paris " + call("search", query="France", topk=1) + "<eos></assistant><tool>[r1] "
                + found("France", DOCS[0]) + "</tool><assistant>done<eos></assistant>")
    assert (traj.final_answer, traj.metrics["no_final_marker"]) == (expected, 0.0)
    assert traj.info["last_reply"] == "done" and traj.info["answer_text"].endswith("<assistant>done<eos></assistant>")
    with pytest.raises(ValueError, match="answer_source must be one of last_reply, final_context"):
        MemActConfig(answer_source="segment")


# ---------------------------------------------------------------- turn_tokens, deleted_call_text
class EndMarkTokenizer(CharTokenizer):
    """The character tokenizer with a ChatML-like template: "$" is the end-of-turn token (the EOS the engine
    samples), a message is "<r>content$\\n" (r: the role's first letter), a run of tool messages is one user
    turn "<u>[...][...]$\\n", the generation prompt "<a>". So the assistant end is "$\\n" (a newline after
    the EOS, like ChatML's after <|im_end|>), and every context below is enc() of one string."""

    eos_token_id = ord("$") + CharTokenizer.OFFSET

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text = super().decode(ids)
        return text.replace("$", "") if skip_special_tokens else text

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        out = ""
        for i, m in enumerate(messages):
            if m["role"] == "tool":
                first = i == 0 or messages[i - 1]["role"] != "tool"
                last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                out += ("<u>" if first else "") + "[" + m["content"] + "]" + ("$\n" if last else "")
            else:
                out += f"<{m['role'][0]}>" + m["content"] + "$\n"
        if add_generation_prompt:
            out += "<a>"
        return self.encode(out) if tokenize else out


def run_marked(replies: list[str], **kw):
    register_retriever("kw_switch", KeywordRetriever(DOCS))
    base = dict(retriever_kind="kw_switch", no_prune_prob=0.0, temperature=0.0, max_turn_tokens=400,
                system_template="S", system_noprune_template="N", user_template="{question}|{answer_format}")
    engine = ScriptedEngine(replies, tokenizer=EndMarkTokenizer())
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, MemActConfig(**{**base, **kw}), random.Random(0)))
    return traj, engine


def pcall(name: str, **arguments) -> str:
    """A call written the way the published loop writes it back (open tag, newline, json.dumps, newline,
    close tag, newline), so a cut finds it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>\n"


A, B = "[r1] " + found("France", DOCS[0]), "[r2] " + found("Germany", DOCS[1])


def test_reencoded_turns_drop_the_newline_after_the_end_and_render_a_turns_results_together():
    """turn_tokens=reencoded: MemAct-Anonymized @ 9b65b84a, mem_agent_loop.py MemAgentLoop.run decodes the
    sampled ids but the last, renders the text as an assistant message and keeps its ids after the header
    but the last (the newline after the end token); a turn's tool messages go through the template in one
    call (here one "<u>" turn)."""
    r0 = call("search", query="France", topk=1) + call("search", query="Germany", topk=1)
    r = [r0, "FINAL_ANSWER: Paris"]
    traj, engine = run_marked(r)
    H = engine.calls[0].prompt_ids  # the first prompt and "<a>" (not under test here)
    # memrl: the sampled ids, "$" (the EOS) then the end's "\n"; each result its own user turn
    assert engine.calls[1].prompt_ids == H + enc(r0 + "$\n" + f"<u>[{A}]$\n<u>[{B}]$\n<a>")
    traj2, engine2 = run_marked(r, turn_tokens="reencoded")
    assert engine2.calls[0].prompt_ids == H
    # published: r0 + "$" (the "\n" dropped), both results in one user turn, then the header
    assert engine2.calls[1].prompt_ids == H + enc(r0 + "$" + f"<u>[{A}][{B}]$\n<a>")
    (seg,) = traj2.segments
    between = f"<u>[{A}][{B}]$\n<a>"
    assert seg.prompt_ids == H and seg.response_ids == enc(r0 + "$" + between + r[1] + "$")
    n0, n1 = len(r0) + 1, len(r[1]) + 1  # each turn's text and its "$", mask 1
    assert seg.loss_mask == [1] * n0 + [0] * len(between) + [1] * n1
    # every trained id is the sampled one (decode / encode round-trips here): the engine's -0.5 on each
    assert seg.response_logprobs == [-0.5] * n0 + [0.0] * len(between) + [-0.5] * n1
    assert (traj2.metrics["reencoded_unsampled_tokens"], traj2.final_answer) == (0.0, "Paris")


def test_a_reencoded_turn_cut_at_the_budget_loses_its_last_sampled_token():
    # the engine stops at max_turn_tokens=10: gen = "FINAL_ANSW" (no EOS); the published loop drops the last
    # id ("W") and the template adds "$": "FINAL_ANS$", whose "$" was never sampled (logprob 0.0, counted)
    traj, _ = run_marked(["FINAL_ANSWER: Paris"], max_turn_tokens=10)
    (seg,) = traj.segments
    assert (seg.response_ids, seg.response_logprobs) == (enc("FINAL_ANSW"), [-0.5] * 10)
    traj, _ = run_marked(["FINAL_ANSWER: Paris"], max_turn_tokens=10, turn_tokens="reencoded")
    (seg,) = traj.segments
    assert seg.response_ids == enc("FINAL_ANS$") and seg.loss_mask == [1] * 10
    assert seg.response_logprobs == [-0.5] * 9 + [0.0]
    assert traj.metrics["reencoded_unsampled_tokens"] == 1.0


def test_a_partial_delete_cuts_the_deleted_calls_text_only_under_cut():
    """deleted_call_text=cut: mem_agent_loop.py prune_actual_messages_prompt_ids removes from a kept turn's
    content each deleted call as restore_as_text writes it back, then rebuilds the prompt from the text."""
    fr, de = pcall("search", query="France", topk=1), pcall("search", query="Germany", topk=1)
    r = [fr + de,                                                   # t0 -> r1 (France), r2 (Germany)
         call("prune_context", memory="m", delete_ids=["r1"]),      # t1 -> r3; r1 goes, t0 keeps r2
         "FINAL_ANSWER: Paris"]                                     # t2
    P = f"<u>[[r3] Removed r1. {NOTE}]$\n<a>"
    traj, engine = run_marked(r, turn_tokens="reencoded")
    H = engine.calls[0].prompt_ids
    # keep: t0's text whole, its France call left without a result
    assert engine.calls[2].prompt_ids == H + enc(fr + de + "$" + f"<u>[{B}]$\n<a>" + r[1] + "$" + P)
    assert traj.metrics["cut_calls"] == 0.0
    traj, engine = run_marked(r, turn_tokens="reencoded", deleted_call_text="cut", final_segment="whole_context")
    # cut: t0 is the Germany call alone (the France call's text, with its final newline, removed)
    assert engine.calls[2].prompt_ids == H + enc(de + "$" + f"<u>[{B}]$\n<a>" + r[1] + "$" + P)
    assert traj.metrics["cut_calls"] == 1.0
    # the published final row trains the cut t0 (mask 1): the engine's logprob up to the first id that
    # differs from the sampled text (both open with '<tool_call>\n{"name": "search", "arguments":
    # {"query": "', then "G" vs "F"), 0.0 from there on (counted)
    fin = traj.segments[-1]
    same = len('<tool_call>\n{"name": "search", "arguments": {"query": "')
    n0 = len(de) + 1
    assert fin.prompt_ids == H and fin.response_ids[:n0] == enc(de + "$")
    assert fin.loss_mask[:n0] == [1] * n0
    assert fin.response_logprobs[:n0] == [-0.5] * same + [0.0] * (n0 - same)
    assert traj.metrics["reencoded_unsampled_tokens"] == n0 - same


def test_a_prune_calls_text_is_cut_only_when_prune_turns_are_deletable():
    fr, de = pcall("search", query="France", topk=1), pcall("search", query="Germany", topk=1)
    pr = pcall("prune_context", memory="m1", delete_ids=["r1"])
    r = [fr,                                                        # t0 -> r1
         de + pr,                                                   # t1 -> r2, r3 (r1 and t0 go)
         call("prune_context", memory="m2", delete_ids=["r3"]),     # t2 -> r4: t1 keeps r2 only
         "FINAL_ANSWER: Paris"]
    tail = f"<u>[{B}]$\n<a>" + r[2] + "$" + f"<u>[[r4] Removed r3. {NOTE}]$\n<a>"
    kw = dict(turn_tokens="reencoded", deleted_call_text="cut")
    _, engine = run_marked(r, **kw)  # prune turns protected (memrl): the memory call stays in t1's text
    H = engine.calls[0].prompt_ids
    assert engine.calls[3].prompt_ids == H + enc(de + pr + "$" + tail)
    traj, engine = run_marked(r, prune_turns_deletable=True, **kw)  # published: the prune call (m1) is cut
    assert engine.calls[3].prompt_ids == H + enc(de + "$" + tail)
    assert traj.metrics["cut_calls"] == 1.0


def test_turn_token_switches_are_checked():
    with pytest.raises(ValueError, match="turn_tokens must be one of sampled, reencoded, got 'text'"):
        MemActConfig(turn_tokens="text")
    with pytest.raises(ValueError, match="deleted_call_text must be one of keep, cut, got 'drop'"):
        MemActConfig(deleted_call_text="drop")
    with pytest.raises(ValueError, match="deleted_call_text=cut needs turn_tokens=reencoded"):
        MemActConfig(deleted_call_text="cut")


# ---------------------------------------------------------------- prune_timing
def test_a_prune_reaches_its_own_turns_results_only_in_order():
    r = [call("search", query="France", topk=1),                                         # t0 -> r1
         call("search", query="Germany", topk=1) + call("prune_context", memory="m", delete_ids=["r2"]),
         "FINAL_ANSWER: Paris"]
    traj, engine = run_one(r)
    # memrl: the search runs first (r2), the prune then deletes it; its reply is r3
    done = tool(f"[r3] Removed r2. {NOTE}")
    assert engine.calls[2].prompt_ids == head() + asst(r[0]) + T1 + asst(r[1]) + done + HDR
    assert (traj.metrics["prunes"], traj.metrics["failed_prunes"]) == (1.0, 0.0)
    traj, engine = run_one(r, prune_timing="first")
    # published: the prune runs before the search, when r2 does not exist yet: it fails and its reply takes
    # r2; the search's result then gets r3. The messages follow the calls: the search's result first.
    err = tool("[r2] Error: unknown result id(s) r2; current ids: r1. Nothing was removed.")
    found_r3 = tool("[r3] " + found("Germany", DOCS[1]))
    assert engine.calls[2].prompt_ids == head() + asst(r[0]) + T1 + asst(r[1]) + found_r3 + err + HDR
    assert (traj.metrics["prunes"], traj.metrics["failed_prunes"], traj.final_answer) == (0.0, 1.0, "Paris")
    with pytest.raises(ValueError, match="prune_timing must be one of in_order, first, got 'last'"):
        MemActConfig(prune_timing="last")
