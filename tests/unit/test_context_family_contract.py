"""Contract tests: fold, summarize, sliding_window and memact's fixed-interval pruning against a scripted engine
with a character tokenizer (one token per character, so every context, row and mask is written out by hand),
and the fold contexts with the tiny models' real ChatML tokenizer (token-exact, as MemAct's tests)."""

from __future__ import annotations

import asyncio
import json
import random

import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.config import ConfigError
from memrl.runtime import rollout_once
from memrl.services.base import Document
from memrl.tools.calls import tools_fallback_text
from memrl.tools.search import SEARCH_SCHEMA, register_retriever
from memrl.types import Task
from memrl.workflows import get_workflow, parse_workflow
from memrl.workflows.fold import BRANCH_SCHEMA, RETURN_SCHEMA, FoldConfig
from memrl.workflows.fold import run as fold_run
from memrl.workflows.memact import MemActConfig
from memrl.workflows.memact import run as memact_run
from memrl.workflows.sliding_window import SlidingWindowConfig
from memrl.workflows.sliding_window import run as window_run
from memrl.workflows.summarize import SUMMARY_REQUEST, SummarizeConfig, extract_summary
from memrl.workflows.summarize import run as summarize_run

TOK = CharTokenizer()
EOS = TOK.eos_token_id
DOCS = [
    Document("d1", "Paris", "Paris is the capital of France."),
    Document("d2", "Berlin", "Berlin is the capital of Germany."),
    Document("d3", "Rome", "Rome is the capital of Italy."),
]
FMT = "End with one line: FINAL_ANSWER: <short answer>."
HDR = TOK.encode("<assistant>")
END = TOK.encode("</assistant>")
OPEN = " When done, call return with what you found."


def enc(text: str) -> list[int]:
    return TOK.encode(text)


def call(name: str, **arguments) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def gen(reply: str) -> list[int]:
    return enc(reply) + [EOS]


def asst(reply: str) -> list[int]:
    return HDR + gen(reply) + END


def tool(content: str) -> list[int]:
    return enc(f"<tool>{content}</tool>")


def user(content: str) -> list[int]:
    return enc(f"<user>{content}</user>")


def results(query: str, *docs: Document) -> str:
    return f'Search results for "{query}":\n\n' + "\n\n".join(
        f"({k}) {d.title}\n{d.text}" for k, d in enumerate(docs, 1))


def head(*tools) -> list[int]:
    return enc("<system>S" + tools_fallback_text(list(tools)) + f"</system><user>Q|{FMT}</user>")


H_FOLD = head(SEARCH_SCHEMA, BRANCH_SCHEMA, RETURN_SCHEMA)
H_SEARCH = head(SEARCH_SCHEMA)
COMMON = dict(retriever_kind="kw_test", temperature=0.0, max_turn_tokens=400, system_template="S",
              user_template="{question}|{answer_format}")


def play(run, cfg, replies, tokenizer=None):
    register_retriever("kw_test", KeywordRetriever(DOCS))
    engine = ScriptedEngine(replies, tokenizer=tokenizer) if tokenizer else ScriptedEngine(replies)
    traj = asyncio.run(run(Task("t1", "Q", "", ["Paris"]), engine, cfg, random.Random(0)))
    return traj, engine


def mask_of(*parts: tuple[list[int], int]) -> list[int]:
    return [v for ids, v in parts for _ in ids]


# ---------------------------------------------------------------- fold

