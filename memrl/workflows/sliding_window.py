"""A sliding window over turns: the working context keeps the first prompt and the last `window_turns`
assistant turns with their tool results (`window_turns=0`: everything, the unmanaged ReAct agent).

The loop is the family's search agent (memrl.workflows.search_agent). Before a turn, when the context holds
`window_turns` assistant turns, the oldest goes with its tool results (messages removed, nothing
re-tokenized; counted in window_drops and tokens_discarded). A turn whose prompt would still pass
`max_context_tokens` is not made (stop "context_budget"): the window bounds turns, not tokens.

Rows: each shift closes one, as a MemAct prune does: the context just before the shift, mask 1 on the turns
since the previous shift (the first row: turns 0..k-1; then one turn per row), and the turns after the last
shift are the last row, so every sampled token trains once, in the context it was sampled in. With
`window_turns=0` a trajectory is one row.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_COUNT, valid
from memrl.engines.base import Engine
from memrl.rewards.multiq import outcome_reward as rule_reward
from memrl.rewards.multiq import row_columns
from memrl.services.session import run_with
from memrl.tools import context as ctx
from memrl.types import Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.search_agent import AgentLoop, SearchAgentConfig, thread_row


@dataclass
class SlidingWindowConfig(SearchAgentConfig):
    """Sliding-window workflow settings."""

    window_turns: int = valid(4, ge=0, le=MAX_COUNT, note="0 = keep every turn (ReAct without management)")
    """Assistant turns the working context keeps (with their tool results)."""


class _Window(AgentLoop):
    async def run(self) -> Trajectory:
        cfg = self.cfg
        msgs: list[ctx.Message] = [self.head()]
        since, drops, answer, stop = -1, 0, "", "max_turns"
        while self.turn < cfg.max_assistant_turns:
            turns = sorted({m.turn for m in msgs if m.kind == "assistant"})
            if cfg.window_turns and len(turns) >= cfg.window_turns:
                self.add_segment(thread_row(msgs, since, len(self.segments), {"kind": "window", "dropped": turns[0]}))
                since = turns[-1]
                kept = [m for m in msgs if m.kind == "head" or m.turn != turns[0]]
                self.drop(msgs, kept)
                msgs, drops = kept, drops + 1
            end = await self.search_turn(msgs)
            if end is not None:
                answer, stop = end
                break
        self.add_segment(thread_row(msgs, since, len(self.segments), {"kind": "final"}))
        return self.trajectory(answer, stop, msgs, {"window_drops": float(drops)}, {})


async def run(task: Any, engine: Engine, cfg: SlidingWindowConfig, rng: random.Random,
              services: Any = None) -> Trajectory:
    """One sliding-window trajectory (module docstring); generation only."""
    return await run_with(services, lambda s: _Window(task, engine, cfg, rng, s).run())


SPEC = WorkflowSpec(
    "sliding_window", run, SlidingWindowConfig, rule_reward,
    format_keys=("no_final_marker", "malformed_calls"),
    eval_defaults={"temperature": 0.0},
    row_columns=row_columns,
)
