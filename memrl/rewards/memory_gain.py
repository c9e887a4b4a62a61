"""InfoMem's final-memory reward (arXiv 2606.03329): how much the final memory raises the policy's per-token
log-likelihood of the gold answer, against no memory, on successful trajectories only, normalized before it
is added to the outcome reward.

    gain_i  = mean_t log pi(a_t | final prompt with memory m_i, a_<t) - mean_t log pi(a_t | same prompt, no memory)
    R_i     = r_i + coef * norm(gain_i)     for r_i >= success (successful), R_i = r_i otherwise

norm is over the successful trajectories of i's group: minmax (gain - min) / (max - min), in [0, 1], so a
success never falls below another success's outcome (0 when they all tie or i is the only one); zscore
(gain - mean) / (std + eps), unbiased std (0 for fewer than 2); none (the raw gain). The answer scored is the
first gold answer written as `answer_template` ("{answer}" replaced). InfoMem's code was not available to
memrl: the normalization forms and the coefficient are memrl's choices (docs/concepts/algorithms.md).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from memrl.algorithms.base import register_model_reward
from memrl.config import MAX_COEF, valid
from memrl.quiet import encode_text
from memrl.rewards.model_scored import MemoryPrompts, ModelScored, Scorer
from memrl.types import Group, Segment

NORMALIZE: tuple[str, ...] = ("minmax", "zscore", "none")


@dataclass
class InfoMemOptions:
    """Options of the infomem model-scored reward (algorithm.infomem.*)."""

    coef: float = valid(0.5, ge=0, le=MAX_COEF)
    """Weight of the normalized gain added to a successful trajectory's outcome reward."""
    normalize: str = valid("minmax", choices=NORMALIZE)
    """How the gains of a group's successful trajectories are normalized before they are added: minmax
    (to [0, 1]), zscore (mean 0, std 1) or none (raw per-token log-likelihood gain)."""
    success: float = valid(1.0, ge=0, le=MAX_COEF)
    """A trajectory is successful (scored) when its outcome reward is >= this."""
    answer_template: str = "\\boxed{{answer}}"
    """The gold answer as the final call would write it; "{answer}" is replaced by the first gold answer."""
    eps: float = valid(1e-6, gt=0, le=1)
    """normalize=zscore: added to the std before dividing."""

    def __post_init__(self) -> None:
        if "{answer}" not in self.answer_template:
            raise ValueError(f"algorithm.infomem.answer_template must contain {{answer}}, got {self.answer_template!r}")


def mean_gain(with_memory: Sequence[float], without_memory: Sequence[float]) -> float:
    """Per-token log-likelihood gain: mean(with_memory) - mean(without_memory) (same answer tokens)."""
    if not with_memory or len(with_memory) != len(without_memory):
        raise ValueError(f"mean_gain: {len(with_memory)} and {len(without_memory)} answer logprobs; need the same, > 0")
    return sum(with_memory) / len(with_memory) - sum(without_memory) / len(without_memory)


def normalized(gains: Sequence[float], normalize: str, eps: float = InfoMemOptions.eps) -> list[float]:
    """The gains of one group's successful trajectories, normalized as `InfoMemOptions.normalize` says."""
    if normalize == "none":
        return [float(g) for g in gains]
    if normalize == "minmax":
        lo, hi = min(gains, default=0.0), max(gains, default=0.0)
        return [(g - lo) / (hi - lo) if hi > lo else 0.0 for g in gains]
    if normalize == "zscore":
        if len(gains) < 2:
            return [0.0] * len(gains)
        m = sum(gains) / len(gains)
        std = math.sqrt(sum((g - m) ** 2 for g in gains) / (len(gains) - 1))
        return [(g - m) / (std + eps) for g in gains]
    raise ValueError(f"unknown InfoMem normalization {normalize!r}; known: {', '.join(NORMALIZE)}")


def mix(outcomes: Sequence[float], gains: Sequence[float | None], coef: float, normalize: str,
        eps: float = InfoMemOptions.eps) -> list[float]:
    """One group's rewards: outcome + coef * normalized gain where a gain was scored (None: outcome only)."""
    scored = [i for i, g in enumerate(gains) if g is not None]
    out = [float(r) for r in outcomes]
    for i, z in zip(scored, normalized([float(gains[i]) for i in scored], normalize, eps), strict=True):  # type: ignore[arg-type]
        out[i] += coef * z
    return out


@register_model_reward("infomem", InfoMemOptions)
def infomem_reward(
    groups: Sequence[Group], *, scorer: Scorer, memory_prompts: MemoryPrompts | None, tokenizer: Any,
    coef: float = InfoMemOptions.coef, normalize: str = InfoMemOptions.normalize,
    success: float = InfoMemOptions.success, answer_template: str = InfoMemOptions.answer_template,
    eps: float = InfoMemOptions.eps,
) -> ModelScored:
    """InfoMem over a batch: two teacher-forced rows per successful trajectory (the gold answer after the
    final prompt with its memory, and after the same prompt without memory), all scored in one `scorer` pass;
    rewards mixed per group (`mix`). Metrics: infomem/scored (trajectories), infomem/tokens (tokens of the
    scored rows), infomem/gain_mean, infomem/bonus_mean (over the scored trajectories)."""
    if memory_prompts is None:
        raise ValueError("algorithm.model_reward=infomem needs a workflow with a final memory "
                         "(WorkflowSpec.memory_prompts; memagent has one)")
    rows: list[Segment] = []
    where: list[tuple[int, int]] = []
    for gi, g in enumerate(groups):
        if g.task is None:
            raise ValueError(f"infomem: group {g.task_id} carries no Task")
        answer = encode_text(  # a row's answer: plain text, never a control id
            tokenizer, answer_template.replace("{answer}", g.task.answers[0] if g.task.answers else ""))
        for ti, t in enumerate(g.trajectories):
            if t.reward is None or t.reward < success or not answer:
                continue
            with_memory, without_memory = memory_prompts(g.task, t)
            rows += [Segment(list(with_memory), list(answer), [0.0] * len(answer)),
                     Segment(list(without_memory), list(answer), [0.0] * len(answer))]
            where.append((gi, ti))
    lps = scorer(rows) if rows else []
    values: list[list[float | None]] = [[None] * len(g.trajectories) for g in groups]
    for k, (gi, ti) in enumerate(where):
        values[gi][ti] = mean_gain(lps[2 * k], lps[2 * k + 1])
    rewards = [mix([float(t.reward) if t.reward is not None else 0.0 for t in g.trajectories], values[gi], coef,
                   normalize, eps) for gi, g in enumerate(groups)]
    gains = [v for per in values for v in per if v is not None]
    bonus = [rewards[gi][ti] - float(groups[gi].trajectories[ti].reward or 0.0) for gi, ti in where]
    metrics = {"infomem/scored": float(len(where)), "infomem/tokens": float(sum(r.num_tokens for r in rows)),
               "infomem/gain_mean": sum(gains) / len(gains) if gains else 0.0,
               "infomem/bonus_mean": sum(bonus) / len(bonus) if bonus else 0.0}
    return ModelScored(rewards, values, metrics)
