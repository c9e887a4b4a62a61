"""Context folding (arXiv 2510.11967, FoldAgent): `branch(description, prompt)` opens a sub-context for a
sub-task, `return(message)` folds the whole sub-trajectory into that message in the main context.

The main thread offers `search` and `branch`; a reply with no call is the final answer. A branch call
starts a branch thread: the main thread's messages as they stand (the branch call turn and the results of
the calls before it in that turn included) plus a tool message opening the branch (`[rK] ` + the
description and the prompt). The branch offers `search` and `return`; `branch` there, a reply with no call,
or `return` in the main thread is answered with an error (an error turn). The branch ends on its `return`
call, when the turns run out (`max_assistant_turns`, all threads together, or `branch_max_turns`;
`branch_turn_budget=own`: its own turns alone) or when its context passes `max_context_tokens`. Then its
messages go (never re-tokenized: the main thread's own
messages were never touched) and the main thread gets the branch call's result `[rK] ` + the returned
message (or a note that the branch ended without one). At most `max_branches` branches per trajectory
(published `max_session`); a further branch call is answered with an error. One branch per turn.

Rows (the published agent loop's cut: one row per thread): each branch is one row (prompt = the main
context at the branch, its opening tool message and the first branch turn's header; mask 1 on the branch's
sampled ids), in the order the branches ended, then the main thread is one row (mask 1 on the main turns,
0 on tool results and returned messages). A trajectory with b branches has b + 1 rows; every sampled token
trains once. Row info: "kind" ("branch" / "main"), "thread" (branch index or "main"), "description",
"prompt", "returned", "branch_turns" (main turns that opened a branch), "branch_call_turns" (main turns
with a branch call, run or refused), "error_turns" (turns answered with an error), "turn_spans"
(memrl.workflows.search_agent), which FoldGRPO's process rewards read (memrl.rewards.fold,
memrl.algorithms.fold).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any

from memrl.config import MAX_COUNT, valid
from memrl.engines.base import Engine
from memrl.rewards.fold import fold_score
from memrl.rewards.judge import JudgeSettings
from memrl.rewards.multiq import row_columns
from memrl.services.session import run_with
from memrl.tools import calls as tc
from memrl.tools import context as ctx
from memrl.tools import search as ts
from memrl.types import Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.search_agent import AgentLoop, SearchAgentConfig, Turn, thread_row

BRANCH, RETURN = "branch", "return"
BRANCH_SCHEMA = tc.function_schema(
    BRANCH,
    "Open a branch for a sub-task. The branch sees your context, works on the sub-task alone and returns one "
    "message; its own turns are then folded out of your context.",
    {"description": {"type": "string", "description": "A few words naming the sub-task."},
     "prompt": {"type": "string", "description": "What the branch must do and report."}},
    ["description", "prompt"],
)
RETURN_SCHEMA = tc.function_schema(
    RETURN,
    "End the branch and hand its result to the main thread.",
    {"message": {"type": "string", "description": "What the branch found, for the main thread."}},
    ["message"],
)
COUNTERS = ("branches", "folds", "branch_unreturned", "branch_limit_hits", "branch_errors")


@dataclass
class FoldConfig(SearchAgentConfig):
    """Fold workflow settings (memrl's defaults; the fold_official preset follows the published script)."""

    max_branches: int = valid(10, ge=0, le=MAX_COUNT)
    """Branches per trajectory (published plugin.max_session=10); a further branch call gets an error."""
    branch_max_turns: int = valid(0, ge=0, le=MAX_COUNT, note="0 = only max_assistant_turns")
    """Assistant turns of one branch (0: the trajectory's turn budget alone limits it)."""
    branch_turn_budget: str = valid("shared", choices=("shared", "own"))
    """"shared": a branch stops when the trajectory's turns (all threads) reach max_assistant_turns; "own": a
    branch may take `branch_max_turns` turns of its own (0: max_assistant_turns) whatever the main thread has
    used, and they count against the main thread once it returns (published: agents/fold_agent.py
    `process_item` runs `react(max_turn=max_turn)`, then `iteration += agent_return['iteration']`)."""
    scope_rule: str = valid("queries", choices=("queries", "none"))
    """How a branch's scope verdict (FoldGRPO's out-of-scope reward, memrl.rewards.fold) is found without
    a judge: "queries" = in scope (+1) when every search query of the branch shares a word with its
    description, else out of scope (-1); "none" = no verdict (0). With `scope_judge.url` the judge decides."""
    scope_judge: JudgeSettings = field(default_factory=JudgeSettings)
    """An LLM judge deciding each branch's scope from its prompt, description and returned message
    (published: an LLM judge; `workflow.scope_judge.url=...`, memrl's judge client and settings). Its rubric:
    `scope_judge.rubric_file` ({question} = the branch prompt, {gold} = its description, {prediction} = the
    returned message; the correct tag = in scope) or memrl's (memrl.rewards.fold.SCOPE_RUBRIC). Unset url =
    `scope_rule`; a failed judgement = 0 (no verdict; `scope_unjudged=out`: -1), counted in scope_judge_error."""

    scope_unjudged: str = valid("none", choices=("none", "out"))
    """A judged branch whose judgement failed or has no readable verdict (a ERROR_KINDS failure): "none" =
    no verdict (0); "out" = out of scope (-1), as agents/verifier.py `judge_scope` returns -1 for any reply
    without its in-scope or slightly-out tag, a failed call's error text included."""

    SYSTEM_DEFAULT = "fold_system"


class _Fold(AgentLoop):
    extra_tools = (BRANCH_SCHEMA, RETURN_SCHEMA)
    counters = COUNTERS

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.branch_turns: set[int] = set()
        self.branch_call_turns: set[int] = set()
        self.errors: set[int] = set()
        self.branches: list[dict[str, Any]] = []

    async def run(self) -> Trajectory:
        main: list[ctx.Message] = [self.head()]
        answer, stop = "", "max_turns"
        while True:
            if self.turn >= self.cfg.max_assistant_turns:
                break
            t = await self.step(main, {ts.SEARCH, BRANCH})
            if t is None:
                stop = "context_budget"
                break
            if not t.parsed.attempted:
                answer, stop = t.text, "answer"
                break
            await self.main_calls(main, t)
        self.add_segment(thread_row(main, -1, len(self.segments), {
            "kind": "main", "thread": "main", "branch_turns": sorted(self.branch_turns),
            "branch_call_turns": sorted(self.branch_call_turns), "error_turns": sorted(self.errors)}))
        extra = {"error_turns": float(len(self.errors))}
        info: dict[str, Any] = {"branches": self.branches, "main_head_tokens": len(main[0].ids),
                                "scope_rule": self.cfg.scope_rule}
        if self.cfg.scope_judge.url:
            info["scope_judge"] = dataclasses.asdict(self.cfg.scope_judge)
            info["scope_unjudged"] = self.cfg.scope_unjudged
        return self.trajectory(answer, stop, main, extra, info)

    async def main_calls(self, main: list[ctx.Message], t: Turn) -> None:
        owner, branched = t.message, False
        if t.parsed.errors or t.parsed.dropped:
            self.errors.add(owner.turn)
        for c in t.parsed.calls:
            if c.name == ts.SEARCH:
                if not await self.search(main, c, owner):
                    self.errors.add(owner.turn)
            elif c.name == BRANCH:
                self.branch_call_turns.add(owner.turn)
                if branched:
                    self.errors.add(owner.turn)
                    self.counts["branch_errors"] += 1
                    self.add_tool(main, owner.turn, "Error: one branch per turn; this call was not run.", owner)
                elif self.counts["branches"] >= self.cfg.max_branches:
                    self.counts["branch_limit_hits"] += 1
                    self.add_tool(main, owner.turn, f"Error: the limit of {self.cfg.max_branches} branches is "
                                                    "reached. Continue without branching.", owner)
                else:
                    branched = await self.branch(main, c, owner)
            elif c.name == RETURN:
                self.errors.add(owner.turn)
                self.counts["branch_errors"] += 1
                self.add_tool(main, owner.turn, "Error: return ends a branch; you are in the main thread.", owner)
            else:
                self.errors.add(owner.turn)
                self.unknown(main, c, owner, [ts.SEARCH, BRANCH])
        self.reply_errors(main, t)

    async def branch(self, main: list[ctx.Message], call: tc.ToolCall, owner: ctx.Message) -> bool:
        desc, prompt = call.arguments.get("description"), call.arguments.get("prompt")
        if not isinstance(desc, str) or not desc.strip() or not isinstance(prompt, str) or not prompt.strip():
            self.errors.add(owner.turn)
            self.counts["bad_arguments"] += 1
            self.add_tool(main, owner.turn, 'Error: branch needs a non-empty "description" and "prompt".', owner)
            return False
        desc, prompt = desc.strip(), prompt.strip()
        index = self.counts["branches"]
        self.counts["branches"] += 1
        self.branch_turns.add(owner.turn)
        rid = self.new_id()
        thread = list(main)
        self.add_tool(thread, owner.turn, f"Branch {desc}: {prompt} When done, call return with what you found.",
                      owner, rid=rid)
        owner.call_ids.pop()  # the opening message is the branch's; the main thread's result comes below
        returned, reason, turns = None, "max_turns", 0
        queries: list[str] = []
        own = self.cfg.branch_turn_budget == "own"
        cap = self.cfg.branch_max_turns or (self.cfg.max_assistant_turns if own else 0)
        while cap == 0 or turns < cap:
            if not own and self.turn >= self.cfg.max_assistant_turns:
                break
            t = await self.step(thread, {ts.SEARCH, RETURN}, shared_turns=not own)
            if t is None:
                reason = "context_budget"
                break
            turns += 1
            b_owner = t.message
            if t.parsed.errors or t.parsed.dropped:
                self.errors.add(b_owner.turn)
            if not t.parsed.attempted:
                self.errors.add(b_owner.turn)
                self.counts["branch_errors"] += 1
                self.add_tool(thread, b_owner.turn, "Error: you are in a branch; end it with return(message).",
                              b_owner)
                continue
            for c in t.parsed.calls:
                if c.name == RETURN:
                    msg = c.arguments.get("message")
                    if isinstance(msg, str) and msg.strip():
                        returned = msg.strip()
                        break
                    self.errors.add(b_owner.turn)
                    self.counts["bad_arguments"] += 1
                    self.add_tool(thread, b_owner.turn, 'Error: return needs a non-empty "message".', b_owner)
                elif c.name == ts.SEARCH:
                    q = c.arguments.get("query")
                    if isinstance(q, str):
                        queries.append(q)
                    if not await self.search(thread, c, b_owner):
                        self.errors.add(b_owner.turn)
                elif c.name == BRANCH:
                    self.errors.add(b_owner.turn)
                    self.counts["branch_errors"] += 1
                    self.add_tool(thread, b_owner.turn, "Error: a branch cannot open another branch; end it with "
                                                        "return(message).", b_owner)
                else:
                    self.errors.add(b_owner.turn)
                    self.unknown(thread, c, b_owner, [ts.SEARCH, RETURN])
            if returned is not None:
                reason = "returned"
                break
            self.reply_errors(thread, t)
        self.add_segment(thread_row(thread, owner.turn, len(self.segments), {
            "kind": "branch", "thread": index, "description": desc, "prompt": prompt, "returned": returned,
            "end": reason, "queries": queries, "error_turns": sorted(self.errors)}))
        self.drop(thread, main)
        if returned is None:
            self.counts["branch_unreturned"] += 1
            body = f"Branch {desc} ended without returning ({reason.replace('_', ' ')})."
        else:
            self.counts["folds"] += 1
            body = f"Branch {desc} returned: {returned}"
        self.add_tool(main, owner.turn, body, owner, rid=rid)
        self.branches.append({"index": index, "description": desc, "prompt": prompt, "returned": returned,
                              "end": reason, "queries": queries, "turns": turns, "opened_at": owner.turn,
                              "context_tokens": len(ctx.context_ids(thread))})
        return True


async def run(task: Any, engine: Engine, cfg: FoldConfig, rng: random.Random, services: Any = None) -> Trajectory:
    """One folding trajectory (module docstring); generation only."""
    return await run_with(services, lambda s: _Fold(task, engine, cfg, rng, s).run())


def reward(task: Any, traj: Trajectory, services: Any = None) -> Any:
    """Outcome reward (memrl.rewards.multiq, as memact's rule reward) plus each branch's scope verdict in the
    Score's info["branch_scope"] (+1 in scope, -1 out of scope, 0 unknown): memrl.rewards.fold."""
    return fold_score(task, traj, services)


SPEC = WorkflowSpec(
    "fold", run, FoldConfig, reward, branches=True,
    format_keys=("no_final_marker", "malformed_calls"),
    eval_defaults={"temperature": 0.0},
    row_columns=row_columns,
)
