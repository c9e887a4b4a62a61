"""Cold start from conversation data: each chat's token pieces and loss mask, derived by hand from MemAct's
published SFT dataset (verl/utils/dataset/multiturn_sft_dataset.py, MultiTurnSFTDataset.__getitem__).

The rule, as read there: P = indices of assistant messages with a prune_context call. A chat whose last
message is an assistant message without tool calls (an answer) masks every assistant message at index
<= P[-1] (none when P is empty); any other chat masks those at index <= P[-2] (none when len(P) < 2).
An assistant message's generation prompt is never trained; its content, tool calls and end text are,
unless masked. Pieces: each message's rendering minus the rendering of those before it; consecutive tool
messages are one piece. Tool-call arguments drop None values and put memory, then delete_ids, last.

The template (TOOLS_CHAT_TEMPLATE in tests/doubles_chat.py) renders the pieces below; every expected piece is
written out by hand here, then tokenized on its own (as the published dataset tokenizes each piece).
"""

from __future__ import annotations

import json

import pytest

from memrl.data.conversations import (
    Conversation,
    conversation_segment,
    load_conversations,
    parse_conversation,
    trained_assistant_indices,
)
from memrl.data.io import DataError

SEARCH = {"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}
PRUNE = {"type": "function", "function": {"name": "prune_context", "parameters": {"type": "object"}}}
SYS, USER = "You look things up.", "Q1: capital of Peru?"


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from doubles_chat import tools_tokenizer_dir
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tools_tokenizer_dir(tmp_path_factory.mktemp("tok")))


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


SEARCH_MSG = {"role": "assistant", "content": "I will search.",
              "tool_calls": [call("search", query="Peru capital", topk=None), call("search", query="Lima")]}
PRUNE_1 = {"role": "assistant", "content": "Noting it.",
           "tool_calls": [call("prune_context", delete_ids=["r1", "r2"], memory="Peru: Lima", query=None)]}
PRUNE_2 = {"role": "assistant", "content": "Again.",
           "tool_calls": [call("prune_context", delete_ids=["r4"], memory="still Lima")]}
ANSWER = {"role": "assistant", "content": "FINAL_ANSWER: Lima", "tool_calls": None}


def tool(text):
    return {"role": "tool", "content": text}


# the hand-written pieces (what each message adds to the rendering)
P_SYS = ('<|im_start|>system\nYou look things up.\n\n# Tools\n<tools>\n'
         '{"type": "function", "function": {"name": "search", "parameters": {"type": "object"}}}\n'
         '{"type": "function", "function": {"name": "prune_context", "parameters": {"type": "object"}}}\n'
         '</tools><|im_end|>\n')
P_USER = "<|im_start|>user\nQ1: capital of Peru?<|im_end|>\n"
HDR = "<|im_start|>assistant\n"
B_SEARCH = ('I will search.\n<tool_call>\n{"name": "search", "arguments": {"query": "Peru capital"}}\n</tool_call>'
            '\n<tool_call>\n{"name": "search", "arguments": {"query": "Lima"}}\n</tool_call><|im_end|>\n')
# delete_ids was written first and a None "query" was in the arguments: memory, then delete_ids, no query
B_PRUNE_1 = ('Noting it.\n<tool_call>\n{"name": "prune_context", "arguments": {"memory": "Peru: Lima", '
             '"delete_ids": ["r1", "r2"]}}\n</tool_call><|im_end|>\n')
B_PRUNE_2 = ('Again.\n<tool_call>\n{"name": "prune_context", "arguments": {"memory": "still Lima", '
             '"delete_ids": ["r4"]}}\n</tool_call><|im_end|>\n')
B_ANSWER = "FINAL_ANSWER: Lima<|im_end|>\n"


def p_tools(*texts):
    return "<|im_start|>user" + "".join(f"\n<tool_response>\n{t}\n</tool_response>" for t in texts) + "<|im_end|>\n"


def expected(tok, pieces):
    """(ids, mask) from (text, trained) pieces: an assistant body is ("body", 1|0), anything else 0."""
    ids, mask = [], []
    for text, trained in pieces:
        t = tok.encode(text, add_special_tokens=False)
        ids += t
        mask += [trained] * len(t)
    return ids, mask


def chat(*msgs):
    return parse_conversation({"messages": [{"role": "system", "content": SYS}, {"role": "user", "content": USER},
                                            *msgs], "tools": [SEARCH, PRUNE]}, "test: row 0")


