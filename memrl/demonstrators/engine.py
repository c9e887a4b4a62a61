"""The engine that plays a demonstrator: each generate() answers with a script's reply to the prompt text.

It is how demonstrations are recorded (the SFT cold start runs the workflow against it, so SFT rows are
built exactly as RL rows are) and how contract tests script a workflow's model calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from memrl.engines.base import Completion, SamplingParams
from memrl.runtime import rollout_once
from memrl.types import Group, Task
from memrl.workflows import WorkflowSpec, get_workflow


@dataclass
class Call:
    """One recorded generate() call."""

    prompt_ids: list[int]
    prompt_text: str
    sampling: SamplingParams
    reply: str


@dataclass
class ScriptedEngine:
    """Answers each generate() with `script(prompt_text, call_index)` (or the next item of a list).

    The reply is tokenized with the tokenizer, truncated at max_tokens (finish "length"), else
    followed by EOS (finish "stop"). Logprobs are a fixed -0.5 per token. All calls are recorded.
    """

    script: Callable[[str, int], str] | list[str]
    tokenizer: Any
    calls: list[Call] = field(default_factory=list)
    weight_updates: int = 0

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        await asyncio.sleep(0)  # yield, so concurrent workflows interleave as with a real engine
        prompt_text = self.tokenizer.decode(prompt_ids)
        idx = len(self.calls)
        if callable(self.script):
            reply = self.script(prompt_text, idx)
        else:
            if idx >= len(self.script):
                raise AssertionError(f"ScriptedEngine: call {idx} but only {len(self.script)} replies scripted")
            reply = self.script[idx]
        self.calls.append(Call(list(prompt_ids), prompt_text, sampling, reply))
        ids = self.tokenizer.encode(reply)
        if len(ids) >= sampling.max_tokens:
            ids, finish = ids[: sampling.max_tokens], "length"
        else:
            ids, finish = ids + [self.tokenizer.eos_token_id], "stop"
        return Completion(ids, [-0.5] * len(ids), finish)

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        self.weight_updates += 1

    async def close(self) -> None:
        return None


def play_scripted(agent: Any, tasks: list[Task], tokenizer: Any, workflow: str | WorkflowSpec, wf_cfg: Any,
                  n: int = 1, seed: int = 0, concurrency: int = 64) -> list[Group]:
    """A scripted `agent` played through `workflow` (a name or its spec) under `wf_cfg` by a ScriptedEngine:
    `n` trajectories per task, scored (memrl.runtime.rollout_once). The one way a demonstrator's traces are
    recorded: every row is cut as RL cuts its rows."""
    spec = get_workflow(workflow) if isinstance(workflow, str) else workflow
    return rollout_once(tasks, spec, ScriptedEngine(agent, tokenizer=tokenizer), wf_cfg, n=n, seed=seed,
                        concurrency=concurrency)
