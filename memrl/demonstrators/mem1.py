"""MEM1's scripted optimal agent: the cold-start agent of the MEM1 demo (memrl.recipes.mem1) and the policy of
benchmarks/infmem_mem1_effects.py's MEM1 table.

On memrl.data.synthetic_memact's multi-objective tasks (a combined question "Answer the following k
questions." with numbered sub-questions, one document per fact "Kalo color red"), each turn it rewrites its
internal state `<IS>v1;v2</IS>` to the answers found so far (the latest state plus the value of the latest
search result's top hit), then searches the first sub-question without an answer (its text, whose top hit is
the asked fact) or, once every one has an answer, answers them all `<answer>v1; v2</answer>`. It reads only
the latest state and the latest observation, so it acts the same under `context=latest_state` and
`context=full_history`: with k objectives it makes k searches and one answer, k + 1 calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from memrl.demonstrators.engine import play_scripted
from memrl.types import Group, Task

_QUESTION_HEAD = "Answer the following"
_SUB = re.compile(r"^\d+\. (.+?)(?:<|$)", re.MULTILINE)
_STATE = re.compile(r"<IS>(.*?)</IS>", re.DOTALL)
_TOP_HIT = re.compile(r"<information>.*?\(1\) ([^\n<]*)", re.DOTALL)


@dataclass
class StateDemonstrator:
    """The MEM1 demonstrator (module docstring); `separator` joins the state's and the answer's values (the
    workflow's answer_separator)."""

    separator: str = ";"

    def __call__(self, prompt: str, call_index: int = 0) -> str:
        prompt = prompt[prompt.rfind(_QUESTION_HEAD):]  # the task's questions and what came after
        subs = _SUB.findall(prompt)
        states = _STATE.findall(prompt)
        found = [a for a in states[-1].split(self.separator) if a.strip()] if states else []
        hits = _TOP_HIT.findall(prompt)
        if hits and len(found) < len(subs):
            found.append(hits[-1].split()[-1])  # "Kalo color red": the value is the first line's last word
        state = "<IS>" + self.separator.join(found) + "</IS>"
        if len(found) >= len(subs):
            return state + "<answer>" + f"{self.separator} ".join(found) + "</answer>"
        return state + "<search>" + subs[len(found)] + "</search>"


def mem1_demonstrations(tasks: list[Task], tokenizer: Any, wf_cfg: Any, seed: int = 0) -> list[Group]:
    """StateDemonstrator played through `workflow=mem1` under `wf_cfg` (its `context` setting included), one
    trajectory per task: the cold start's SFT rows are its segments, one per turn, as RL cuts them."""
    agent = StateDemonstrator(wf_cfg.answer_separator)
    return play_scripted(agent, tasks, tokenizer, "mem1", wf_cfg, seed=seed, concurrency=256)
