"""The options dataclasses of the built-in advantage estimators and policy loss: the one place their
defaults live.

Each estimator / loss registers with its options class (memrl.algorithms.registry); its keyword
defaults are these fields' defaults, and `memrl.training.algorithm_section.AlgorithmSection` holds one instance of
each as the section named after it (`algorithm.grpo`, `algorithm.dcpo`, `algorithm.rememr1`,
`algorithm.ppo`: `memrl train algorithm=rememr1 algorithm.rememr1.alpha=0.5`), so `memrl train`, a preset
that leaves a field out and a direct call all get one value. Each field declares the values it admits
(memrl.config.valid). No torch: the config imports this at load time.
"""

from __future__ import annotations

from dataclasses import dataclass

from memrl.algorithms.process_rewards import PROCESS_REWARDS
from memrl.config import MAX_COEF, valid

STD_SCOPES: tuple[str, ...] = ("group", "task")
"""Whose rewards give the grpo estimator's std (GRPOOptions.std_over)."""

STATE_TERMS: tuple[str, ...] = ("paper", "released")
"""The rememr1 estimator's state terms (ReMemR1Options.state_term)."""


@dataclass
class GRPOOptions:
    """Options of the grpo estimator (algorithm.grpo.*)."""

    norm_by_std: bool = False
    """Divide by the group's std (MemAgent's script mean-centres only, so the default does not)."""
    eps: float = valid(1e-6, gt=0, le=1)
    """Added to the std before dividing."""
    credit: str = valid("broadcast", choices=("broadcast", "split"))
    """broadcast: every segment (row) gets its trajectory's advantage; split: A / number of segments."""
    std_over: str = valid("group", choices=STD_SCOPES)
    """With norm_by_std, whose rewards give the std: "group" (GRPO) or "task" (QwenLong-L1.5's task-specific
    advantage: the std of every trajectory of the batch whose task has the same `task_key` value, the mean
    still the group's; needs algorithm.n >= 2)."""
    task_key: str = "data_source"
    """std_over=task: the Task.meta key naming a task's kind (a data mixture's source: "data_source" in
    MemAgent parquet rows); a task without it is an error naming the task."""


@dataclass
class RLOOOptions:
    """Options of the rloo estimator (algorithm.rloo.*): leave-one-out baseline over the group's trajectories."""

    credit: str = valid("broadcast", choices=("broadcast", "split"))
    """broadcast: every segment (row) gets its trajectory's advantage; split: A / number of segments."""


@dataclass
class ReinforcePPOptions:
    """Options of the reinforce_pp and reinforce_pp_baseline estimators (algorithm.reinforce_pp.*,
    algorithm.reinforce_pp_baseline.*): returns whitened over the batch's trained tokens (verl's masked_whiten)."""

    whiten_eps: float = valid(1e-8, gt=0, le=1)
    """Added to the batch's token variance before its square root (verl's masked_whiten: 1e-8)."""


@dataclass
class DCPOOptions:
    """Options of the dcpo estimator (algorithm.dcpo.*); it always divides by the std."""

    eps: float = valid(GRPOOptions.eps, gt=0, le=1)
    """Added to the std before dividing."""


@dataclass
class ReMemR1Options:
    """Options of the rememr1 estimator (algorithm.rememr1.*)."""

    alpha: float = valid(0.8, ge=0, le=1)
    """A = alpha * A_out + (1 - alpha) * A_state,t (ReMemR1's published 0.8)."""
    norm_by_std: bool = GRPOOptions.norm_by_std
    """Divide each centred level by its std."""
    eps: float = valid(GRPOOptions.eps, gt=0, le=1)
    """Added to the std before dividing."""
    state_term: str = valid("paper", choices=STATE_TERMS)
    """paper: (1 - alpha) * A_state; released: the released trainer's term, A_state over 2 * r (twice the
    paper's without std division: 0.8 * A_out + 0.4 * (r - mean) at alpha 0.8)."""

    def __post_init__(self) -> None:
        if self.state_term not in STATE_TERMS:
            raise ValueError(
                f"algorithm.rememr1.state_term must be one of {', '.join(STATE_TERMS)}, got {self.state_term!r}"
            )


