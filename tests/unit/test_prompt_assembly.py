"""workflow.prompt_assembly=spliced: prompts built by token splicing, as MemAgent's and ReMemR1's
synchronous trainers build them (recurrent/utils.py TokenTemplate; memory.py / memory_revisit.py
MemoryAgent.action and update), against memrl's text rendering.

The tokenizer here does NOT round-trip: it is the character tokenizer (id = code point + 3) except that
encoding merges each "ab" into one id, AB, while a model may sample "a" and "b" as two ids. So a token
can straddle a template piece boundary in the rendered text (one AB id) but not when pieces are encoded
apart (a, b), and a reply's ids decoded and encoded again can change. Expected ids are written out by hand
with `chars` (one id per character, no merge) and AB.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest
from doubles import CharTokenizer

from memrl.engines.base import Completion, SamplingParams
from memrl.types import Task
from memrl.workflows.memagent import MemAgentConfig
from memrl.workflows.memagent import run as run_memagent
from memrl.workflows.rememr1 import ReMemR1Config
from memrl.workflows.rememr1 import run as run_rememr1
from memrl.workflows.templates import Template, TemplateError, spliced_chat_prompt

AB = 1000
EOS = CharTokenizer.eos_token_id


class MergeTokenizer(CharTokenizer):
    """CharTokenizer whose encode merges "ab" into AB (left to right); decode maps AB back to "ab"."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out, i = [], 0
        while i < len(text):
            if text.startswith("ab", i):
                out.append(AB)
                i += 2
            else:
                out.append(ord(text[i]) + self.OFFSET)
                i += 1
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join("ab" if i == AB else super(MergeTokenizer, self).decode([i], skip_special_tokens) for i in ids)


def chars(text: str) -> list[int]:
    """One id per character, no merge (hand derivation)."""
    return [ord(c) + CharTokenizer.OFFSET for c in text]


@dataclass
class IdEngine:
    """Replies with scripted token ids (as a model samples them, merges or not), then the tokenizer's EOS;
    records prompts."""

    replies: list[list[int]]
    tokenizer: MergeTokenizer = field(default_factory=MergeTokenizer)
    prompts: list[list[int]] = field(default_factory=list)

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        self.prompts.append(list(prompt_ids))
        ids = self.replies[len(self.prompts) - 1] + [self.tokenizer.eos_token_id]
        return Completion(ids, [-0.5] * len(ids), "stop")


# MemAgent: question "q", context "ca" (one chunk of 2 tokens: c, a). The memory template puts a literal
# "b" right after the chunk and an "a" right before the memory; the chat frame is "<user>...</user><assistant>".
MEM_TPL = "{problem}a{memory}|{chunk}b"
FIN_TPL = "{problem}a{memory}"
REPLY = chars("ab ")  # the model sampled a, b and a space as three ids (then EOS)


def _memagent(assembly: str, **kw) -> IdEngine:
    engine = IdEngine([REPLY, chars("x")])
    c = MemAgentConfig(chunk_tokens=2, max_memory_tokens=20, max_final_tokens=20, temperature=0.0,
                       memory_template=MEM_TPL, final_template=FIN_TPL, prompt_assembly=assembly, **kw)
    asyncio.run(run_memagent(Task("t", "q", "ca", ["x"]), engine, c, random.Random(0)))
    return engine


def test_memagent_spliced_prompts_by_hand():
    memory_call, final_call = _memagent("spliced").prompts
    # Pieces of "<user>{problem}a{memory}|{chunk}b</user><assistant>": "<user>", q, "a", the first memory
    # "No previous memory" (encoded on its own), "|", the chunk's ids c a as cut, "b</user><assistant>".
    # Every piece is char ids, and the chunk's "a" meets the template's "b" only across a boundary: no AB.
    assert memory_call == chars("<user>qaNo previous memory|cab</user><assistant>")
    # Final: "<user>", q, "a", the memory = the reply's ids a b " " with EOS dropped (not decoded, not
    # stripped), "</user><assistant>".
    assert final_call == chars("<user>qa") + chars("ab ") + chars("</user><assistant>")
    assert EOS not in final_call


def test_memagent_text_assembly_encodes_the_rendered_text_at_once():
    memory_call, final_call = _memagent("text").prompts
    # "...|cab</user>": the chunk's a and the template's b merge into AB
    assert memory_call == chars("<user>qaNo previous memory|c") + [AB] + chars("</user><assistant>")
    # the memory is the decoded, stripped reply "ab", encoded inside "qaab": q, a, AB
    assert final_call == chars("<user>qa") + [AB] + chars("</user><assistant>")