def test_fold_branch_and_main_contexts_and_rows_by_hand():
    r = [call("branch", description="France", prompt="Find the capital of France."),  # main t0
         call("search", query="France", topk=1),                                        # branch t1 -> r2
         call("return", message="Paris"),                                               # branch t2
         "FINAL_ANSWER: Paris"]                                                         # main t3
    traj, engine = play(fold_run, FoldConfig(**COMMON), r)
    opened = tool("[r1] Branch France: Find the capital of France." + OPEN)
    t2 = tool("[r2] " + results("France", DOCS[0]))
    ret = tool("[r1] Branch France returned: Paris")
    H = H_FOLD
    assert engine.calls[0].prompt_ids == H + HDR
    # the branch sees the main context as it stands, the branch call turn included, then its opening result
    assert engine.calls[1].prompt_ids == H + asst(r[0]) + opened + HDR
    assert engine.calls[2].prompt_ids == H + asst(r[0]) + opened + asst(r[1]) + t2 + HDR
    # folded: the branch's messages are gone, the main thread's ids are untouched, the return is the result
    assert engine.calls[3].prompt_ids == H + asst(r[0]) + ret + HDR
    branch, main = traj.segments
    assert (branch.info["kind"], main.info["kind"]) == ("branch", "main")
    assert branch.prompt_ids == H + asst(r[0]) + opened + HDR
    assert branch.response_ids == gen(r[1]) + END + t2 + HDR + gen(r[2])
    assert branch.loss_mask == mask_of((gen(r[1]), 1), (END + t2 + HDR, 0), (gen(r[2]), 1))
    assert main.prompt_ids == H + HDR
    assert main.response_ids == gen(r[0]) + END + ret + HDR + gen(r[3])
    assert main.loss_mask == mask_of((gen(r[0]), 1), (END + ret + HDR, 0), (gen(r[3]), 1))
    # turn spans: offsets of each turn's sampled ids in the row's response
    g = [len(gen(x)) for x in r]
    assert main.info["turn_spans"] == [[0, 0, g[0]], [3, g[0] + len(END + ret + HDR), g[0] + len(END + ret + HDR) + g[3]]]
    assert branch.info["turn_spans"] == [[1, 0, g[1]], [2, g[1] + len(END + t2 + HDR), len(branch.response_ids)]]
    assert main.info["branch_turns"] == [0] and main.info["error_turns"] == []
    assert [s.step for s in traj.segments] == [0, 1]
    assert sum(s.num_trained_tokens for s in traj.segments) == sum(g)  # every sampled token trains once
    m = traj.metrics
    assert (m["branches"], m["folds"], m["turns"], m["searches"]) == (1.0, 1.0, 4.0, 1.0)
    assert m["peak_context_tokens"] == len(engine.calls[2].prompt_ids)
    assert m["mean_context_tokens"] == sum(len(c.prompt_ids) for c in engine.calls) / 4
    assert m["tokens_discarded"] == len(opened + asst(r[1]) + t2 + asst(r[2]))
    assert m["final_context_tokens"] == len(H + asst(r[0]) + ret + asst(r[3]))
    assert traj.final_answer == "Paris" and traj.info["stop"] == "answer"
    assert traj.info["branches"][0]["queries"] == ["France"] and traj.info["main_head_tokens"] == len(H)


def test_fold_misuse_is_answered_and_marked_as_error_turns():
    r = [call("return", message="x"),                                           # main t0: return in main
         call("branch", description="a", prompt="p") + call("branch", description="b", prompt="q"),  # t1
         "no call here",                                                       # branch t2: must return
         call("branch", description="c", prompt="r"),                          # branch t3: nested branch
         call("return", message="done"),                                      # branch t4
         "FINAL_ANSWER: x"]                                                    # main t5
    traj, engine = play(fold_run, FoldConfig(**COMMON), r)
    e0 = tool("[r1] Error: return ends a branch; you are in the main thread.")
    opened = tool("[r2] Branch a: p" + OPEN)
    e2 = tool("[r3] Error: you are in a branch; end it with return(message).")
    e3 = tool("[r4] Error: a branch cannot open another branch; end it with return(message).")
    ret = tool("[r2] Branch a returned: done")
    e1 = tool("[r5] Error: one branch per turn; this call was not run.")
    H = H_FOLD
    assert engine.calls[3].prompt_ids == H + asst(r[0]) + e0 + asst(r[1]) + opened + asst(r[2]) + e2 + HDR
    assert engine.calls[5].prompt_ids == H + asst(r[0]) + e0 + asst(r[1]) + ret + e1 + HDR
    assert engine.calls[4].prompt_ids[-len(e3 + HDR):] == e3 + HDR
    branch, main = traj.segments
    assert main.info["error_turns"] == [0, 1, 2, 3] and main.info["branch_turns"] == [1]
    assert traj.metrics["branch_errors"] == 4.0 and traj.metrics["error_turns"] == 4.0


