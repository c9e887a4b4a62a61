"""Parity of prompt bytes with the published setups' template handling (issue 26).

The published code (MemAgent recurrent/impls/async_memory.py and taskutils/memory_eval, ReMemR1
recurrent/impls/memory_revisit.py, vime examples/mem_agent/rollout.py) keeps its prompts as Python
str.format strings: the question is `{prompt}`, a literal brace is `{{`/`}}`, and the string ends with a
newline; the user message is the formatted string, wrapped by the tokenizer's chat template. The templates
below are written for this test in that style (placeholders, an escaped `\\boxed{{}}`, a line ending in a
space, a final newline); they are not the published wording. A user saves a published template to a file
as its string value (what print(TEMPLATE) shows), so each file holds these strings' values.

Every expected prompt is written out by hand. The character tokenizer wraps a user message as
"<user>...</user><assistant>" with one token per character (id = code point + 3), so the prompt's token
ids are the expected text's bytes + 3.
"""

from __future__ import annotations

import asyncio
import random

from doubles import CharTokenizer, ScriptedEngine

from memrl.types import Task
from memrl.workflows.memagent import MemAgentConfig
from memrl.workflows.memagent import run as run_memagent
from memrl.workflows.rememr1 import ReMemR1Config
from memrl.workflows.rememr1 import run as run_rememr1

MEM = "Revise the notes.\n\n<q> \n{prompt}\n</q>\n\n<notes>\n{memory}\n</notes>\n\n<part>\n{chunk}\n</part>\n\n" \
      "New notes:\n"
FIN = "Answer in \\boxed{{}}.\n\n<q> \n{prompt}\n</q>\n\n<notes>\n{memory}\n</notes>\n\nAnswer:\n"
RMEM = "Revise; recall with <recall>q</recall>.\n<q> \n{prompt}\n</q>\n<got>\n{recalled_memory}\n</got>\n" \
       "<notes>\n{memory}\n</notes>\n<part>\n{chunk}\n</part>\nNew notes:\n"
RFIN = "Answer in \\boxed{{}}.\n<q> \n{prompt}\n</q>\n<got>\n{recalled_memory}\n</got>\n<notes>\n{memory}\n</notes>\n"


def files(tmp_path, memory: str, final: str) -> dict[str, str]:
    (tmp_path / "memory.txt").write_text(memory, encoding="utf-8", newline="")
    (tmp_path / "final.txt").write_text(final, encoding="utf-8", newline="")
    return {"memory_template_file": str(tmp_path / "memory.txt"), "final_template_file": str(tmp_path / "final.txt"),
            "template_style": "str_format"}


def assert_prompts(engine: ScriptedEngine, expected_user_messages: list[str]) -> None:
    expected = [f"<user>{m}</user><assistant>" for m in expected_user_messages]
    assert [c.prompt_text for c in engine.calls] == expected
    tok = CharTokenizer()
    for call, text in zip(engine.calls, expected, strict=True):
        assert call.prompt_ids == [b + tok.OFFSET for b in text.encode("ascii")]


def test_the_files_hold_single_backslash_double_braces(tmp_path):
    files(tmp_path, MEM, FIN)
    raw = (tmp_path / "final.txt").read_bytes()
    assert raw.startswith(b"Answer in \\boxed{{}}.\n") and raw.endswith(b"</notes>\n\nAnswer:\n")


def test_memagent_prompt_bytes_from_a_published_style_file(tmp_path):
    # "abcdefghij" with chunk_tokens 4 -> "abcd", "efgh", "ij"; empty_memory placeholder (MemAgent)
    task = Task("t1", "Who?", "abcdefghij", ["x"])
    engine = ScriptedEngine(["m1", "", "m3", r"\boxed{x}"])
    cfg = MemAgentConfig(chunk_tokens=4, temperature=0.0, **files(tmp_path, MEM, FIN))
    asyncio.run(run_memagent(task, engine, cfg, random.Random(0)))
    assert_prompts(engine, [
        "Revise the notes.\n\n<q> \nWho?\n</q>\n\n<notes>\nNo previous memory\n</notes>\n\n<part>\nabcd\n</part>\n\n"
        "New notes:\n",
        "Revise the notes.\n\n<q> \nWho?\n</q>\n\n<notes>\nm1\n</notes>\n\n<part>\nefgh\n</part>\n\nNew notes:\n",
        "Revise the notes.\n\n<q> \nWho?\n</q>\n\n<notes>\nNo previous memory\n</notes>\n\n<part>\nij\n</part>\n\n"
        "New notes:\n",
        "Answer in \\boxed{}.\n\n<q> \nWho?\n</q>\n\n<notes>\nm3\n</notes>\n\nAnswer:\n",
    ])