CASES = {
    # 0 prunes, ends with the answer (index 5, after the two tool results 3 and 4, which are one piece):
    # P = [], nothing masked -> assistant messages 2 and 5 train
    "no_prune": ((SEARCH_MSG, tool("A"), tool("B"), ANSWER), [2, 5],
                 [(P_SYS, 0), (P_USER, 0), (HDR, 0), (B_SEARCH, 1), (p_tools("A", "B"), 0), (HDR, 0), (B_ANSWER, 1)]),
    # 1 prune (index 4), ends with the answer: masked <= P[-1] = 4 -> only the answer (6) trains
    "one_prune_answer": ((SEARCH_MSG, tool("A"), PRUNE_1, tool("ok"), ANSWER), [6],
                         [(P_SYS, 0), (P_USER, 0), (HDR, 0), (B_SEARCH, 0), (p_tools("A"), 0), (HDR, 0),
                          (B_PRUNE_1, 0), (p_tools("ok"), 0), (HDR, 0), (B_ANSWER, 1)]),
    # 1 prune, the chat ends at it (last message a tool result): len(P) < 2, nothing masked -> 2 and 4 train
    "one_prune_open": ((SEARCH_MSG, tool("A"), PRUNE_1, tool("ok")), [2, 4],
                       [(P_SYS, 0), (P_USER, 0), (HDR, 0), (B_SEARCH, 1), (p_tools("A"), 0), (HDR, 0),
                        (B_PRUNE_1, 1), (p_tools("ok"), 0)]),
    # 2 prunes (2, 6), ends at the second: masked <= P[-2] = 2 -> the turns since it, 4 and 6, train
    "two_prunes_open": ((PRUNE_1, tool("ok"), SEARCH_MSG, tool("C"), PRUNE_2, tool("ok2")), [4, 6],
                        [(P_SYS, 0), (P_USER, 0), (HDR, 0), (B_PRUNE_1, 0), (p_tools("ok"), 0), (HDR, 0),
                         (B_SEARCH, 1), (p_tools("C"), 0), (HDR, 0), (B_PRUNE_2, 1), (p_tools("ok2"), 0)]),
    # 2 prunes, then the answer: masked <= P[-1] = 6 -> only the answer (8) trains
    "two_prunes_answer": ((PRUNE_1, tool("ok"), SEARCH_MSG, tool("C"), PRUNE_2, tool("ok2"), ANSWER), [8],
                          [(P_SYS, 0), (P_USER, 0), (HDR, 0), (B_PRUNE_1, 0), (p_tools("ok"), 0), (HDR, 0),
                           (B_SEARCH, 0), (p_tools("C"), 0), (HDR, 0), (B_PRUNE_2, 0), (p_tools("ok2"), 0),
                           (HDR, 0), (B_ANSWER, 1)]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_pieces_and_masks_by_hand(tok, name):
    msgs, trained, pieces = CASES[name]
    conv = chat(*msgs)
    assert trained_assistant_indices(conv.messages) == trained
    ids, mask = expected(tok, pieces)
    seg = conversation_segment(tok, conv)
    assert seg.prompt_ids + seg.response_ids == ids
    assert [0] * len(seg.prompt_ids) + seg.loss_mask == mask
    # the prompt ends with the first trained message's generation prompt; the response starts with its body
    first = next(i for i, (_, k) in enumerate(pieces) if k)
    assert seg.prompt_ids == expected(tok, pieces[:first])[0]
    assert seg.loss_mask[0] == 1 and seg.response_logprobs == [0.0] * len(seg.response_ids)


def test_left_and_right_truncation(tok):
    conv = chat(*CASES["no_prune"][0])
    ids, mask = expected(tok, CASES["no_prune"][2])
    left = conversation_segment(tok, conv, max_length=30, truncation="left")
    assert left.prompt_ids + left.response_ids == ids[-30:]
    assert [0] * len(left.prompt_ids) + left.loss_mask == mask[-30:]
    n_head = len(expected(tok, CASES["no_prune"][2][:3])[0])  # system, user, header: all mask 0
    right = conversation_segment(tok, conv, max_length=n_head + 2, truncation="right")
    assert right.loss_mask == [1, 1] and right.prompt_ids == ids[:n_head]
    with pytest.raises(DataError, match="no assistant tokens train"):
        conversation_segment(tok, conv, max_length=n_head, truncation="right")
    with pytest.raises(DataError, match=r"test: row 0: \d+ tokens, more than max_length 30"):
        conversation_segment(tok, conv, max_length=30, truncation="error")


def test_bad_rows_are_named(tmp_path):
    p = tmp_path / "c.jsonl"
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    rows = [good, {"messages": [{"role": "user", "content": "q"}, {"role": "system", "content": "s"}]},
            {"messages": []}, {"messages": [{"role": "user", "content": "q"}, {"role": "robot", "content": "x"}]}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(DataError, match=r"c.jsonl: row 1: messages\[1\] is a system message"):
        load_conversations(p)
    convs, skipped = load_conversations(p, skip_bad=True)
    assert len(convs) == 1 and skipped == 3
    assert isinstance(convs[0], Conversation) and convs[0].tools is None
    with pytest.raises(DataError, match=r"row 0: messages\[0\] is an assistant message"):
        parse_conversation({"messages": [{"role": "assistant", "content": "a"}]}, "row 0")