def test_fold_branch_cap_and_a_branch_that_runs_out_of_context():
    r = [call("branch", description="a", prompt="p"), call("return", message="m1"),
         call("branch", description="b", prompt="q"), "FINAL_ANSWER: x"]
    traj, engine = play(fold_run, FoldConfig(**COMMON, max_branches=1), r)
    H = H_FOLD
    limit = tool("[r2] Error: the limit of 1 branches is reached. Continue without branching.")
    assert engine.calls[3].prompt_ids == (H + asst(r[0]) + tool("[r1] Branch a returned: m1") + asst(r[2]) + limit
                                          + HDR)
    assert traj.metrics["branch_limit_hits"] == 1.0 and traj.metrics["branches"] == 1.0
    # a branch whose next prompt passes the budget ends without a return; the main thread is told so
    r = [call("branch", description="a", prompt="p"), call("search", query="France", topk=1), "FINAL_ANSWER: x"]
    opened = tool("[r1] Branch a: p" + OPEN)
    budget = len(H + asst(r[0]) + opened + asst(r[1])) + 5  # the search result does not fit
    traj, engine = play(fold_run, FoldConfig(**COMMON, max_context_tokens=budget), r)
    assert engine.calls[2].prompt_ids == H + asst(r[0]) + tool("[r1] Branch a ended without returning (context "
                                                               "budget).") + HDR
    assert traj.metrics["branch_unreturned"] == 1.0 and traj.metrics["folds"] == 0.0
    assert traj.info["branches"][0]["end"] == "context_budget" and traj.info["branches"][0]["returned"] is None


def test_fold_contexts_are_token_exact_with_a_chatml_tokenizer():
    """The tiny models' tokenizer: the main context after a fold is the concatenation of the kept messages'
    ids (EOS sampled, '\\n' appended), and every training id / logprob is the engine's."""
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    r = [call("branch", description="France", prompt="capital"), call("search", query="France", topk=1),
         call("return", message="Paris"), "FINAL_ANSWER: Paris"]
    traj, engine = play(fold_run, FoldConfig(**COMMON), r, tokenizer=tok)

    def e(text):
        return tok.encode(text, add_special_tokens=False)

    h = e("<|im_start|>system\nS" + tools_fallback_text([SEARCH_SCHEMA, BRANCH_SCHEMA, RETURN_SCHEMA])
          + f"<|im_end|>\n<|im_start|>user\nQ|{FMT}<|im_end|>\n")
    hdr, nl = e("<|im_start|>assistant\n"), e("\n")
    g = [tok.encode(x) + [tok.eos_token_id] for x in r]
    opened = e("<|im_start|>tool\n[r1] Branch France: capital" + OPEN + "<|im_end|>\n")
    t2 = e("<|im_start|>tool\n[r2] " + results("France", DOCS[0]) + "<|im_end|>\n")
    ret = e("<|im_start|>tool\n[r1] Branch France returned: Paris<|im_end|>\n")
    assert engine.calls[2].prompt_ids == h + hdr + g[0] + nl + opened + hdr + g[1] + nl + t2 + hdr
    assert engine.calls[3].prompt_ids == h + hdr + g[0] + nl + ret + hdr
    branch, main = traj.segments
    assert branch.response_ids == g[1] + nl + t2 + hdr + g[2]
    assert main.response_ids == g[0] + nl + ret + hdr + g[3]
    trained = [i for s in traj.segments for i, k in zip(s.response_ids, s.loss_mask, strict=True) if k]
    assert sorted(trained) == sorted(i for x in g for i in x)


def test_fold_scope_rule_and_reward_through_the_rollout_runner():
    r = [call("branch", description="France capital", prompt="p"), call("search", query="capital of France"),
         call("return", message="Paris"), call("branch", description="Germany", prompt="q"),
         call("search", query="Italy"), call("return", message="Rome"), "FINAL_ANSWER: Paris"]
    register_retriever("kw_test", KeywordRetriever(DOCS))
    spec, wcfg = parse_workflow({"name": "fold", **COMMON})
    engine = ScriptedEngine(r)
    (group,) = rollout_once([Task("t1", "Q", "", ["Paris"])], spec, engine, wcfg)
    traj = group.trajectories[0]
    # branch 0's query shares "France"/"capital" with its description: in scope; branch 1 searched Italy: out
    assert traj.info["branch_scope"] == [1, -1]
    assert traj.reward == 1.0 and traj.metrics["scope_in"] == 1.0 and traj.metrics["scope_out"] == 1.0


