"""The rollout data model: Task -> Trajectory (of Segments) -> Group (with its Task); Score per trajectory;
Document, one corpus passage (the retrieval corpus's rows, memrl.data.corpus; what retrievers return).

A `Segment` is one model call and one training row. Token ids and logprobs are the ones the engine
produced; nothing downstream re-tokenizes decoded text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class DataModelError(ValueError):
    """A rollout object was built with inconsistent fields."""


@dataclass
class Task:
    """One question over one (long) context, with its gold answers."""

    task_id: str
    question: str
    context: str
    answers: list[str]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.task_id, str) or not self.task_id:
            raise DataModelError(f"Task.task_id must be a non-empty string, got {self.task_id!r}")
        if not isinstance(self.question, str):
            raise DataModelError(f"Task {self.task_id}: question must be a string, got {type(self.question).__name__}")
        if not isinstance(self.context, str):
            raise DataModelError(f"Task {self.task_id}: context must be a string, got {type(self.context).__name__}")
        if isinstance(self.answers, str):
            self.answers = [self.answers]
        if not isinstance(self.answers, list) or not all(isinstance(a, str) for a in self.answers):
            raise DataModelError(f"Task {self.task_id}: answers must be a list of strings, got {self.answers!r}")


@dataclass
class Segment:
    """One model call: the prompt it saw, what it generated, and how that trains.

    `loss_mask` has one entry per response token: 1 where the model generated the token and it
    should train, 0 elsewhere (e.g. tool output spliced into a MemAct context). It defaults to all ones.
    `advantage` is written by the algorithms (one value per segment) before packing; an estimator with
    token-level terms (FoldGRPO's process rewards, memrl.algorithms.fold) also writes `token_advantages`,
    one value per response token, which packing then uses instead of `advantage`.
    """

    prompt_ids: list[int]
    response_ids: list[int]
    response_logprobs: list[float]
    loss_mask: list[int] | None = None
    step: int = 0
    step_reward: float | None = None
    advantage: float | None = None
    info: dict[str, Any] = field(default_factory=dict)
    trajectory_id: str = ""
    task_id: str = ""
    token_advantages: list[float] | None = None
    """One advantage per response token (None: every token takes `advantage`); `advantage` then holds their
    mean over the trained tokens (logs, and the zero-advantage skip: a row trains when it is non-zero or
    any of these is)."""
    old_logprobs: list[float] | None = None
    """The trainer's own logprobs of the response before the update (algorithm.old_logprobs=trainer:
    recomputed once per RL step, before its first optimizer step); None: the PPO ratio takes
    `response_logprobs`, the engine's."""
    routing: Any = None
    """MoE routing replay r3 (memrl.training.update.routing): the engine's experts of the row's fed tokens, uint8
    [layers, tokens - 1, top_k]; None: the trainer routes the row freely."""

    def __post_init__(self) -> None:
        where = f"Segment(step={self.step}, trajectory={self.trajectory_id or '?'})"
        if not self.prompt_ids:
            raise DataModelError(f"{where}: prompt_ids is empty")
        n = len(self.response_ids)
        if len(self.response_logprobs) != n:
            raise DataModelError(
                f"{where}: response_logprobs has {len(self.response_logprobs)} entries, "
                f"response_ids has {n}; they must match"
            )
        if self.loss_mask is None:
            self.loss_mask = [1] * n
        elif len(self.loss_mask) != n:
            raise DataModelError(f"{where}: loss_mask has {len(self.loss_mask)} entries, response_ids has {n}")
        elif any(m not in (0, 1) for m in self.loss_mask):
            raise DataModelError(f"{where}: loss_mask must hold only 0 and 1")
        if self.token_advantages is not None and len(self.token_advantages) != n:
            raise DataModelError(f"{where}: token_advantages has {len(self.token_advantages)} entries, "
                                 f"response_ids has {n}")
        if any(not math.isfinite(lp) or lp > 1e-6 for lp in self.response_logprobs):
            raise DataModelError(f"{where}: response_logprobs must be finite and <= 0")

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.response_ids)

    @property
    def num_trained_tokens(self) -> int:
        assert self.loss_mask is not None
        return sum(self.loss_mask)


@dataclass
class Trajectory:
    """One attempt at one task: ordered segments, the final answer and its outcome reward."""

    task_id: str
    trajectory_id: str
    segments: list[Segment]
    final_answer: str = ""
    reward: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for i, seg in enumerate(self.segments):
            if seg.trajectory_id and seg.trajectory_id != self.trajectory_id:
                raise DataModelError(
                    f"Trajectory {self.trajectory_id}: segment {i} belongs to trajectory {seg.trajectory_id}"
                )
            seg.trajectory_id = self.trajectory_id
            seg.task_id = self.task_id

    def set_id(self, trajectory_id: str) -> None:
        """Name this trajectory (and its segments); the rollout runner calls this."""
        self.trajectory_id = trajectory_id
        for seg in self.segments:
            seg.trajectory_id = trajectory_id


@dataclass
class Group:
    """The n trajectories sampled for one task, and the task; advantages are computed within a group.

    `task` is the Task they answer (the rollout runner always sets it; the score stage and the training
    dump read it); None only for groups built by hand."""

    task_id: str
    trajectories: list[Trajectory]
    task: Task | None = None

    def __post_init__(self) -> None:
        if self.task is not None and self.task.task_id != self.task_id:
            raise DataModelError(f"Group {self.task_id}: its task is {self.task.task_id}")
        for t in self.trajectories:
            if t.task_id != self.task_id:
                raise DataModelError(f"Group {self.task_id}: trajectory {t.trajectory_id} is for task {t.task_id}")
        ids = [t.trajectory_id for t in self.trajectories]
        if len(set(ids)) != len(ids):
            raise DataModelError(f"Group {self.task_id}: duplicate trajectory ids {ids}")

    @property
    def rewards(self) -> list[float]:
        out = []
        for t in self.trajectories:
            if t.reward is None:
                raise DataModelError(f"Group {self.task_id}: trajectory {t.trajectory_id} has no reward yet")
            out.append(float(t.reward))
        return out

    def segments(self) -> list[Segment]:
        return [s for t in self.trajectories for s in t.segments]


@dataclass
class Score:
    """What the score stage returns for one trajectory (memrl.workflows.rollouts.score_trajectory).

    `reward`: the outcome reward; `step_rewards`: one value (or None) per segment, from the workflow's
    `step_rewards` function (None when it has none); `metrics` / `info`: what the reward reports (an LLM
    judge's verdict, a failed reward's `reward_error`), merged into the trajectory's by
    memrl.workflows.rollouts.apply_scores, the one place that writes scores onto trajectories."""

    reward: float
    step_rewards: list[float | None] | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Document:
    """One corpus passage: `id` is stable across runs, `title` may be empty."""

    id: str
    title: str
    text: str