def test_vime_setup_head_truncation_and_keep_previous(tmp_path):
    # vime: chunks[:MAX_CHUNKS] (here 2 of "abcd", "efgh", "ij") and `stripped output or memory`
    task = Task("t1", "Who?", "abcdefghij", ["x"])
    engine = ScriptedEngine(["m1", " \n ", r"\boxed{x}"])
    cfg = MemAgentConfig(chunk_tokens=4, max_chunks=2, truncation="head", empty_memory="keep_previous",
                         temperature=0.0, **files(tmp_path, MEM, FIN))
    asyncio.run(run_memagent(task, engine, cfg, random.Random(0)))
    assert_prompts(engine, [
        "Revise the notes.\n\n<q> \nWho?\n</q>\n\n<notes>\nNo previous memory\n</notes>\n\n<part>\nabcd\n</part>\n\n"
        "New notes:\n",
        "Revise the notes.\n\n<q> \nWho?\n</q>\n\n<notes>\nm1\n</notes>\n\n<part>\nefgh\n</part>\n\nNew notes:\n",
        "Answer in \\boxed{}.\n\n<q> \nWho?\n</q>\n\n<notes>\nm1\n</notes>\n\nAnswer:\n",
    ])


def test_memagent_synchronous_trainer_keeps_double_braces_under_memrl_style(tmp_path):
    # MemAgent's synchronous trainer (recurrent/impls/memory.py) fills {letters} placeholders by token
    # splicing (TokenTemplate) and never applies str.format to the template, so "{{}}" reaches the model
    # as written: template_style=memrl reproduces that, with {prompt} as the question.
    task = Task("t1", "Who?", "", ["x"])
    engine = ScriptedEngine([r"\boxed{x}"])
    cfg = MemAgentConfig(temperature=0.0, **{**files(tmp_path, MEM, FIN), "template_style": "memrl"})
    asyncio.run(run_memagent(task, engine, cfg, random.Random(0)))
    assert_prompts(engine, [
        "Answer in \\boxed{{}}.\n\n<q> \nWho?\n</q>\n\n<notes>\nNo previous memory\n</notes>\n\nAnswer:\n"])


def test_rememr1_released_setup_prompt_bytes(tmp_path):
    # strip_recall + empty (memory_revisit.py): the memory is the response minus its recall blocks, and an
    # all-recall response leaves an empty memory. "abcdefgh" -> "abcd", "efgh".
    task = Task("t1", "Who?", "abcdefgh", ["x"])
    engine = ScriptedEngine(["<thinking>t</thinking><update>m1</update>", "<recall>m1</recall>", r"\boxed{x}"])
    cfg = ReMemR1Config(chunk_tokens=4, temperature=0.0, scorer="word_overlap", memory_rule="strip_recall",
                        empty_memory="empty", **files(tmp_path, RMEM, RFIN))
    asyncio.run(run_rememr1(task, engine, cfg, random.Random(0)))
    m1 = "<thinking>t</thinking><update>m1</update>"
    assert_prompts(engine, [
        "Revise; recall with <recall>q</recall>.\n<q> \nWho?\n</q>\n<got>\nNo memory was recalled.\n</got>\n"
        "<notes>\nNo previous memory\n</notes>\n<part>\nabcd\n</part>\nNew notes:\n",
        "Revise; recall with <recall>q</recall>.\n<q> \nWho?\n</q>\n<got>\nNo memory was recalled.\n</got>\n"
        f"<notes>\n{m1}\n</notes>\n<part>\nefgh\n</part>\nNew notes:\n",
        # step 2 recalled "m1" -> m_0 (word overlap 1) is shown; its own memory is empty
        f"Answer in \\boxed{{}}.\n<q> \nWho?\n</q>\n<got>\n{m1}\n</got>\n<notes>\n\n</notes>\n",
    ])