def test_fold_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="workflow.max_branches"):
        parse_workflow({"name": "fold", "max_branches": -1})
    with pytest.raises(ConfigError, match="workflow.scope_rule"):
        parse_workflow({"name": "fold", "scope_rule": "judge"})
    assert get_workflow("fold").config_cls is FoldConfig


# ---------------------------------------------------------------- summarize

def test_summary_restarts_the_context_and_cuts_one_row_per_part():
    r = [call("search", query="France", topk=1),            # t0 -> r1
         "<summary>Paris is the capital.</summary>",      # t1: the summary turn
         "FINAL_ANSWER: Paris"]                             # t2
    H = H_SEARCH
    t1 = tool("[r1] " + results("France", DOCS[0]))
    req = user(SUMMARY_REQUEST)
    # the summary call must fit: budget = its prompt; trigger at 0.75 of it, which the second prompt passes
    budget = len(H + asst(r[0]) + t1 + req + HDR)
    assert len(H + asst(r[0]) + t1 + HDR) > 0.75 * budget > len(H + HDR)
    traj, engine = play(summarize_run, SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=0.75), r)
    restart = user("Your progress so far, summarized:\nParis is the capital.\nContinue from here.")
    assert engine.calls[1].prompt_ids == H + asst(r[0]) + t1 + req + HDR
    assert engine.calls[2].prompt_ids == H + restart + HDR
    part, fin = traj.segments
    assert part.info["kind"] == "part" and part.info["summary"] == "Paris is the capital."
    assert part.prompt_ids == H + HDR
    assert part.response_ids == gen(r[0]) + END + t1 + req + HDR + gen(r[1])
    assert part.loss_mask == mask_of((gen(r[0]), 1), (END + t1 + req + HDR, 0), (gen(r[1]), 1))
    assert fin.prompt_ids == H + restart + HDR and fin.response_ids == gen(r[2])
    m = traj.metrics
    assert (m["summaries"], m["turns"]) == (1.0, 3.0)
    assert m["tokens_discarded"] == len(asst(r[0]) + t1 + req + asst(r[1]))
    assert m["peak_context_tokens"] == budget and traj.final_answer == "Paris"


def test_summary_rollback_and_the_summary_cap():
    r = [call("search", query="France", topk=1), "<summary>s</summary>", "FINAL_ANSWER: Paris"]
    H = H_SEARCH
    t1 = tool("[r1] " + results("France", DOCS[0]))
    budget = len(H + asst(r[0]) + t1 + user(SUMMARY_REQUEST) + HDR)
    # rollback (published): the last turn and its result go before the request; they never train
    traj, engine = play(summarize_run, SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=0.75,
                                                       summary_rollback=True), r)
    assert engine.calls[1].prompt_ids == H + user(SUMMARY_REQUEST) + HDR
    part, _fin = traj.segments
    assert part.prompt_ids == H + user(SUMMARY_REQUEST) + HDR and part.response_ids == gen(r[1])
    # no summary allowed: the trigger ends the trajectory (overlong; masked with overlong_mask)
    traj, engine = play(summarize_run, SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=0.75,
                                                       max_summaries=0, overlong_mask=True), r)
    assert len(engine.calls) == 1 and traj.info["stop"] == "max_summaries"
    assert traj.info["exclude_from_group"] is True and traj.metrics["stop_max_summaries"] == 1.0
    assert extract_summary("a <summary>x</summary> b <summary> y </summary>") == "y"
    assert extract_summary(" plain ") == "plain"
    with pytest.raises(ConfigError, match="summary_restart"):
        parse_workflow({"name": "summarize", "summary_restart": "no placeholder"})


# ---------------------------------------------------------------- sliding window