@dataclass
class PPOOptions:
    """Options of the ppo loss (algorithm.ppo.*)."""

    clip_low: float = valid(0.2, ge=0, lt=1)
    """rho (the ratio) is clipped below at 1 - clip_low."""
    clip_high: float = valid(0.2, ge=0, le=MAX_COEF)
    """rho is clipped above at 1 + clip_high (DAPO's clip-higher when > clip_low)."""
    dual_clip_c: float | None = valid(3.0, gt=1, le=MAX_COEF, note="null = no dual clip")
    """Dual clip: for A < 0 the loss is at most -A * c (None disables)."""


@dataclass
class GSPOOptions:
    """Options of the gspo loss (algorithm.gspo.*): GSPO's sequence-level ratio (arXiv 2507.18071)."""

    seq_clip_low: float = valid(3e-4, ge=0, lt=1)
    """The sequence ratio is clipped below at 1 - seq_clip_low (GSPO's published 3e-4; verl sets it through
    actor.clip_ratio_low, the key PPO's token ratio uses, hence a name of its own here)."""
    seq_clip_high: float = valid(4e-4, ge=0, le=MAX_COEF)
    """The sequence ratio is clipped above at 1 + seq_clip_high (GSPO's published 4e-4)."""


@dataclass
class AEPOOptions:
    """QwenLong-L1.5's AEPO (algorithm.aepo.*): while the batch's entropy under the current policy lies in
    (entropy_low, entropy_high), only rows with a positive advantage from a trajectory with a positive reward
    train (the negative-advantage gradients are clipped away, which lowers entropy); outside it, every row."""

    enabled: bool = False
    """Gate the negative-advantage rows on the batch's entropy (needs algorithm.old_logprobs=trainer: the
    entropy comes from that pass, as verl's compute_log_prob gives it)."""
    entropy_low: float | None = valid(None, ge=0, le=MAX_COEF, note="null = no lower bound")
    """The gate is on while the entropy is > this."""
    entropy_high: float | None = valid(None, ge=0, le=MAX_COEF, note="null = no upper bound")
    """The gate is on while the entropy is < this. The published snippet's condition is low < H < high; its
    comment and the paper's text describe clipping when H exceeds an upper bound: entropy_low=<that bound>
    with entropy_high=null."""
    keep_multiple_of: int = valid(0, ge=0, le=65536, note="0 = every kept row trains")
    """With the gate on, the kept rows are cut, in batch order, to a multiple of this: the published trainer
    truncates them to a multiple of the actor's world size (set it to that world size to reproduce it)."""


OFF_POLICY_MODES: tuple[str, ...] = ("none", "tis", "decoupled")
"""algorithm.off_policy (memrl.algorithms.losses.off_policy_weights, docs/guides/async.md): none = the PPO ratio
against the engine's sampling logprobs (memrl's loss since the start); tis = truncated importance sampling
on the train/inference ratio (verl, slime); decoupled = decoupled PPO (AReaL)."""


