"""The training rows of each workflow without a trained model: the scripted agents played through the real
workflows with the tiny models' tokenizer, cut into rows exactly as RL cuts them (memrl.demonstrators.stages).

Used by prefix sharing's exactness test and its benchmark (memrl.training.update.prefix_sharing,
benchmarks/prefix_sharing.py), which need the rows' real shapes: which rows share which prefix.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer

from memrl.data import synthetic, synthetic_memact
from memrl.demonstrators.engine import play_scripted
from memrl.demonstrators.stages import (
    context_demonstrations,
    context_demonstrator,
    memact_demonstrations,
    mixture_demonstrator,
)
from memrl.models.tiny import cached_tiny_model
from memrl.types import Segment
from memrl.workflows import parse_workflow

WORKFLOWS = ("memagent", "fold", "summarize", "sliding_window", "memact")

MEMAGENT_DEMO = {"chunk_tokens": 8, "max_chunks": 0, "max_memory_tokens": 10, "max_final_tokens": 6,
                 "memory_template": "Q: {problem}\nM: {memory}\nS:{chunk}",
                 "final_template": "Q: {problem}\nM: {memory}\nA:"}
"""memrl/configs/demo_cpu.yaml's MemAgent workflow."""

CONTEXT_DEMO = {"retriever_scope": "task", "max_turn_tokens": 96, "temperature": 0.0, "max_assistant_turns": 16,
                "system_template": "Answer the questions by searching.", "max_context_tokens": 10**7,
                "answer_instruction": "End with FINAL_ANSWER: a JSON object of the answers."}
"""benchmarks/context_management.py's workflow settings (no context budget by default)."""

SUMMARIZE_BUDGET = 1500
"""summarize's default max_context_tokens: it summarizes (a `part` row) only when a prompt passes 0.8 of it."""


def workflow_rows(workflow: str, tasks: int, n: int = 1, seed: int = 0, sub_questions: int = 3,
                  padding_words: int = 40, max_context_tokens: int | None = None) -> list[Segment]:
    """The rows of `tasks` tasks of `workflow` (one of WORKFLOWS), `n` samples each (memagent: its scripted
    rule decides at random, so samples differ; the others are deterministic agents, n = 1). memagent: the
    CPU demo's synthetic task and templates, 2-8 chunks; the others: the context demo's lookup task
    (`sub_questions` facts, `padding_words` filler words per passage) with no context budget, summarize with
    `max_context_tokens` (None: SUMMARIZE_BUDGET)."""


    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    if workflow == "memagent":
        groups = _memagent(tok, tasks, n, seed)
    elif workflow in WORKFLOWS:
        groups = _context(workflow, tok, tasks, seed, sub_questions, padding_words, max_context_tokens)
    else:
        raise ValueError(f"workflow_rows: workflow must be one of {', '.join(WORKFLOWS)}, got {workflow!r}")
    return [s for g in groups for s in g.segments()]


def _memagent(tok: Any, tasks: int, n: int, seed: int) -> list[Any]:

    spec, wf = parse_workflow({"name": "memagent", **MEMAGENT_DEMO})
    data = synthetic.SyntheticConfig(min_chunks=2, num_chunks=8, chunk_words=8, fact_position="start", num_keys=16,
                           num_values=16)
    rule = mixture_demonstrator(wf, seed=seed, p_aware=0.5)
    return play_scripted(rule, synthetic.make_tasks(data, tasks, seed=1000 + seed), tok, spec, wf, n=n, seed=seed)


def _context(workflow: str, tok: Any, tasks: int, seed: int, sub_questions: int, padding_words: int,
             max_context_tokens: int | None) -> list[Any]:

    task_list = synthetic_memact.make_tasks(synthetic_memact.MemActTaskConfig(sub_questions=[sub_questions], padding_words=padding_words), tasks,
                           seed=seed)
    section: dict[str, Any] = {"name": workflow, **CONTEXT_DEMO}
    if max_context_tokens is not None or workflow == "summarize":
        section["max_context_tokens"] = max_context_tokens or SUMMARIZE_BUDGET
    if workflow == "memact":
        section = {k: v for k, v in section.items() if k not in ("system_template", "answer_instruction")}
        _, wf = parse_workflow(section)
        return memact_demonstrations(task_list, tok, wf, late_prob=0.0, seed=seed)
    if workflow == "sliding_window":
        section["window_turns"] = 2
    agent = {"fold": "fold", "summarize": "summary", "sliding_window": "search"}[workflow]
    _, wf = parse_workflow(section)
    return context_demonstrations(task_list, tok, workflow, wf, context_demonstrator(agent), seed=seed)