def test_sliding_window_keeps_the_last_k_turns_and_cuts_a_row_per_shift():
    r = [call("search", query="France", topk=1), call("search", query="Germany", topk=1),
         call("search", query="Italy", topk=1), "FINAL_ANSWER: Paris"]
    traj, engine = play(window_run, SlidingWindowConfig(**COMMON, window_turns=2), r)
    H = H_SEARCH
    T = {1: tool("[r1] " + results("France", DOCS[0])), 2: tool("[r2] " + results("Germany", DOCS[1])),
         3: tool("[r3] " + results("Italy", DOCS[2]))}
    assert engine.calls[1].prompt_ids == H + asst(r[0]) + T[1] + HDR
    assert engine.calls[2].prompt_ids == H + asst(r[1]) + T[2] + HDR
    assert engine.calls[3].prompt_ids == H + asst(r[2]) + T[3] + HDR
    s0, s1, fin = traj.segments
    assert s0.prompt_ids == H + HDR and s0.response_ids == gen(r[0]) + END + T[1] + HDR + gen(r[1])
    assert s1.prompt_ids == engine.calls[2].prompt_ids and s1.response_ids == gen(r[2])
    assert fin.prompt_ids == engine.calls[3].prompt_ids and fin.response_ids == gen(r[3])
    assert [s.info["turns"] for s in traj.segments] == [[0, 1], [2], [3]]
    m = traj.metrics
    assert m["window_drops"] == 2.0 and m["tokens_discarded"] == len(asst(r[0]) + T[1] + asst(r[1]) + T[2])
    # window_turns=0: ReAct without management, one row, nothing discarded
    traj, engine = play(window_run, SlidingWindowConfig(**COMMON, window_turns=0), r)
    assert engine.calls[3].prompt_ids == H + asst(r[0]) + T[1] + asst(r[1]) + T[2] + asst(r[2]) + T[3] + HDR
    assert len(traj.segments) == 1 and traj.metrics["tokens_discarded"] == 0.0


# ---------------------------------------------------------------- memact fixed-interval pruning

def test_memact_prune_every_k_turns():
    r = [call("search", query="France", topk=1), call("search", query="Germany", topk=1), "FINAL_ANSWER: Paris"]
    cfg = MemActConfig(**COMMON, no_prune_prob=0.0, prune_tool=False, system_noprune_template="S", prune_every=2)
    traj, engine = play(memact_run, cfg, r)
    H = H_SEARCH
    t1 = tool("[r1] " + results("France", DOCS[0]))
    t2 = tool("[r2] " + results("Germany", DOCS[1]))
    # before turn 2 every result goes, and the turns left without results with them
    assert engine.calls[2].prompt_ids == H + HDR
    s0, fin = traj.segments
    assert s0.info["kind"] == "interval_prune" and s0.info["deleted"] == ["r1", "r2"]
    assert s0.prompt_ids == H + HDR and s0.response_ids == gen(r[0]) + END + t1 + HDR + gen(r[1])
    assert fin.prompt_ids == H + HDR and fin.response_ids == gen(r[2])
    m = traj.metrics
    assert m["interval_prunes"] == 1.0 and m["tokens_discarded"] == len(asst(r[0]) + t1 + asst(r[1]) + t2)
    with pytest.raises(ConfigError, match="workflow.prune_every"):
        parse_workflow({"name": "memact", "prune_every": -2})


def test_fold_with_xml_tool_calls():
    """tool_call_format=xml: the tools block in xml wording, calls read from <function=...> blocks."""
    from memrl.tools.calls import ToolCall, format_call

    r = [format_call(ToolCall("branch", {"description": "France", "prompt": "capital"}), "xml"),
         format_call(ToolCall("return", {"message": "Paris"}), "xml"), "FINAL_ANSWER: Paris"]
    traj, engine = play(fold_run, FoldConfig(**COMMON, tool_call_format="xml"), r)
    h = enc("<system>S" + tools_fallback_text([SEARCH_SCHEMA, BRANCH_SCHEMA, RETURN_SCHEMA], "xml")
            + f"</system><user>Q|{FMT}</user>")
    assert engine.calls[0].prompt_ids == h + HDR
    assert engine.calls[2].prompt_ids == h + asst(r[0]) + tool("[r1] Branch France returned: Paris") + HDR
    assert traj.metrics["folds"] == 1.0 and traj.final_answer == "Paris"
    with pytest.raises(ConfigError, match="tool_parser=published reads Hermes JSON calls only"):
        parse_workflow({"name": "fold", "tool_call_format": "xml", "tool_parser": "published"})