@pytest.mark.parametrize("rule, memory_ids", [
    ("empty", chars(" ")),  # memory.py update: the reply's ids (a lone space) whatever they hold
    ("placeholder", chars("No previous memory")),  # memrl's placeholder text, encoded on its own
])
def test_memagent_spliced_blank_reply(rule, memory_ids):
    engine = IdEngine([chars(" "), chars("x")])
    c = MemAgentConfig(chunk_tokens=2, max_memory_tokens=20, max_final_tokens=20, temperature=0.0,
                       memory_template=MEM_TPL, final_template=FIN_TPL, prompt_assembly="spliced", empty_memory=rule)
    asyncio.run(run_memagent(Task("t", "q", "ca", ["x"]), engine, c, random.Random(0)))
    assert engine.prompts[1] == chars("<user>qa") + memory_ids + chars("</user><assistant>")


def test_rememr1_spliced_reencodes_the_parsed_memory():
    # ReMemR1's update keeps the parsed memory TEXT (decoded, recall removed, stripped) and encodes it on
    # its own: the reply's ids b x y become "bxy" -> b x y again; here the difference from text assembly is
    # the piece boundary "a" | memory "b".
    tpl_mem, tpl_fin = "{problem}|{recalled_memory}|a{memory}|{chunk}", "{problem}|{recalled_memory}|a{memory}"
    prompts = {}
    for assembly in ("spliced", "text"):
        engine = IdEngine([chars("bxy "), chars("x")])
        c = ReMemR1Config(chunk_tokens=2, max_memory_tokens=20, max_final_tokens=20, temperature=0.0,
                          memory_template=tpl_mem, final_template=tpl_fin, memory_rule="strip_recall",
                          recall=False, prompt_assembly=assembly)
        asyncio.run(run_rememr1(Task("t", "q", "cd", ["x"]), engine, c, random.Random(0)))
        prompts[assembly] = engine.prompts
    tail = chars("</user><assistant>")
    # final prompt: "<user>", q, "|", "No memory was recalled.", "|a", the memory "bxy" encoded alone, tail
    assert prompts["spliced"][1] == chars("<user>q|No memory was recalled.|a") + chars("bxy") + tail
    # text: "...|abxy</user>" encoded at once: AB x y
    assert prompts["text"][1] == chars("<user>q|No memory was recalled.|") + [AB] + chars("xy") + tail
    # first call: no "ab" anywhere ("...|aNo previous memory|cd"), so both give the same ids
    assert prompts["spliced"][0] == prompts["text"][0] == chars("<user>q|No memory was recalled.|aNo previous memory|cd") + tail


def test_spliced_chat_prompt_carries_the_rendered_text_for_chat_engines():
    tok = MergeTokenizer()
    ids = spliced_chat_prompt(tok, Template("{problem}a{memory}", ("problem", "memory"), "(t)"),
                              problem="q", memory=chars("b"))
    assert list(ids) == chars("<user>qab</user><assistant>")
    assert ids.messages == [{"role": "user", "content": "qab"}]
    # the published placeholder name {prompt} splices the question too
    assert list(spliced_chat_prompt(tok, Template("{prompt}|{memory}", ("problem", "memory"), "(t)"),
                                    problem="q", memory="m")) == chars("<user>q|m</user><assistant>")


def test_spliced_needs_memrl_style_templates():
    with pytest.raises(ValueError, match="prompt_assembly=spliced .* needs template_style=memrl"):
        MemAgentConfig(prompt_assembly="spliced", template_style="str_format")
    with pytest.raises(ValueError, match="prompt_assembly must be one of text, spliced"):
        MemAgentConfig(prompt_assembly="tokens")
    with pytest.raises(TemplateError, match="memrl-style"):
        spliced_chat_prompt(MergeTokenizer(), Template("{problem}", ("problem",), "(t)", "str_format"), problem="q")


# --- enable_thinking under spliced, on the tiny-qwen3 tokenizer (a Qwen3-style thinking template) ----------
# Its frame is "<|im_start|>user\n{message}<|im_end|>\n<|im_start|>assistant\n", and with enable_thinking=false
# the generation prompt gets an empty think block: "<think>\n\n</think>\n\n". The template and the task are
# chosen so that every piece boundary is a token boundary of the rendered text too (a newline before and
# after each placeholder, no punctuation next to one: "?\n" or ".\n" would be one token in the text) and
# every reply's ids are what its text encodes to: the text round-trips, so spliced must equal text.

