"""The full-context baseline fits the document to the engine's window (workflow.fit_window): a document
longer than max_positions allows is truncated in the middle to what fits, instead of an engine error.

Character tokenizer: one token per character, the chat frame "<user>...</user><assistant>", so the prompt's
length is worked out by hand: 6 + len("Q|") + k + 7 + 11 = k + 26 tokens for k document tokens kept.
"""

from __future__ import annotations

import asyncio
import random

from doubles import ScriptedEngine

from memrl.types import Task
from memrl.workflows.full_context import FullContextConfig, run

DOC = "".join(chr(97 + i % 26) for i in range(500))


def _run(fit: bool, window: int | None) -> tuple[str, dict]:
    engine = ScriptedEngine(["\\boxed{x}"])
    if window is not None:
        engine.max_positions = window
    cfg = FullContextConfig(template="{problem}|{context}", max_final_tokens=10, fit_window=fit)
    traj = asyncio.run(run(Task("t", "Q", DOC, ["x"]), engine, cfg, random.Random(0)))
    return engine.calls[0].prompt_text, traj.metrics


def test_a_document_past_the_window_keeps_its_head_and_tail_halves_that_fit() -> None:
    # window 100, answer 10: k + 26 + 10 <= 100 -> k = 64, the first 32 and the last 32 characters
    text, metrics = _run(True, 100)
    assert text == "<user>Q|" + DOC[:32] + DOC[-32:] + "</user><assistant>"
    assert (metrics["tokens_read"], metrics["context_tokens"], metrics["truncated"]) == (64.0, 500.0, 1.0)


def test_fit_window_off_or_an_engine_without_a_window_keeps_max_context_tokens() -> None:
    for fit, window in ((False, 100), (True, None)):
        text, metrics = _run(fit, window)
        assert text == "<user>Q|" + DOC + "</user><assistant>"
        assert metrics["truncated"] == 0.0


def test_a_document_that_fits_is_untouched() -> None:
    text, metrics = _run(True, 536)  # 500 + 26 + 10
    assert text == "<user>Q|" + DOC + "</user><assistant>"
    text, metrics = _run(True, 535)  # one short: one token less, taken from the tail
    assert text == "<user>Q|" + DOC[:250] + DOC[-249:] + "</user><assistant>"
