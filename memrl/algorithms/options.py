"""The options dataclasses of the built-in advantage estimators and policy loss: the one place their
defaults live.

Each estimator / loss registers with its options class (memrl.algorithms.registry); its keyword
defaults are these fields' defaults, and `memrl.training.config.AlgorithmSection` takes the defaults of
the fields of the same name from here, so `memrl train`, a preset that leaves a field out and a direct
call all get one value. No torch, no other memrl module: the config imports this at load time.
"""

from __future__ import annotations

from dataclasses import dataclass

STATE_TERMS: tuple[str, ...] = ("paper", "released")
"""The rememr1 estimator's state terms (ReMemR1Options.state_term)."""


@dataclass
class GRPOOptions:
    """Options of the grpo estimator (filled from algorithm.*)."""

    norm_by_std: bool = False
    """Divide by the group's std (MemAgent's script mean-centres only, so the default does not)."""
    eps: float = 1e-6
    """Added to the std before dividing."""
    credit: str = "broadcast"
    """broadcast: every segment gets its trajectory's advantage; split: A / number of segments."""


@dataclass
class DCPOOptions:
    """Options of the dcpo estimator (filled from algorithm.*); it always divides by the std."""

    eps: float = GRPOOptions.eps
    """Added to the std before dividing."""


@dataclass
class ReMemR1Options:
    """Options of the rememr1 estimator (filled from algorithm.*)."""

    alpha: float = 0.8
    """A = alpha * A_out + (1 - alpha) * A_state,t (ReMemR1's published 0.8)."""
    norm_by_std: bool = GRPOOptions.norm_by_std
    """Divide each centred level by its std."""
    eps: float = GRPOOptions.eps
    """Added to the std before dividing."""
    state_term: str = "paper"
    """paper: (1 - alpha) * A_state; released: the released trainer's term, A_state over 2 * r (twice the
    paper's without std division: 0.8 * A_out + 0.4 * (r - mean) at alpha 0.8)."""

    def __post_init__(self) -> None:
        if self.state_term not in STATE_TERMS:
            raise ValueError(
                f"algorithm.state_term must be one of {', '.join(STATE_TERMS)}, got {self.state_term!r}"
            )


@dataclass
class PPOOptions:
    """Options of the ppo loss (filled from algorithm.*)."""

    clip_low: float = 0.2
    """rho is clipped below at 1 - clip_low."""
    clip_high: float = 0.2
    """rho is clipped above at 1 + clip_high (DAPO's clip-higher when > clip_low)."""
    dual_clip_c: float | None = 3.0
    """Dual clip: for A < 0 the loss is at most -A * c (None disables)."""


OFF_POLICY_MODES: tuple[str, ...] = ("none", "tis", "decoupled")
"""algorithm.off_policy (memrl.algorithms.losses.off_policy_weights, docs/async.md): none = the PPO ratio
against the engine's sampling logprobs (memrl's loss since the start); tis = truncated importance sampling
on the train/inference ratio (verl, slime); decoupled = decoupled PPO (AReaL)."""
