"""MemAgent (arXiv 2507.02259): read a long context chunk by chunk, overwriting a fixed-size memory,
then answer from the memory alone.

Trajectory = ceil(context_tokens / chunk_tokens) memory calls + 1 final call; each call is an
independent single-turn chat and one training segment.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from memrl.engines.base import Engine, SamplingParams
from memrl.types import Segment, Task, Trajectory
from memrl.workflows.templates import Template, chat_prompt, load_template

log = logging.getLogger(__name__)

NO_MEMORY = "No previous memory"


@dataclass
class MemAgentConfig:
    """MemAgent workflow settings; defaults are the published values (REFERENCE.md section 1)."""

    chunk_tokens: int = 5000
    """Tokens of context per memory call (contiguous, non-overlapping, ignoring document boundaries)."""
    max_chunks: int = 0
    """Cap on chunks by centre truncation (keep head half + tail half); 0 = no cap (evaluation).
    The published training recipe uses 8."""
    max_memory_tokens: int = 1024
    """Generation budget of a memory update; the memory can never be longer than this."""
    max_final_tokens: int = 1024
    """Generation budget of the final answer call."""
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    no_memory_text: str = NO_MEMORY
    """The first memory, and the fallback when a generated memory is empty."""
    memory_template_file: str | None = None
    """File overriding the memory-update prompt; must contain {problem}, {memory} and {chunk}."""
    final_template_file: str | None = None
    """File overriding the final-answer prompt; must contain {problem} and {memory}."""
    memory_template: str | None = None
    """Inline memory-update prompt (wins over the file)."""
    final_template: str | None = None
    """Inline final-answer prompt (wins over the file)."""

    def __post_init__(self) -> None:
        for name in ("chunk_tokens", "max_memory_tokens", "max_final_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"MemAgentConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_chunks < 0:
            raise ValueError(f"MemAgentConfig.max_chunks must be >= 0, got {self.max_chunks}")

    def templates(self) -> tuple[Template, Template]:
        mem = load_template(
            "memagent_memory", ("problem", "memory", "chunk"), self.memory_template_file, self.memory_template
        )
        fin = load_template("memagent_final", ("problem", "memory"), self.final_template_file, self.final_template)
        return mem, fin

    def sampling(self, max_tokens: int, rng: random.Random) -> SamplingParams:
        seed = rng.getrandbits(31) if self.temperature > 0 else None
        return SamplingParams(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, max_tokens=max_tokens, seed=seed
        )


def centre_truncate(ids: list[int], limit: int) -> list[int]:
    """Keep the first ceil(limit/2) and the last floor(limit/2) tokens when ids is longer than limit."""
    if limit <= 0 or len(ids) <= limit:
        return ids
    head = (limit + 1) // 2
    tail = limit - head
    return ids[:head] + (ids[len(ids) - tail :] if tail else [])


def chunk_context(context_ids: list[int], chunk_tokens: int, max_chunks: int = 0) -> tuple[list[list[int]], bool]:
    """Cut token ids into contiguous chunks of chunk_tokens (last may be shorter); (chunks, truncated)."""
    limit = max_chunks * chunk_tokens if max_chunks else 0
    kept = centre_truncate(context_ids, limit)
    chunks = [kept[i : i + chunk_tokens] for i in range(0, len(kept), chunk_tokens)]
    return chunks, len(kept) < len(context_ids)


def decode_response(tokenizer, token_ids: list[int]) -> str:
    """Generated text without EOS/pad or other special tokens, whitespace-trimmed."""
    return tokenizer.decode(token_ids, skip_special_tokens=True).strip()


async def run(task: Task, engine: Engine, cfg: MemAgentConfig, rng: random.Random) -> Trajectory:
    """One MemAgent trajectory for `task`; returns segments (memory calls, then the final call)."""
    from memrl.rewards.qa import extract_boxed

    tok = engine.tokenizer
    mem_tpl, fin_tpl = cfg.templates()
    context_ids = list(tok.encode(task.context, add_special_tokens=False)) if task.context else []
    chunks, truncated = chunk_context(context_ids, cfg.chunk_tokens, cfg.max_chunks)
    if not chunks:
        log.warning("task %s has an empty context: answering from the empty memory", task.task_id)

    memory = cfg.no_memory_text
    segments: list[Segment] = []
    empty_memories = 0
    memory_lengths: list[int] = []
    for i, chunk_ids in enumerate(chunks):
        chunk = tok.decode(chunk_ids)
        prompt_text, prompt_ids = chat_prompt(tok, mem_tpl.render(problem=task.question, memory=memory, chunk=chunk))
        out = await engine.generate(prompt_ids, cfg.sampling(cfg.max_memory_tokens, rng))
        new_memory = decode_response(tok, out.token_ids)
        if not new_memory:
            empty_memories += 1
            new_memory = cfg.no_memory_text
        memory_lengths.append(len(out.token_ids))
        segments.append(
            Segment(
                prompt_ids=prompt_ids,
                response_ids=list(out.token_ids),
                response_logprobs=list(out.logprobs),
                step=i,
                info={
                    "kind": "memory",
                    "chunk_index": i,
                    "chunk_tokens": len(chunk_ids),
                    "chunk": chunk,
                    "previous_memory": memory,
                    "memory": new_memory,
                    "finish_reason": out.finish_reason,
                },
            )
        )
        memory = new_memory

    prompt_text, prompt_ids = chat_prompt(tok, fin_tpl.render(problem=task.question, memory=memory))
    out = await engine.generate(prompt_ids, cfg.sampling(cfg.max_final_tokens, rng))
    answer_text = decode_response(tok, out.token_ids)
    boxed = extract_boxed(answer_text)
    segments.append(
        Segment(
            prompt_ids=prompt_ids,
            response_ids=list(out.token_ids),
            response_logprobs=list(out.logprobs),
            step=len(chunks),
            info={
                "kind": "final",
                "memory": memory,
                "answer_text": answer_text,
                "prediction": boxed or "",
                "finish_reason": out.finish_reason,
            },
        )
    )
    memories = [s.info["memory"] for s in segments[:-1]]
    metrics = {
        "num_chunks": float(len(chunks)),
        "context_tokens": float(len(context_ids)),
        "tokens_read": float(sum(len(c) for c in chunks)),
        "truncated": float(truncated),
        "empty_memories": float(empty_memories),
        "memory_tokens_mean": sum(memory_lengths) / len(memory_lengths) if memory_lengths else 0.0,
        "no_box": float(boxed is None),
        "generated_tokens": float(sum(len(s.response_ids) for s in segments)),
        **memory_recall_metrics(memories, task.answers),
    }
    return Trajectory(
        task_id=task.task_id,
        trajectory_id="",
        segments=segments,
        final_answer=boxed or "",
        metrics=metrics,
        info={"answer_text": answer_text, "memories": memories},
    )


def memory_recall_metrics(memories: list[str], golds: list[str]) -> dict[str, float]:
    """Did the memory ever hold the gold answer, and did it still hold it at the end? (all answer words
    present, `memrl.rewards.steps.answer_word_recall` == 1). `answer_seen - answer_kept` is the rate at which
    a memory wrote the answer and later overwrote it: the retention failures a memory policy must learn
    to avoid. Both 0 when there are no golds."""
    from memrl.rewards.steps import answer_word_recall

    if not golds or not memories:
        return {"answer_seen": 0.0, "answer_kept": 0.0}
    hits = [answer_word_recall(m, golds) >= 1.0 for m in memories]
    return {"answer_seen": float(any(hits)), "answer_kept": float(hits[-1])}


def assign_step_rewards(task: Task, traj: Trajectory) -> list[float]:
    """Write `Segment.step_reward` on a MemAgent trajectory (ReMemR1's terms, no tags): a memory call
    earns its memory gain, recall(m_t) - recall(m_{t-1}) of the gold-answer words (memrl.rewards.steps);
    the final call earns 1 for exactly one non-empty `\\boxed{}`. Lets `algorithm=rememr1` mix
    per-call credit into MemAgent's outcome advantage; GRPO ignores these values."""
    from memrl.rewards import steps

    out: list[float] = []
    for seg in traj.segments:
        if seg.info.get("kind") == "final":
            r = steps.format_reward(seg.info.get("answer_text", ""), final=True)
        else:
            r = steps.memory_gain(seg.info.get("memory", ""), seg.info.get("previous_memory"), task.answers)
        seg.step_reward = r
        out.append(r)
    return out


def reward(task: Task, traj: Trajectory) -> float:
    """Outcome: exact match of the last \\boxed{} (max over gold answers); also writes step rewards."""
    from memrl.workflows import boxed_em_outcome

    assign_step_rewards(task, traj)
    return boxed_em_outcome(task, traj)
