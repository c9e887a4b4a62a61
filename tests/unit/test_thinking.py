"""Thinking models in the workflows: the chat template's `enable_thinking` switch reaches every prompt, and
`memory_text` decides what a memory call's <think> text does to the memory (kept, stripped, or the text
after the last </think>). Hand-made replies through the scripted engine; the tiny-qwen3 tokenizer where the
template itself matters."""

from __future__ import annotations

import asyncio
import random

import pytest
from doubles import ScriptedEngine

from memrl.engines.base import SamplingParams
from memrl.engines.openai_http import chat_request
from memrl.models.tiny import train_tokenizer
from memrl.tools import context as ctx
from memrl.types import Task
from memrl.workflows import full_context, memagent, rememr1
from memrl.workflows.chunked import after_think, strip_think, think_text_rule
from memrl.workflows.templates import chat_prompt


@pytest.fixture(scope="module")
def qwen3_tok():
    return train_tokenizer(None, 300, arch="qwen3")


@pytest.mark.parametrize("reply, stripped, after", [
    ("<think>a</think>m", "m", "m"),
    # text before the block stays under strip_think; after_think keeps only what follows </think>
    ("x <think>a</think> m", "x  m", "m"),
    # two blocks: both cut; after_think reads after the last one
    ("<think>a</think>m<think>b</think>n", "mn", "n"),
    # the template opened the block in the prompt: the reply holds only "</think>"
    ("reasoning</think>\n\nm", "m", "m"),
    # cut at the token budget inside the block: strip_think drops it; after_think keeps the reply whole
    ("m <think>unfinished", "m", "m <think>unfinished"),
    ("plain", "plain", "plain"),
])
def test_strip_think_and_after_think(reply, stripped, after):
    assert strip_think(reply) == stripped and think_text_rule(reply, "strip_think") == stripped
    assert after_think(reply) == after and think_text_rule(reply, "after_think") == after
    assert think_text_rule(reply, "reply") == reply


def _memagent(replies: list[str], **kw):
    cfg = memagent.MemAgentConfig(chunk_tokens=4, max_memory_tokens=60, max_final_tokens=20, temperature=0.0,
                                  memory_template="M:{memory}|C:{chunk}|{problem}",
                                  final_template="M:{memory}|{problem}", **kw)
    engine = ScriptedEngine(list(replies))
    traj = asyncio.run(memagent.run(Task("t", "Q", "abcdefgh", ["x"]), engine, cfg, random.Random(0)))
    return traj, engine


def test_memagent_memory_text_rules_on_thinking_replies():
    # context "abcdefgh" -> chunks "abcd", "efgh": two memory calls, then the final call
    replies = ["<think>plan</think>m1", "draft <think>more</think>m2 <think>cut", r"\boxed{x}"]
    for rule, memories in [
        ("reply", ["<think>plan</think>m1", "draft <think>more</think>m2 <think>cut"]),
        ("strip_think", ["m1", "draft m2"]),  # "draft " + "m2 " (the blocks cut), trimmed
        ("after_think", ["m1", "m2 <think>cut"]),
    ]:
        traj, engine = _memagent(replies, memory_text=rule)
        assert traj.info["memories"] == memories, rule
        assert engine.calls[1].prompt_text == f"<user>M:{memories[0]}|C:efgh|Q</user><assistant>"
        assert traj.metrics["thinking_memory_calls"] == 2.0
    with pytest.raises(ValueError, match="MemAgentConfig.memory_text must be one of reply, after_think, "
                                         "strip_think, got 'drop'"):
        memagent.MemAgentConfig(memory_text="drop")


def test_rememr1_reads_its_tags_after_the_think_rule():
    """A draft <update> inside the reasoning is not the memory under strip_think; under reply (memrl's
    default) the first closed <update> is, the draft."""
    reply = "<think>draft <update>wrong</update></think><update>right</update>"
    for rule, memory in [("reply", "wrong"), ("strip_think", "right"), ("after_think", "right")]:
        cfg = rememr1.ReMemR1Config(chunk_tokens=8, max_memory_tokens=80, max_final_tokens=20, temperature=0.0,
                                    memory_template="{problem}{recalled_memory}{memory}{chunk}",
                                    final_template="{problem}{recalled_memory}{memory}", memory_text=rule)
        engine = ScriptedEngine([reply, r"\boxed{x}"])
        traj = asyncio.run(rememr1.run(Task("t", "Q", "abcdefgh", ["x"]), engine, cfg, random.Random(0)))
        seg = traj.segments[0].info
        assert seg["memory"] == memory, rule
        assert seg["format_ok"] == (rule != "reply")  # the reply holds two <update> blocks
        assert ("reply_text" in seg) == (rule != "reply") and seg.get("reply_text", reply) == reply


def test_enable_thinking_reaches_the_chat_template(qwen3_tok):
    text, ids = chat_prompt(qwen3_tok, "hi", enable_thinking=False)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert ids.template_kwargs == {"enable_thinking": False} and ids.messages == [{"role": "user", "content": "hi"}]
    default, ids = chat_prompt(qwen3_tok, "hi")
    assert default == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n" and ids.template_kwargs == {}
    # a chat server renders the template itself: the switch goes as chat_template_kwargs
    body = chat_request(ids.messages, SamplingParams(max_tokens=4), "m", {"enable_thinking": False})
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in chat_request(ids.messages, SamplingParams(max_tokens=4), "m")


@pytest.mark.parametrize("workflow", ["memagent", "rememr1", "full_context"])
def test_every_chunked_prompt_carries_the_switch(qwen3_tok, workflow):
    engine = ScriptedEngine(["<update>m</update>", r"\boxed{x}"], tokenizer=qwen3_tok)
    task = Task("t", "Q", "a b", ["x"])
    if workflow == "full_context":
        cfg = full_context.FullContextConfig(enable_thinking=False, template="{problem}{context}")
        asyncio.run(full_context.run(task, engine, cfg, random.Random(0)))
    else:
        mod = memagent if workflow == "memagent" else rememr1
        cls = memagent.MemAgentConfig if workflow == "memagent" else rememr1.ReMemR1Config
        asyncio.run(mod.run(task, engine, cls(chunk_tokens=50, temperature=0.0, enable_thinking=False),
                            random.Random(0)))
    assert engine.calls and all(c.prompt_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
                                for c in engine.calls)


def test_memact_chat_format_of_a_thinking_template(qwen3_tok):
    """The Qwen3-style template renders an assistant turn without its empty think block once a tool result
    follows it; the pieces are cut at markers, so they are what the template writes around each message."""
    fmt = ctx.ChatFormat.from_tokenizer(qwen3_tok)
    assert fmt == ctx.ChatFormat("<|im_start|>assistant\n", "<|im_end|>\n",
                                 "<|im_start|>user\n<tool_response>\n", "\n</tool_response><|im_end|>\n")
    off = ctx.ChatFormat.from_tokenizer(qwen3_tok, {"enable_thinking": False})
    assert off.assistant_header == "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert (off.assistant_end, off.tool_prefix) == (fmt.assistant_end, fmt.tool_prefix)
