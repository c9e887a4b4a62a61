"""Two optional parts of a training step, kept out of the driver loop (memrl.training.trainer):

- a model-scored reward (algorithm.model_reward, e.g. InfoMem's): after the outcome rewards, the
  trainer's own model scores the kept groups in one batched teacher-forced pass, and its reward replaces
  each trajectory's (the outcome kept as metrics["outcome_reward"]);
- AEPO's gate (algorithm.aepo, QwenLong-L1.5): from the old-logprob pass's entropies, the batch's entropy;
  inside the gate's band only the rows with a positive advantage and trajectory reward train.
"""

from __future__ import annotations

from typing import Any

from memrl.algorithms.losses import row_weights
from memrl.algorithms.selection import aepo_gate, aepo_rows, batch_entropy, truncate_to_multiple
from memrl.rewards.registry import model_reward_name, score_with
from memrl.types import Group, Segment, Task


def apply_model_reward(parts: Any, groups: list[Group]) -> dict[str, float]:
    """algorithm.model_reward over `groups` with the run's workers (`parts`: memrl.training.assemble.RunParts;
    `workers.old_logprobs` is the scoring pass); each trajectory's reward becomes the mixed one, its outcome
    kept as metrics["outcome_reward"] and the model-scored value as metrics[<name>]. Returns its metrics."""
    a = parts.cfg.algorithm
    name = model_reward_name(a.model_reward)
    prompts = None
    if parts.spec.memory_prompts is not None:
        def prompts(task: Task, traj: Any) -> tuple[list[int], list[int]]:
            return parts.spec.memory_prompts(task, traj, parts.wf_cfg, parts.tokenizer)
    out = score_with(a.model_reward, a.model_reward_options(), groups, parts.workers.old_logprobs, prompts,
                     parts.tokenizer)
    for g, rewards, values in zip(groups, out.rewards, out.values, strict=True):
        for t, r, v in zip(g.trajectories, rewards, values, strict=True):
            t.metrics["outcome_reward"] = float(t.reward) if t.reward is not None else 0.0
            if v is not None:
                t.metrics[name] = float(v)
            t.reward = float(r)
    return out.metrics


def aepo_select(algorithm: Any, per_group: list[list[Segment]], rows: list[Segment], entropies: list[list[float]],
                groups: list[Group]) -> tuple[list[list[Segment]], dict[str, float]]:
    """The batch's entropy under the current policy (`entropies` of the unique `rows`, aggregated by
    algorithm.loss_agg over the batch's rows) and, with the gate on, only the rows with a positive advantage
    and trajectory reward (memrl.algorithms.selection.aepo_rows), cut to a multiple of
    algorithm.aepo.keep_multiple_of. Returns (rows per group, aepo/* metrics)."""
    ent_of = {id(s): sum(e for e, m in zip(ent, s.loss_mask or [], strict=True) if m)
              for s, ent in zip(rows, entropies, strict=True)}
    flat = [s for segs in per_group for s in segs]
    weights = row_weights([s.loss_mask or [] for s in flat], [s.trajectory_id for s in flat], algorithm.loss_agg)
    entropy = batch_entropy([ent_of[id(s)] for s in flat], weights)
    on = aepo_gate(entropy, algorithm.aepo.entropy_low, algorithm.aepo.entropy_high)
    if on:
        if not groups:
            raise ValueError("algorithm.aepo: the gate needs the step's groups (their trajectories' rewards)")
        rewards = {t.trajectory_id: float(t.reward or 0.0) for g in groups for t in g.trajectories}
        per_group = truncate_to_multiple(aepo_rows(per_group, rewards), algorithm.aepo.keep_multiple_of)
    kept = sum(len(segs) for segs in per_group)
    return per_group, {"aepo/entropy": entropy, "aepo/active": float(on), "aepo/rows_kept": float(kept),
                       "aepo/rows_dropped": float(len(flat) - kept)}