Q3_MEM = "Question:\n{problem}\nMemory:\n{memory}\nChunk:\n{chunk}\n"
Q3_FIN = "Question:\n{problem}\nMemory:\n{memory}\n"
Q3_TASK = Task("t", "who lives in Rome", "Alice lives in Paris and Bob lives in Rome", ["Alice"])


@pytest.fixture(scope="module")
def qwen3_tok():
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    return AutoTokenizer.from_pretrained(cached_tiny_model("tiny-qwen3"))


def _qwen3_memagent(tok, replies: list[str], assembly: str, **kw) -> IdEngine:
    engine = IdEngine([tok.encode(r, add_special_tokens=False) for r in replies], tokenizer=tok)
    # 9 tokens a chunk: "Alice lives in Paris and" | " Bob lives in Rome" (both 9 ids, cut at a word)
    c = MemAgentConfig(chunk_tokens=9, max_memory_tokens=40, max_final_tokens=20, temperature=0.0,
                       memory_template=Q3_MEM, final_template=Q3_FIN, prompt_assembly=assembly, **kw)
    asyncio.run(run_memagent(Q3_TASK, engine, c, random.Random(0)))
    return engine


def test_spliced_honours_enable_thinking_false_on_tiny_qwen3(qwen3_tok):
    tok = qwen3_tok
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    eos = tok.eos_token_id
    think_open, think_end = tok.convert_tokens_to_ids(["<think>", "</think>"])
    nl2 = enc("\n\n")
    assert len(nl2) == 1 and think_open != think_end  # "\n\n" is one token; <think>/</think> are added tokens
    replies = ["Alice: Paris", "Bob: Rome", r"\boxed{Alice}"]
    spliced = _qwen3_memagent(tok, replies, "spliced", enable_thinking=False).prompts
    # hand-derived pieces: the frame's head + the template's first literal, each value on its own, the
    # literals between, the template's last literal + the frame's tail (the non-thinking generation prompt)
    head = enc("<|im_start|>user\nQuestion:\n")
    tail = enc("\n<|im_end|>\n<|im_start|>assistant\n")
    empty_think = [think_open] + nl2 + [think_end] + nl2
    assert enc("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n") == tail + empty_think
    ctx_ids = enc(Q3_TASK.context)
    chunk1, chunk2 = ctx_ids[:9], ctx_ids[9:]
    assert len(ctx_ids) == 18 and tok.decode(chunk2) == " Bob lives in Rome"
    q, mem, chk = enc(Q3_TASK.question), enc("\nMemory:\n"), enc("\nChunk:\n")
    assert spliced == [
        head + q + mem + enc("No previous memory") + chk + chunk1 + tail + empty_think,
        head + q + mem + enc("Alice: Paris") + chk + chunk2 + tail + empty_think,  # reply 1's ids, EOS dropped
        head + q + mem + enc("Bob: Rome") + tail + empty_think,
    ]
    assert all(eos not in p[:-len(tail + empty_think)] for p in spliced)
    # the text round-trips here, so the text path (the chat template applied to the rendered message with
    # the same switch, encoded at once) gives the very same ids
    assert _qwen3_memagent(tok, replies, "text", enable_thinking=False).prompts == spliced
    # the switch reaches the frame: unset (the template's default, thinking) has no think block
    default = _qwen3_memagent(tok, replies, "spliced").prompts
    assert [p[:-len(empty_think)] for p in spliced] == default
    assert all(think_open not in p for p in default)


def test_spliced_prompt_carries_the_template_kwargs(qwen3_tok):
    ids = spliced_chat_prompt(qwen3_tok, Template(Q3_FIN, ("problem", "memory"), "(t)"), False,
                              problem="who", memory="m")
    assert ids.template_kwargs == {"enable_thinking": False}
    assert ids.messages == [{"role": "user", "content": "Question:\nwho\nMemory:\nm\n"}]
    assert spliced_chat_prompt(qwen3_tok, Template(Q3_FIN, ("problem", "memory"), "(t)"),
                               problem="who", memory="m").template_kwargs == {}


