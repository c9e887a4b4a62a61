"""Summarization as an action (SUPO arXiv 2510.06727; ReSum arXiv 2509.13313; FoldAgent's summary agent):
when the working context nears its budget the agent writes a summary, and the context restarts from
system + task + that summary.

The loop is the family's search agent (memrl.workflows.search_agent). Before each turn, when the prompt
would pass `summary_fraction` x `max_context_tokens` and the part holds at least one turn, the workflow
appends a user message asking for a summary (`summary_request`, memrl's wording unless given) and samples
the summary turn. Its text (between <summary> and </summary> when present, else the whole reply) goes into
a user message after the first prompt (`summary_restart`, {summary}), tokenized once: the next part's
context is first prompt + that message. With `summary_rollback` (published: FoldAgent's `rollback(k=2)`)
the last turn and its tool results are dropped before the request (they never train). After
`max_summaries` summaries a further trigger ends the trajectory (stop "max_summaries"). With
`summarizer.url` a second model writes the summary instead (ReSum): no request enters the policy's context.

Rows (SUPO / the published code: one row per summary-separated part): part k's row is its context just
before the restart (prompt = first prompt [+ the previous summary message] up to its first turn's header;
mask 1 on the part's sampled ids, the summary turn's included). The last part is a row of its own. A
trajectory with s summaries has s + 1 rows; with algorithm=grpo (credit=broadcast) every row gets the
trajectory's advantage (SUPO's group-relative advantage over whole trajectories, the gradient summed over
parts); overlong masking is `overlong_mask` (memrl.workflows.search_agent).
"""

from __future__ import annotations

import dataclasses
import random
import re
from dataclasses import dataclass, field
from typing import Any

from memrl.config import MAX_COUNT, valid
from memrl.engines.base import Engine
from memrl.rewards.judge import JudgeClient, JudgeSettings
from memrl.rewards.multiq import outcome_reward as rule_reward
from memrl.rewards.multiq import row_columns
from memrl.services.session import run_with
from memrl.tools import context as ctx
from memrl.types import Trajectory
from memrl.workflows import WorkflowSpec
from memrl.workflows.search_agent import AgentLoop, SearchAgentConfig, thread_row

SUMMARY_REQUEST = ("Your context is nearly full. Write a summary of your progress: every fact you found that "
                   "answers a question (names and values), and what is still to find. Put it between <summary> "
                   "and </summary> and call no tool.")
SUMMARY_RESTART = "Your progress so far, summarized:\n{summary}\nContinue from here."
_SUMMARY = re.compile(r"<summary>(.*?)</summary>", re.DOTALL)


@dataclass
class SummarizeConfig(SearchAgentConfig):
    """Summarize workflow settings (memrl's defaults)."""

    summary_fraction: float = valid(0.8, gt=0, le=1)
    """Summarize before a turn whose prompt would pass this share of max_context_tokens (published: 0.95 of
    the response budget, measured after the first prompt)."""
    max_summaries: int = valid(9, ge=0, le=MAX_COUNT)
    """Summaries per trajectory (published: max_session 10 sessions = 9 summaries); one more trigger ends it."""
    summary_rollback: bool = False
    """True (published `rollback(k=2)`): drop the last turn and its tool results before asking for the
    summary; False (memrl): keep them (they train in the part's row and the summary sees them)."""
    summary_request: str = SUMMARY_REQUEST
    """The user message asking for the summary."""
    summary_restart: str = SUMMARY_RESTART
    """The user message that carries the summary into the next part; needs {summary}."""
    summarizer: JudgeSettings = field(default_factory=JudgeSettings)
    """A second model writes the summaries (ReSum, arXiv 2509.13313): with `summarizer.url` set, an
    OpenAI-compatible chat endpoint (memrl's judge client: url, model, max_tokens, temperature, timeout_s,
    retries, api_key_env; the verdict fields are unused) gets `summary_request`, the question and the part's
    messages, and its reply is the summary; the policy writes none (its part row ends at its last turn).
    A failed call is counted in summary_errors and the context restarts with an empty summary. Unset = the
    policy writes the summary (SUPO)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if "{summary}" not in self.summary_restart:
            raise ValueError("workflow.summary_restart must contain {summary}")


def extract_summary(text: str) -> str:
    """The last <summary>...</summary> block's text (stripped), else the whole reply (stripped)."""
    found = _SUMMARY.findall(text)
    return found[-1].strip() if found else text.strip()