def test_summarize_with_a_qwen3_thinking_template_is_token_exact():
    """Qwen3's template renders an earlier assistant turn without its think block once a user message follows:
    the summary request and the restart are cut from a user message after a user message, and the contexts
    are the kept messages' ids (the first prompt's ids untouched after the restart)."""
    from memrl.models.tiny import train_tokenizer

    tok = train_tokenizer(None, 300, arch="qwen3")
    r = [call("search", query="France", topk=1), "<summary>Paris</summary>", "FINAL_ANSWER: Paris"]

    def e(text):
        return tok.encode(text, add_special_tokens=False)

    big = SummarizeConfig(**COMMON, max_context_tokens=10**6)
    _, engine = play(summarize_run, big, r[:1] + ["FINAL_ANSWER: Paris"], tokenizer=tok)
    head_ids = engine.calls[0].prompt_ids[:-len(e("<|im_start|>assistant\n"))]
    hdr = e("<|im_start|>assistant\n")
    g0 = tok.encode(r[0], add_special_tokens=False) + [tok.eos_token_id]
    t1 = engine.calls[1].prompt_ids[len(head_ids + hdr + g0):-len(hdr)]  # the search result's ids
    req = e("<|im_start|>user\n" + SUMMARY_REQUEST + "<|im_end|>\n")
    budget = len(head_ids + hdr + g0 + t1 + req + hdr)
    second = len(head_ids + hdr + g0 + t1 + hdr)  # the second prompt: just past the trigger
    cfg = SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=(second - 1) / budget)
    traj, engine = play(summarize_run, cfg, r, tokenizer=tok)
    assert engine.calls[1].prompt_ids == head_ids + hdr + g0 + t1 + req + hdr
    restart = e("<|im_start|>user\nYour progress so far, summarized:\nParis\nContinue from here.<|im_end|>\n")
    assert engine.calls[2].prompt_ids == head_ids + restart + hdr
    assert traj.final_answer == "Paris" and traj.metrics["summaries"] == 1.0


def test_summary_by_a_second_model_service():
    """summarizer.url (ReSum): the service gets the request, the question and the part's messages; its reply is
    the summary; the policy's context never holds the request and its part row ends at its own last turn. A
    failed call is counted and the context restarts with an empty summary."""
    from doubles import JsonServer

    from memrl.rewards.judge import JudgeSettings

    bodies = []

    def reply(body):
        bodies.append(body)
        return {"choices": [{"message": {"content": "<summary>Paris is the capital.</summary>"}}]}

    r = [call("search", query="France", topk=1), "FINAL_ANSWER: Paris"]
    H = H_SEARCH
    t1 = tool("[r1] " + results("France", DOCS[0]))
    budget = len(H + asst(r[0]) + t1 + HDR)
    server = JsonServer(reply)
    try:
        cfg = SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=0.75,
                              summarizer=JudgeSettings(url=server.url, model="s", max_tokens=64, retries=0))
        traj, engine = play(summarize_run, cfg, r)
    finally:
        server.stop()
    (body,) = bodies
    assert body["model"] == "s" and body["max_tokens"] == 64
    assert body["messages"][0]["content"] == (SUMMARY_REQUEST + "\n\nQuestion:\nQ\n\nSo far:\nassistant: " + r[0]
                                              + "\n\ntool: [r1] " + results("France", DOCS[0]))
    restart = user("Your progress so far, summarized:\nParis is the capital.\nContinue from here.")
    assert engine.calls[1].prompt_ids == H + restart + HDR
    part, fin = traj.segments
    assert part.prompt_ids == H + HDR and part.response_ids == gen(r[0])  # no summary turn in the policy's row
    assert fin.prompt_ids == H + restart + HDR and traj.metrics["summaries"] == 1.0
    # a dead service: counted, an empty summary
    cfg = SummarizeConfig(**COMMON, max_context_tokens=budget, summary_fraction=0.75,
                          summarizer=JudgeSettings(url="http://127.0.0.1:9", retries=0, timeout_s=2))
    traj, engine = play(summarize_run, cfg, r)
    assert traj.metrics["summary_errors"] == 1.0
    assert engine.calls[1].prompt_ids == H + user("Your progress so far, summarized:\n\nContinue from here.") + HDR
