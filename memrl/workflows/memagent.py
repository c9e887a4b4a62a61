"""MemAgent (arXiv 2507.02259): read a long context chunk by chunk, overwriting a fixed-size memory,
then answer from the memory alone.

Trajectory = ceil(context_tokens / chunk_tokens) memory calls + 1 final call; each call is an
independent single-turn chat and one training segment.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Any

from memrl.engines.base import Engine
from memrl.rewards import steps
from memrl.rewards.qa import extract_boxed
from memrl.rewards.steps import answer_word_recall
from memrl.rewards.verifiers import check_verifier, get_verifier
from memrl.types import Segment, Task, Trajectory
from memrl.workflows import WorkflowSpec, boxed_em_outcome
from memrl.workflows.chunked import (
    THINK_END,
    ChunkedConfig,
    call_segment,
    call_template,
    loop_metrics,
    reply_ids,
    task_chunks,
    template_prompt_ids,
    think_text_rule,
)
from memrl.workflows.templates import Template

log = logging.getLogger(__name__)


@dataclass
class MemAgentConfig(ChunkedConfig):
    """MemAgent workflow settings; defaults are the published values (MemAgent's run_memory_7B.sh and
    recurrent/impls/memory.py), the prompts excepted (memrl's own wording). The loop settings
    (chunk_tokens, max_chunks, budgets, sampling, no_memory_text, the published-setup switches) are
    ChunkedConfig's, memory_text and enable_thinking (the <think> switches) included."""

    memory_template_file: str | None = None
    """File overriding the memory-update prompt; must contain {problem} (or {prompt}), {memory} and {chunk}
    (read as template_style / template_strip say)."""
    final_template_file: str | None = None
    """File overriding the final-answer prompt; must contain {problem} (or {prompt}) and {memory}."""
    memory_template: str | None = None
    """Inline memory-update prompt (wins over the file)."""
    final_template: str | None = None
    """Inline final-answer prompt (wins over the file)."""
    final_step_reward: str = "format"
    """The final call's step reward under `algorithm=rememr1` (`step_rewards`): format = 1 for exactly one
    non-empty `\\boxed{}` (ReMemR1's format term, any box earns it); or a verifier, named as `reward` is
    (e.g. published_box_f1, format_f1 or box_weighted_f1: a box pays more with the answer's words in it),
    scored on the final reply. GRPO ignores step rewards."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.final_step_reward != "format":
            check_verifier(self.final_step_reward, f"{type(self).__name__}.final_step_reward (format, or a verifier)")
        if any(v is not None for v in (self.memory_template_file, self.final_template_file,
                                       self.memory_template, self.final_template)):
            self.templates()  # a bad template is a one-line error now, not in the middle of a rollout

    def templates(self) -> tuple[Template, Template]:
        mem = self.load_template(
            "memagent_memory", ("problem", "memory", "chunk"), self.memory_template_file, self.memory_template
        )
        fin = self.load_template(
            "memagent_final", ("problem", "memory"), self.final_template_file, self.final_template
        )
        return mem, fin


async def run(task: Task, engine: Engine, cfg: MemAgentConfig, rng: random.Random) -> Trajectory:
    """One MemAgent trajectory for `task`; returns segments (memory calls, then the final call)."""
    mem_tpl, fin_tpl = cfg.templates()
    context_ids, chunks, truncated = task_chunks(task, engine.tokenizer, cfg)
    memory = cfg.no_memory_text
    # prompt_assembly=spliced: the memory's ids when it is a reply (its sampled ids, EOS and pad dropped, as
    # the published synchronous trainer keeps them); None: the memory text, encoded on its own
    memory_ids: list[int] | None = None
    segments: list[Segment] = []
    empty_memories = 0
    memory_lengths: list[int] = []
    thinking = 0
    for i, chunk_ids in enumerate(chunks):
        chunk = engine.tokenizer.decode(chunk_ids)
        prompt_ids, out, reply = await call_template(
            engine, mem_tpl, cfg.sampling(cfg.max_memory_tokens, rng), cfg.prompt_assembly, cfg.enable_thinking,
            problem=task.question, memory=memory if memory_ids is None else memory_ids, chunk=chunk_ids)
        thinking += int(THINK_END in reply or "<think>" in reply)
        new_memory = think_text_rule(reply, cfg.memory_text)
        empty = not new_memory
        empty_memories += int(empty)
        if cfg.prompt_assembly == "spliced":
            if cfg.memory_text == "reply" and (not empty or cfg.empty_memory == "empty"):
                memory_ids = reply_ids(engine.tokenizer, out.token_ids)  # whatever the reply holds (memory.py update)
            elif not (empty and cfg.empty_memory == "keep_previous"):
                memory_ids = None  # the placeholder, or an after_think / strip_think cut, as text
        new_memory = cfg.memory_after(new_memory, memory)
        memory_lengths.append(len(out.token_ids))
        segments.append(call_segment(prompt_ids, out, i, {
            "kind": "memory", "chunk_index": i, "chunk_tokens": len(chunk_ids), "chunk": chunk, "previous_memory": memory,
            "memory": new_memory,
        }))
        memory = new_memory

    prompt_ids, out, answer_text = await call_template(
        engine, fin_tpl, cfg.sampling(cfg.max_final_tokens, rng), cfg.prompt_assembly, cfg.enable_thinking,
        problem=task.question, memory=memory if memory_ids is None else memory_ids)
    boxed = extract_boxed(answer_text)
    segments.append(call_segment(prompt_ids, out, len(chunks), {
        "kind": "final", "memory": memory, "answer_text": answer_text, "prediction": boxed or "",
    }))
    memories = [s.info["memory"] for s in segments[:-1]]
    metrics = {
        **loop_metrics(context_ids, chunks, truncated, memory_lengths, boxed, segments),
        "empty_memories": float(empty_memories),
        "thinking_memory_calls": float(thinking),  # memory replies holding <think> or </think> text
        **memory_recall_metrics(memories, task.answers),
        "model_calls": float(len(segments)),  # as InfMem reports them (the reading summary's calls, chunks read)
        "memory_steps": float(sum(s.info["kind"] == "memory" for s in segments)),
    }
    return Trajectory(task.task_id, "", segments, final_answer=boxed or "", metrics=metrics,
                      info={"answer_text": answer_text, "memories": memories, "reward": cfg.reward,
                            "final_step_reward": cfg.final_step_reward})


def memory_recall_metrics(memories: list[str], golds: list[str]) -> dict[str, float]:
    """Did the memory ever hold the gold answer, and did it still hold it at the end? (all answer words
    present, `memrl.rewards.steps.answer_word_recall` == 1). `answer_seen - answer_kept` is the rate at which
    a memory wrote the answer and later overwrote it: the retention failures a memory policy must learn
    to avoid. Both 0 when there are no golds."""
    if not golds or not memories:
        return {"answer_seen": 0.0, "answer_kept": 0.0}
    hits = [answer_word_recall(m, golds) >= 1.0 for m in memories]
    return {"answer_seen": float(any(hits)), "answer_kept": float(hits[-1])}


def step_rewards(task: Task, traj: Trajectory) -> list[float]:
    """The step reward of each call of a MemAgent trajectory (ReMemR1's terms, no tags): a memory call
    earns its memory gain, recall(m_t) - recall(m_{t-1}) of the gold-answer words (memrl.rewards.steps);
    the final call earns what `workflow.final_step_reward` names: 1 for exactly one non-empty `\\boxed{}`
    (format, the default), or a verifier's score of the final reply. Lets `algorithm=rememr1` mix
    per-call credit into MemAgent's outcome advantage; GRPO ignores these values. Pure: the score stage
    returns them (WorkflowSpec.step_rewards)."""
    final_rule = traj.info.get("final_step_reward", "format")
    out: list[float] = []
    for seg in traj.segments:
        if seg.info.get("kind") == "final":
            text = seg.info.get("answer_text", "")
            if final_rule == "format":
                r = steps.format_reward(text, final=True)
            else:
                r = get_verifier(final_rule)(text, task.answers)
        else:
            r = steps.memory_gain(seg.info.get("memory", ""), seg.info.get("previous_memory"), task.answers)
        out.append(r)
    return out


def memory_prompts(task: Task, traj: Trajectory, cfg: MemAgentConfig, tokenizer: Any) -> tuple[list[int], list[int]]:
    """InfoMem's pair of final-answer prompts (WorkflowSpec.memory_prompts): the final call's prompt exactly as
    the model saw it (the final memory in it), and the same prompt with `no_memory_text` as the memory."""
    final = traj.segments[-1]
    if final.info.get("kind") != "final":
        raise ValueError(f"trajectory {traj.trajectory_id} does not end with a final-answer call")
    _, fin_tpl = cfg.templates()
    without = template_prompt_ids(tokenizer, fin_tpl, cfg.prompt_assembly, cfg.enable_thinking,
                                  problem=task.question, memory=cfg.no_memory_text)
    return list(final.prompt_ids), without


def reward(task: Task, traj: Trajectory) -> float:
    """Outcome: the verifier `workflow.reward` names (default boxed_em: exact match of the last \\boxed{},
    max over gold answers). The step rewards are `step_rewards`'."""
    return boxed_em_outcome(task, traj)


SPEC = WorkflowSpec(
    "memagent", run, MemAgentConfig, reward, step_rewards=step_rewards, memory_prompts=memory_prompts,
    format_keys=("no_box",),
    train_defaults={"max_chunks": 8},  # training caps the context at 8 chunks (the published recipes)
    ask=True,  # `memrl ask` runs it
)
"""`workflow=memagent` (registered in memrl.workflows as memrl.workflows.memagent:SPEC); evaluation is
greedy (the spec's default eval_defaults)."""