class _Summarize(AgentLoop):
    counters = ("summary_errors",)

    def __init__(self, task: Any, engine: Engine, cfg: SummarizeConfig, rng: random.Random, services: Any) -> None:
        super().__init__(task, engine, cfg, rng, services)
        self.services = services

    async def service_summary(self, msgs: list[ctx.Message]) -> str:
        """The summarizer's summary of the part (SummarizeConfig.summarizer); "" when the call failed."""
        cfg = self.cfg
        lines = [f"{m.kind}: {m.text}" for m in msgs[1:]]
        prompt = f"{cfg.summary_request}\n\nQuestion:\n{self.task.question}\n\nSo far:\n" + "\n\n".join(lines)
        client = self.services.judge(dataclasses.asdict(cfg.summarizer)) if self.services is not None else None
        own = client is None
        if own:
            client = JudgeClient(cfg.summarizer)
        try:
            kind, text = await client.chat(prompt)
        finally:
            if own:
                await client.close()
        if kind is not None:
            self.counts["summary_errors"] += 1
            return ""
        return extract_summary(text)

    async def run(self) -> Trajectory:
        cfg = self.cfg
        head = self.head()
        msgs: list[ctx.Message] = [head]
        since, summaries, answer, stop = -1, 0, "", "max_turns"
        summary_texts: list[str] = []
        while self.turn < cfg.max_assistant_turns:
            prompt_len = len(ctx.context_ids(msgs)) + len(self.header)
            has_turn = any(m.kind == "assistant" and m.turn > since for m in msgs)
            if prompt_len > cfg.summary_fraction * cfg.max_context_tokens and has_turn:
                if summaries >= cfg.max_summaries:
                    stop = "max_summaries"
                    break
                if cfg.summary_rollback:
                    last = max(m.turn for m in msgs if m.kind == "assistant")
                    if last > since:
                        kept = [m for m in msgs if m.turn != last or m.kind == "user"]
                        self.drop(msgs, kept)
                        msgs = kept
                if cfg.summarizer.url:  # a second model writes it (ReSum)
                    summary = await self.service_summary(msgs)
                    last = max((m.turn for m in msgs if m.kind == "assistant"), default=since)
                else:
                    msgs.append(self.user_message(cfg.summary_request, self.turn))
                    t = await self.step(msgs, set())
                    if t is None:
                        stop = "context_budget"
                        break
                    summary, last = extract_summary(t.text), t.message.turn
                summary_texts.append(summary)
                self.add_segment(thread_row(msgs, since, len(self.segments),
                                            {"kind": "part", "part": summaries, "summary": summary}))
                restart = [head, self.user_message(cfg.summary_restart.replace("{summary}", summary), last)]
                self.drop(msgs, restart)
                msgs, since = restart, last
                summaries += 1
                continue
            end = await self.search_turn(msgs)
            if end is not None:
                answer, stop = end
                break
        self.add_segment(thread_row(msgs, since, len(self.segments), {"kind": "final", "part": summaries}))
        return self.trajectory(answer, stop, msgs, {"summaries": float(summaries),
                                                    "stop_max_summaries": float(stop == "max_summaries")},
                               {"summaries": summary_texts})


async def run(task: Any, engine: Engine, cfg: SummarizeConfig, rng: random.Random,
              services: Any = None) -> Trajectory:
    """One summarizing trajectory (module docstring); generation only."""
    return await run_with(services, lambda s: _Summarize(task, engine, cfg, rng, s).run())


SPEC = WorkflowSpec(
    "summarize", run, SummarizeConfig, rule_reward,
    format_keys=("no_final_marker", "malformed_calls"),
    eval_defaults={"temperature": 0.0},
    row_columns=row_columns,
)
