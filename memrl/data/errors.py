"""`DataError`, the error of a malformed data file or record: a leaf module, so every reader (and the
tools that read corpora) can raise it without importing the readers."""

from __future__ import annotations

from memrl.errors import UserError


class DataError(UserError):
    """A data file or record is malformed; the message names file, row and field."""