@pytest.mark.parametrize("rule, empty_rule, final_memory", [
    # reply (MemAgent's trainer): the memory is the reply's own ids, its think block included, so the
    # second reply (only a think block) is a non-empty memory, spliced as sampled ("\n\n" kept)
    ("reply", "keep_previous", "<think>\n</think>\n\n"),
    # memrl's rules: the cut text, encoded on its own; the second reply cuts to "", which empty_memory rules
    ("strip_think", "keep_previous", "Alice: Paris"),
    ("after_think", "keep_previous", "Alice: Paris"),
    ("strip_think", "placeholder", "No previous memory"),
    ("after_think", "empty", ""),
])
def test_spliced_memory_text_rules_on_a_thinking_reply(qwen3_tok, rule, empty_rule, final_memory):
    tok = qwen3_tok
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    replies = ["<think>\nplan\n</think>\n\nAlice: Paris", "<think>\n</think>\n\n", r"\boxed{Alice}"]
    kw = {"memory_text": rule, "enable_thinking": True, "empty_memory": empty_rule}
    spliced = _qwen3_memagent(tok, replies, "spliced", **kw).prompts
    head, tail = enc("<|im_start|>user\nQuestion:\n"), enc("\n<|im_end|>\n<|im_start|>assistant\n")
    q, mem, chk = enc(Q3_TASK.question), enc("\nMemory:\n"), enc("\nChunk:\n")
    chunk2 = enc(Q3_TASK.context)[9:]
    memory1 = replies[0] if rule == "reply" else "Alice: Paris"
    assert spliced[1] == head + q + mem + enc(memory1) + chk + chunk2 + tail
    assert spliced[2] == head + q + mem + enc(final_memory) + tail
    # the cut rules' text round-trips, so text gives the same ids; under reply the decoded memory is
    # stripped ("<think>\n</think>", no "\n\n"), so the reply's ids and the text path part there
    text = _qwen3_memagent(tok, replies, "text", **kw).prompts
    assert text[:2] == spliced[:2]
    if rule == "reply":
        assert text[2] == head + q + mem + enc("<think>\n</think>") + tail != spliced[2]
    else:
        assert text[2] == spliced[2]


def test_rememr1_spliced_honours_enable_thinking_false_on_tiny_qwen3(qwen3_tok):
    tok = qwen3_tok
    enc = lambda s: tok.encode(s, add_special_tokens=False)  # noqa: E731
    # the <update> text (strip_think first: the reply's think block is cut before the tags are read)
    replies = ["<think>\nplan\n</think>\n\n<update>Alice: Paris</update>", "<update>Bob: Rome</update>",
               r"\boxed{Bob}"]
    RECALL = "Question:\n{problem}\nRecalled:\n{recalled_memory}"  # noqa: N806
    prompts = {}
    for assembly in ("spliced", "text"):
        engine = IdEngine([enc(r) for r in replies], tokenizer=tok)
        c = ReMemR1Config(chunk_tokens=9, max_memory_tokens=40, max_final_tokens=20, temperature=0.0,
                          memory_template=RECALL + Q3_MEM[len("Question:\n{problem}"):],
                          final_template=RECALL + Q3_FIN[len("Question:\n{problem}"):], recall=False,
                          memory_text="strip_think", enable_thinking=False, prompt_assembly=assembly)
        asyncio.run(run_rememr1(Q3_TASK, engine, c, random.Random(0)))
        prompts[assembly] = engine.prompts
    tail = enc("\n<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")
    head, q, mem = enc("<|im_start|>user\nQuestion:\n"), enc(Q3_TASK.question), enc("\nMemory:\n")
    recalled = enc("\nRecalled:\n") + enc("No memory was recalled.")
    # final: the parsed memory "Bob: Rome" encoded on its own, then the non-thinking generation prompt
    assert prompts["spliced"][2] == head + q + recalled + mem + enc("Bob: Rome") + tail
    # one straddling token: the recalled placeholder ends with "." and the template goes on with "\n"; the
    # text path encodes them as one ".\n" id, spliced as "." | "\n" (each piece alone). Elsewhere the same ids.
    dot, nl, dot_nl = enc("."), enc("\n"), enc(".\n")
    assert len(dot) == len(nl) == len(dot_nl) == 1
    for sp, tx in zip(prompts["spliced"], prompts["text"], strict=True):
        at = len(head + q + recalled) - 1
        assert sp[at:at + 2] == dot + nl and tx[at] == dot_nl[0]
        assert sp[:at] + dot_nl + sp[at + 2:] == tx
