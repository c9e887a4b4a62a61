"""Reading a rendered prompt back: a demonstrator sees prompt text, and gets the template's fields back."""

from __future__ import annotations

import re


def prompt_pattern(template: str, names: tuple[str, ...]) -> re.Pattern[str]:
    """A regex matching `template` rendered into a chat prompt, one named group per placeholder in
    `names` (non-greedy), ending at the user turn's end (<|im_end|>, </user>) or the text's end."""
    pattern = re.escape(template)
    for name in names:
        pattern = pattern.replace(re.escape("{" + name + "}"), f"(?P<{name}>.*?)", 1)
    return re.compile(pattern + r"(?:<\|im_end\|>|</user>|$)", re.DOTALL)