@dataclass
class FoldGRPOOptions:
    """Options of the foldgrpo estimator (algorithm.foldgrpo.*; arXiv 2510.11967 section 2.3, memrl.algorithms.fold)."""

    process_rewards: list[str] = valid(default_factory=lambda: ["unfolded", "scope", "failure"])
    """The token-level process rewards Q added before the clip (memrl.algorithms.process_rewards.PROCESS_REWARDS:
    unfolded, no_branch, scope, failure, or one given to register_process_reward); [] = GRPO over threads."""
    unfolded_fraction: float = valid(0.5, gt=0, le=1)
    """The unfolded-token penalty applies once the main thread's unfolded tokens pass this share of the
    working-context budget (paper: 50%)."""
    unfolded_penalty: float = valid(1.0, ge=0, le=MAX_COEF)
    """Q = -this on the penalised main-thread turns (paper: -1)."""
    scope_reward: float = valid(0.2, ge=0, le=MAX_COEF)
    """Q = -this on an out-of-scope branch's turns, +this on an in-scope one's (published: 0.2)."""
    failure_penalty: float = valid(1.0, ge=0, le=MAX_COEF)
    """Q = -this on a turn answered with an error (paper: -1)."""
    eps: float = valid(GRPOOptions.eps, gt=0, le=1)
    """Added to the std before dividing (it always divides, as the paper's formula and dcpo do)."""
    clip: bool = True
    """clip(R + Q, 0, 1) as the paper writes it; False = R + Q unclipped."""
    success_only: bool = False
    """True: the process rewards apply only to trajectories whose outcome reward is positive, a failed one's
    tokens all get clip(R) (published: FoldAgent agents/fold_agent.py `process_item`, `if score[1] > 0`);
    False: every trajectory gets them (a failed trajectory's in-scope branch then earns +scope_reward)."""
    combine: str = valid("sum", choices=("sum", "replace"))
    """How the terms meet on a token: "sum" adds them; "replace": in the order `process_rewards` lists them,
    a term's non-zero value replaces what an earlier term set (published: agents/utils.py
    `Agent.set_process_reward` overwrites the turn's one value, so a branch turn answered with an error gets
    -1, not -1 +- 0.2)."""
    failure_rows: str = valid("all", choices=("all", "branch"))
    """Which rows the "failure" term reaches: "all" = every thread's error turns; "branch" = branch rows only
    (published: the tool-error loop of `process_item` runs over `branches`; main-thread errors go unpenalised)."""
    unfolded_spares: str = valid("opened", choices=("opened", "called"))
    """Which main turns the "unfolded" penalty spares besides the answer turn: "opened" = turns that opened a
    branch; "called" = every turn with a branch call, one refused at `max_branches` or for its arguments
    included (published: `bad_turn` skips a turn whose text holds `<function=branch>`)."""

    def __post_init__(self) -> None:
        unknown = [n for n in self.process_rewards if n not in PROCESS_REWARDS]
        if unknown:
            raise ValueError(f"algorithm.foldgrpo.process_rewards: unknown {', '.join(map(repr, unknown))}; known: "
                             f"{', '.join(sorted(PROCESS_REWARDS))}")


@dataclass
class ClipCovOptions:
    """Options of the clip_cov loss (algorithm.clip_cov.*; Clip-Cov, arXiv 2505.22617; verl's
    compute_policy_loss_clip_cov, whose defaults these are)."""

    clip_low: float = valid(0.2, ge=0, lt=1)
    """PPO's ratio clip below at 1 - clip_low (verl: actor.clip_ratio_low, else clip_ratio 0.2)."""
    clip_high: float = valid(0.2, ge=0, le=MAX_COEF)
    """PPO's ratio clip above at 1 + clip_high."""
    clip_cov_ratio: float = valid(2e-4, gt=0, le=1)
    """The share of the micro-batch's trained tokens whose gradient is cut (at least one token)."""
    clip_cov_lb: float = valid(1.0, ge=-MAX_COEF, le=MAX_COEF)
    """Only tokens whose covariance (A - mean A) * (logp - mean logp) lies in (lb, ub) are candidates."""
    clip_cov_ub: float = valid(5.0, ge=-MAX_COEF, le=MAX_COEF)
    """Upper bound of the candidates' covariance band."""

    def __post_init__(self) -> None:
        if self.clip_cov_lb >= self.clip_cov_ub:
            raise ValueError(f"algorithm.clip_cov.clip_cov_lb={self.clip_cov_lb} must be < "
                             f"algorithm.clip_cov.clip_cov_ub={self.clip_cov_ub}")


@dataclass
class KLCovOptions:
    """Options of the kl_cov loss (algorithm.kl_cov.*; KL-Cov, arXiv 2505.22617; verl's
    compute_policy_loss_kl_cov, whose defaults these are)."""

    kl_cov_ratio: float = valid(2e-4, gt=0, le=1)
    """The share of the micro-batch's trained tokens with the largest covariance that get the KL term (at least one)."""
    ppo_kl_coef: float = valid(1.0, ge=0, le=MAX_COEF)
    """The coefficient of |logp - old logp| added to those tokens' loss."""


LLDS_ROWS: tuple[str, ...] = ("all", "positive")
"""algorithm.llds.rows: which rows the likelihood-displacement term watches."""


@dataclass
class LLDSOptions:
    """The LLDS-style likelihood-displacement term (algorithm.llds.*; after arXiv 2512.04220): added to any
    policy loss, it acts on a row only when the row's log-likelihood fell below the old policy's, and there
    only on the tokens whose log-probability fell: coef * max(0, old - logp) per such token."""

    coef: float = valid(0.0, ge=0, le=MAX_COEF, note="0 = off")
    """The term's weight (0 = off)."""
    rows: str = valid("all", choices=LLDS_ROWS)
    """all: every row; positive: only rows with a positive advantage (the right answers' likelihood)."""
