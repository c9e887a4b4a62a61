"""The error of memrl.models: a checkpoint or model file that cannot be converted or imported."""

from __future__ import annotations

from memrl.errors import UserError


class ConvertError(UserError):
    """A checkpoint cannot be converted; the message names the file or tensor and what is wrong."""


def first_sentence(e: BaseException) -> str:
    """The first sentence of an exception's first line (libraries append paragraphs of advice)."""
    text = (str(e).strip().splitlines() or [""])[0]
    return text.split(". ")[0].rstrip(".")[:300]


def why(e: BaseException) -> str:
    """'Type: first sentence' of an exception, or its type alone when it says nothing (EOFError)."""
    first = first_sentence(e)
    return f"{type(e).__name__}: {first}" if first else type(e).__name__
