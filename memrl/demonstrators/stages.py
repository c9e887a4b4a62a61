"""Scripted policies as stages of a recipe: build one, record its demonstrations through a workflow (the
SFT rows are the workflow's own segments, built exactly as RL builds its rows) and calibrate MemAct's
working-context budget with it.

- MemAgent (synthetic task): `mixture_demonstrator`, `record_demonstrations`, `reading_segments`.
- MemAct (synthetic_memact task): `memact_demonstrations`, `calibrate_budget`.
- fold, summarize, sliding_window (synthetic_memact task): `context_demonstrator`, `context_demonstrations`,
  `calibrate_fold_budget`.

Used by the recipe methods (memrl.recipes: their cold starts, through memrl.recipes.pipeline) and their model
init (memrl.recipes.scratch).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memrl.config import MAX_TOKENS
from memrl.demonstrators.context import FoldDemonstrator, SearchDemonstrator, SummaryDemonstrator
from memrl.demonstrators.engine import play_scripted
from memrl.demonstrators.memact import MemActDemonstrator
from memrl.demonstrators.synthetic import MixtureDemonstrator
from memrl.quiet import encode_text
from memrl.types import Group, Segment, Task
from memrl.workflows.templates import chat_prompt

# ------------------------------------------------------------------------------------------- MemAgent


def mixture_demonstrator(wf_cfg: Any, *, seed: int, p_aware: float, budget: int = 1, skip_prob: float = 0.4,
                 unanswerable_text: str | None = None, fact_sep: str | None = "is", restate_key: bool = False,
                 restate_sep: str | None = ":", keep_distractors: bool = False) -> MixtureDemonstrator:
    """The MemAgent cold start's scripted demonstrator on the synthetic task, in the workflow's templates
    (a `MixtureDemonstrator`: per memory step the optimal `QuestionAwareDemonstrator` with probability `p_aware`, the
    question-blind `RecentFactsDemonstrator` otherwise; p_aware 0 plays `RecentFactsDemonstrator` exactly)."""
    mem_tpl, fin_tpl = wf_cfg.templates()
    return MixtureDemonstrator(mem_tpl.text, fin_tpl.text, budget=budget, skip_prob=skip_prob,
                       no_memory_text=wf_cfg.no_memory_text, seed=seed, unanswerable_text=unanswerable_text or None,
                       fact_sep=fact_sep, restate_key=restate_key, restate_sep=restate_sep, p_aware=p_aware,
                       keep_distractors=keep_distractors)


def record_demonstrations(rule: Any, tasks: list[Task], tokenizer: Any, wf_cfg: Any,
                          workflow: str = "memagent") -> list[Group]:
    """The scripted `rule` played through `workflow` by ScriptedEngine, one trajectory per task."""
    return play_scripted(rule, tasks, tokenizer, workflow, wf_cfg)


def reading_segments(tasks: list[Task], tokenizer: Any, final_template: Any) -> list[Segment]:
    """One row per task: the final-answer prompt with the WHOLE document as the memory, answered with the
    boxed gold answer (reading comprehension; no memory decision is shown)."""
    out = []
    for t in tasks:
        _, prompt_ids = chat_prompt(tokenizer, final_template.render(problem=t.question, memory=t.context.strip()))
        resp = encode_text(tokenizer, f"\\boxed{{ {t.answers[0]}}}")  # a row's answer: plain text
        resp.append(tokenizer.eos_token_id)
        out.append(Segment(prompt_ids=prompt_ids, response_ids=resp, response_logprobs=[0.0] * len(resp),
                           step=0, info={"kind": "reading"}, task_id=t.task_id))
    return out


# ------------------------------------------------------------------------------------------- MemAct


def memact_demonstrations(tasks: list[Task], tokenizer: Any, wf_cfg: Any, late_prob: float, seed: int,
                          topk: int = 2, keep_results: int = 2, prune_tool: bool = True) -> list[Group]:
    """The scripted MemAct agent's trajectories (one Group per task; `MemActDemonstrator` with
    `keep_results`, pruning late with probability `late_prob`), played through the memact workflow with the
    prune tool on; `prune_tool=False` withholds it (the search-only agent: it never prunes, late_prob 1)."""
    script = MemActDemonstrator(keep_results=keep_results, late_prob=late_prob if prune_tool else 1.0, seed=seed,
                                topk=topk)
    wf = replace(wf_cfg, no_prune_prob=0.0, prune_tool=prune_tool)
    return play_scripted(script, tasks, tokenizer, "memact", wf, seed=seed, concurrency=256)


def calibrate_budget(tasks: list[Task], tokenizer: Any, wf_cfg: Any, topk: int = 2) -> int:
    """The largest prompt of the flawless scripted agent (late_prob 0) on `tasks`; raises ValueError when a
    prompt holding three search results (late_prob 1) would fit in it too, so pruning would not be needed."""
    big = replace(wf_cfg, max_context_tokens=MAX_TOKENS)
    two = [g.trajectories[0] for g in memact_demonstrations(tasks, tokenizer, big, 0.0, 0, topk)]
    budget = int(max(t.metrics["peak_context_tokens"] for t in two))
    three = [g.trajectories[0] for g in memact_demonstrations(tasks, tokenizer, big, 1.0, 0, topk)]
    over = [t.metrics["peak_context_tokens"] for t in three if t.metrics["searches"] >= 3]
    if not over or min(over) <= budget:
        raise ValueError(f"context budget {budget}: a prompt with three search results has "
                         f"{min(over, default=0):.0f} tokens and fits; the task would not need pruning")
    return budget


def calibrate_search_only_budget(tasks: list[Task], tokenizer: Any, wf_cfg: Any, topk: int = 2) -> int:
    """The largest prompt of the scripted agent that never prunes on `tasks`, with the prune tool withheld or
    offered (its system prompt and tool line are longer): a budget in which searching alone answers every
    one of them under either prompt, so pruning is a choice that only shortens the context (the MemAct
    demo's `budget=search_only`, docs/concepts/memact.md "Context curation")."""
    big = replace(wf_cfg, max_context_tokens=MAX_TOKENS)
    groups = [g for offered in (False, True)
              for g in memact_demonstrations(tasks, tokenizer, big, 1.0, 0, topk, prune_tool=offered)]
    return int(max(g.trajectories[0].metrics["peak_context_tokens"] for g in groups))


# ------------------------------------------------------------------ the context-management family


def context_demonstrations(tasks: list[Task], tokenizer: Any, workflow: str, wf_cfg: Any, agent: Any,
                           seed: int = 0) -> list[Group]:
    """The scripted `agent` (memrl.demonstrators.context: SearchDemonstrator, FoldDemonstrator,
    SummaryDemonstrator) played through `workflow` (fold, summarize, sliding_window), one trajectory per task:
    the cold start's SFT rows are its segments, cut exactly as RL cuts its rows."""
    return play_scripted(agent, tasks, tokenizer, workflow, wf_cfg, seed=seed, concurrency=256)


def context_demonstrator(kind: str, late_prob: float = 0.0, seed: int = 0, topk: int = 2) -> Any:
    """The scripted agent of a context-management arm: "search" (SearchDemonstrator; it has no flaw, so
    `late_prob` must be 0), "fold" (FoldDemonstrator) or "summary" (SummaryDemonstrator), with `late_prob`
    and `seed`."""
    if kind == "search":
        if late_prob:
            raise ValueError(f"context_demonstrator: the search agent has no late_prob, got {late_prob}")
        return SearchDemonstrator(topk)
    if kind == "fold":
        return FoldDemonstrator(late_prob=late_prob, seed=seed, topk=topk)
    if kind == "summary":
        return SummaryDemonstrator(late_prob=late_prob, seed=seed, topk=topk)
    raise ValueError(f"context_demonstrator: kind must be search, fold or summary, got {kind!r}")


def calibrate_fold_budget(tasks: list[Task], tokenizer: Any, fold_cfg: Any, search_cfg: Any) -> int:
    """The largest prompt of the flawless folding agent on `tasks` (fold workflow `fold_cfg`, no budget): the
    smallest budget in which folding answers every one of them. Raises ValueError when the unmanaged search
    agent (sliding_window `search_cfg` with window_turns 0, no budget) fits in it on some task, so the budget
    would not force context management."""
    fold = context_demonstrations(tasks, tokenizer, "fold", replace(fold_cfg, max_context_tokens=MAX_TOKENS),
                                  context_demonstrator("fold"))
    budget = int(max(g.trajectories[0].metrics["peak_context_tokens"] for g in fold))
    react = context_demonstrations(tasks, tokenizer, "sliding_window",
                                   replace(search_cfg, window_turns=0, max_context_tokens=MAX_TOKENS), context_demonstrator("search"))
    fits = [g.task_id for g in react if g.trajectories[0].metrics["peak_context_tokens"] <= budget]
    if fits:
        raise ValueError(f"context budget {budget}: the unmanaged search agent fits in it on {len(fits)} of "
                         f"{len(react)} tasks (first {fits[0]}); more sub_questions or padding_words are needed")
    return budget
