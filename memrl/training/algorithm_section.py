"""The `algorithm` section of the training config: the advantage estimator, group size, selection and the
policy loss, with the registered options of the estimator and the loss nested under their names
(memrl.algorithms.registry), and the flat option keys that moved under them (refused by name)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from memrl.algorithms.losses import AGG_MODES, KL_KINDS
from memrl.algorithms.options import (
    OFF_POLICY_MODES,
    AEPOOptions,
    ClipCovOptions,
    DCPOOptions,
    FoldGRPOOptions,
    GRPOOptions,
    GSPOOptions,
    KLCovOptions,
    LLDSOptions,
    PPOOptions,
    ReinforcePPOptions,
    ReMemR1Options,
    RLOOOptions,
)
from memrl.algorithms.registry import (
    advantage_name,
    advantage_names,
    advantage_options,
    loss_name,
    loss_names,
    loss_options,
)
from memrl.config import (
    MAX_COEF,
    MAX_COUNT,
    MAX_TEMPERATURE,
    OPEN_SECTIONS,
    REMOVED_KEYS,
    ConfigError,
    section_from_dict,
    valid,
)
from memrl.rewards.memory_gain import InfoMemOptions
from memrl.rewards.registry import NONE, model_reward_name, model_reward_names, model_reward_options
from memrl.training.update.routing import REPLAY_MODES


def off_policy_cap(a: AlgorithmSection) -> float | None:
    """The cap of the chosen off-policy correction: tis_cap under tis, decoupled_cap under decoupled."""
    return a.tis_cap if a.off_policy == "tis" else a.decoupled_cap if a.off_policy == "decoupled" else None


@dataclass
class AlgorithmSection:
    """Advantage estimator, group size and the policy loss (MemAgent / ReMemR1 papers and scripts). The
    estimator's and the loss's options (their registered options dataclasses, memrl.algorithms.options: the
    one place their defaults are set) nest under their registered names: `algorithm.grpo.*`,
    `algorithm.dcpo.*`, `algorithm.rememr1.*`, `algorithm.ppo.*`, and `algorithm.<name>.*` for one
    registered in a user's module (`algorithm.name=package.module:fn`)."""

    name: str = valid("grpo", choices=advantage_names, import_paths=True)
    """Advantage estimator (memrl.algorithms.registry): grpo, dcpo, rememr1, rloo, reinforce_pp,
    reinforce_pp_baseline, foldgrpo, or an import path
    package.module:fn of a function marked @memrl.algorithms.base.register_advantage(name, Options). It does
    not choose which segments train: that is `selection`."""
    n: int = valid(16, ge=1, le=4096, note="a bound: a task's n trajectories are held in memory together")
    """Trajectories sampled per task (the group), under every estimator (MemAct publishes 8)."""
    # --- DCPO segment selection (docs/concepts/memact.md, "Training with DCPO"): which segments become rows.
    selection: str = valid("all", choices=("all", "published", "spread_unused"))
    """"all": every segment of every trajectory trains; "published": the public MemAct sampler
    (segments_per_task rows per task, one per trajectory first, the rest one more each in a shuffled
    order, a segment repeated when its trajectory has no unused one); "spread_unused": memrl's rule (no
    repeats: the extra rows cycle over the trajectories that still have unused segments, i.e. those
    that pruned). memrl.algorithms.selection."""
    segments_per_task: int = valid(12, ge=1, le=MAX_COUNT)
    """selection != all: rows trained per task (MemAct publishes 12; `rollout.n` upstream); >= n."""
    grpo: GRPOOptions = field(default_factory=GRPOOptions)
    """Options of the grpo estimator: norm_by_std (MemAgent's script mean-centres only), eps, credit, std_over
    (group, or task: QwenLong-L1.5's per-task std), task_key."""
    rloo: RLOOOptions = field(default_factory=RLOOOptions)
    """Options of the rloo estimator (leave-one-out baseline): credit."""
    reinforce_pp: ReinforcePPOptions = field(default_factory=ReinforcePPOptions)
    """Options of the reinforce_pp estimator (REINFORCE++: outcome whitened over the batch's tokens): whiten_eps."""
    reinforce_pp_baseline: ReinforcePPOptions = field(default_factory=ReinforcePPOptions)
    """Options of the reinforce_pp_baseline estimator (group mean subtracted, then whitened): whiten_eps."""
    dcpo: DCPOOptions = field(default_factory=DCPOOptions)
    """Options of the dcpo estimator: eps (it always divides by the group's std)."""
    rememr1: ReMemR1Options = field(default_factory=ReMemR1Options)
    """Options of the rememr1 estimator: alpha (ReMemR1's published 0.8), norm_by_std, eps, state_term."""
    foldgrpo: FoldGRPOOptions = field(default_factory=FoldGRPOOptions)
    """Options of the foldgrpo estimator (FoldGRPO, memrl.algorithms.fold): process_rewards, unfolded_fraction,
    unfolded_penalty, scope_reward, failure_penalty, eps, clip."""
    loss: str = valid("ppo", choices=loss_names, import_paths=True)
    """Policy loss (memrl.algorithms.registry): ppo, gspo (sequence-level ratio; needs
    loss_agg=seq-mean-token-mean), clip_cov / kl_cov (arXiv 2505.22617's entropy remedies), or an import path package.module:fn of a function marked
    @memrl.algorithms.base.register_loss(name, Options)."""
    ppo: PPOOptions = field(default_factory=PPOOptions)
    """Options of the ppo loss: clip_low, clip_high (DAPO's clip-higher when > clip_low), dual_clip_c."""
    gspo: GSPOOptions = field(default_factory=GSPOOptions)
    """Options of the gspo loss: seq_clip_low, seq_clip_high of the sequence ratio (GSPO's published 3e-4 / 4e-4)."""
    clip_cov: ClipCovOptions = field(default_factory=ClipCovOptions)
    """Options of the clip_cov loss (Clip-Cov, arXiv 2505.22617; memrl.algorithms.remedies): clip_low, clip_high,
    clip_cov_ratio, clip_cov_lb, clip_cov_ub (verl's defaults)."""
    kl_cov: KLCovOptions = field(default_factory=KLCovOptions)
    """Options of the kl_cov loss (KL-Cov, arXiv 2505.22617): kl_cov_ratio, ppo_kl_coef (verl's defaults)."""
    llds: LLDSOptions = field(default_factory=LLDSOptions)
    """The LLDS-style likelihood-displacement term added to any policy loss (after arXiv 2512.04220;
    memrl.algorithms.remedies.llds_term): coef (0 = off), rows. Logged as loss/llds."""
    aepo: AEPOOptions = field(default_factory=AEPOOptions)
    """QwenLong-L1.5's AEPO: enabled, entropy_low, entropy_high (negative-advantage rows dropped while the
    batch's entropy is inside the band; needs old_logprobs=trainer)."""
    model_reward: str = valid(NONE, choices=model_reward_names, import_paths=True)
    """A reward the trainer's own model scores in the score stage, batched, after the outcome (memrl.rewards.
    model_scored): none, infomem (InfoMem's final-memory likelihood gain, arXiv 2606.03329; needs a workflow
    with a final memory, e.g. memagent), or an import path package.module:fn of a function marked
    @memrl.algorithms.base.register_model_reward(name, Options). Its cost is logged as time/model_reward_s and
    <name>/tokens; validation and evaluation score the outcome only."""
    infomem: InfoMemOptions = field(default_factory=InfoMemOptions)
    """Options of the infomem model-scored reward: coef, normalize, success, answer_template, eps."""
    plugins: dict[str, Any] = field(default_factory=dict)
    """Options of an estimator, loss or model-scored reward registered in a user's module, by its registered name: set them as
    `algorithm.<name>.<field>` (stored here; checked against its options dataclass before any work)."""
    loss_agg: str = valid("token-mean", choices=AGG_MODES)
    """token-mean, seq-mean-token-mean, seq-mean-token-sum, traj-mean."""
    kl_coef: float = valid(0.001, ge=0, le=MAX_COEF)
    """KL-to-reference loss coefficient (0 disables the reference model)."""
    kl_kind: str = valid("low_var_kl", choices=KL_KINDS)
    entropy_coef: float = valid(0.0, ge=0, le=MAX_COEF)
    """Entropy bonus coefficient (0 = none)."""
    dynamic_sampling: bool = False
    """DAPO: drop groups whose rewards all agree and refill with new tasks."""
    max_refill_rounds: int = valid(3, ge=0, le=MAX_COUNT)
    """Extra rollout rounds dynamic sampling may run to refill the batch."""
    temperature: float = valid(1.0, gt=0, le=MAX_TEMPERATURE)
    """Rollout temperature (overrides the workflow's); logprobs are recomputed under the same T."""
    # --- train/inference mismatch and its correction (docs/guides/async.md)
    old_logprobs: str = valid("engine", choices=("engine", "trainer"))
    """The "old" logprobs of the PPO ratio. engine (memrl): the engine's sampling logprobs (token in,
    token out; no extra forward). trainer (verl's actor compute_log_prob, slime's log-prob recompute; the
    published recipes): one forward of the current policy over every row of the RL step, without gradients,
    before its first optimizer step; every mini-batch's ratio is taken against those (the first one's is 1,
    to float tolerance), and off_policy=tis / decoupled use them as the proximal policy (behaviour = the
    engine), so they work with several mini-batches. Logs time/old_logprobs_s and the mismatch pairs
    mismatch/old_vs_engine/* and mismatch/current_vs_old/*."""
    off_policy: str = valid("none", choices=OFF_POLICY_MODES)
    """none: the PPO ratio against the engine's sampling logprobs (unchanged); tis: truncated importance
    sampling, each token's loss times min(exp(old - engine), tis_cap) (verl, slime); decoupled: AReaL's
    decoupled PPO, ratio against the proximal (pre-update trainer) policy, times exp(proximal - engine),
    tokens above decoupled_cap dropped. old = proximal = the trainer's logprob before the update."""
    tis_cap: float = valid(2.0, gt=0, le=MAX_COEF)
    """off_policy=tis: the truncation C of the train/inference ratio."""
    decoupled_cap: float | None = valid(None, gt=1, le=MAX_COEF, note="null = no cap")
    """off_policy=decoupled: tokens whose behaviour weight exp(proximal - engine) exceeds it weigh 0 (AReaL)."""
    routing_replay: str = valid("none", choices=REPLAY_MODES)
    """A mixture-of-experts policy (Qwen3-MoE; memrl.training.update.routing): "r2" records every token's experts in
    the old-logprob pass (needs old_logprobs=trainer) and replays them in every forward of the update, so the
    PPO ratio compares one network; "r3" records them in the in-process hf engine (kv_cache=padded) as it
    samples, and the old-logprob pass and the update replay the rollout's; layers x top_k bytes per token.
    "none": the trainer routes afresh."""
    mismatch_clip: float = valid(2.0, gt=1, le=MAX_COEF)
    """c of the logged mismatch/<engine>/ratio_outside_share: tokens whose exp(trainer - engine) is outside [1/c, c]."""

    def check(self) -> None:
        """dcpo needs a group of 2 or more; a segment selection trains at least one row per trajectory; the
        estimator's and the loss's options are whole (`options`); algorithm.<name> of a user's module names
        the estimator or loss in use."""
        if self.name == "dcpo" and self.n < 2:
            raise ConfigError(
                f"algorithm.n must be >= 2 with algorithm.name=dcpo (its advantage divides by the group's "
                f"std, which one trajectory does not have), got {self.n}")
        if self.name == "grpo" and self.grpo.norm_by_std and self.grpo.std_over == "task" and self.n < 2:
            raise ConfigError(
                f"algorithm.n must be >= 2 with algorithm.grpo.std_over=task (a task kind of one trajectory has no "
                f"std), got {self.n}")
        if self.aepo.enabled and self.old_logprobs != "trainer":
            raise ConfigError(
                "algorithm.aepo.enabled=true needs algorithm.old_logprobs=trainer (the batch's entropy under the "
                f"current policy comes from that pass, as verl's compute_log_prob gives it), got {self.old_logprobs}")
        lo, hi = self.aepo.entropy_low, self.aepo.entropy_high
        if lo is not None and hi is not None and lo >= hi:
            raise ConfigError(f"algorithm.aepo.entropy_low={lo} must be < algorithm.aepo.entropy_high={hi}")
        if self.loss == "gspo" and self.loss_agg != "seq-mean-token-mean":
            raise ConfigError(
                f"algorithm.loss=gspo takes algorithm.loss_agg=seq-mean-token-mean (GSPO averages each row's tokens, "
                f"then the rows; verl's compute_policy_loss_gspo forces it), got {self.loss_agg}")
        if self.selection != "all" and self.segments_per_task < self.n:
            raise ConfigError(
                f"algorithm.segments_per_task={self.segments_per_task} must be >= algorithm.n={self.n} with "
                f"algorithm.selection={self.selection} (every trajectory trains at least one row; the public "
                "sampler asserts the same)")
        self.options()

    def options(self) -> tuple[Any, Any]:
        """(advantage options, loss options): the chosen estimator's and loss's options, each its section
        algorithm.<registered name> (an instance of the options dataclass it registered with; None for one
        registered without)."""
        try:
            names = advantage_name(self.name), loss_name(self.loss)
            classes = advantage_options(self.name), loss_options(self.loss)
        except KeyError as e:
            raise ConfigError(f"algorithm: {e.args[0]}") from e
        reward = self._model_reward()
        stray = sorted(set(self.plugins) - set(names) - {reward[0]})
        if stray:
            raise ConfigError(
                f"algorithm.{stray[0]} sets options of {stray[0]!r}, which is neither the estimator, the loss nor the "
                f"model-scored reward in use (algorithm.name={self.name}: {names[0]}, algorithm.loss={self.loss}: "
                f"{names[1]}, algorithm.model_reward={self.model_reward})")
        return tuple(self._section(n, c) for n, c in zip(names, classes, strict=True))  # type: ignore[return-value]

    def _model_reward(self) -> tuple[str, type | None]:
        if self.model_reward == NONE:
            return NONE, None
        try:
            return model_reward_name(self.model_reward), model_reward_options(self.model_reward)
        except KeyError as e:
            raise ConfigError(f"algorithm: {e.args[0]}") from e

    def model_reward_options(self) -> Any:
        """The chosen model-scored reward's options (its section algorithm.<registered name>; None for none or
        one registered without options)."""
        name, cls = self._model_reward()
        return None if name == NONE else self._section(name, cls)

    def _section(self, name: str, cls: type | None) -> Any:
        """algorithm.<name> as an instance of `cls` (a copy)."""
        if cls is None:
            return None
        own = getattr(self, name) if name in {f.name for f in dataclasses.fields(self)} else None
        if isinstance(own, cls):
            return dataclasses.replace(own)
        return section_from_dict(cls, dict(self.plugins.get(name) or {}), f"algorithm.{name}")


OPEN_SECTIONS["algorithm"] = "plugins"  # algorithm.<a user's estimator or loss>.<field>

FLAT_OPTIONS: dict[str, tuple[str, ...]] = {
    "norm_by_std": ("grpo", "rememr1"), "eps": ("grpo", "dcpo", "rememr1"), "credit": ("grpo",),
    "alpha": ("rememr1",), "state_term": ("rememr1",), "clip_low": ("ppo",), "clip_high": ("ppo",),
    "dual_clip_c": ("ppo",)}
"""The options that were flat `algorithm.<field>` keys before they nested under their estimator or loss ->
the sections that have them now."""


def _in_force(option: str) -> property:
    def get(self: AlgorithmSection) -> Any:
        for opts in self.options():
            if opts is not None and hasattr(opts, option):
                return getattr(opts, option)
        raise AttributeError(f"algorithm.{option}: neither algorithm.name={self.name} nor algorithm.loss={self.loss} "
                             f"has that option")

    return property(get, doc=f"Read-only: the {option} of the estimator or loss in use (set it as "
                             f"{' / '.join(f'algorithm.{s}.{option}' for s in FLAT_OPTIONS[option])}).")


for _option, _sections in FLAT_OPTIONS.items():
    setattr(AlgorithmSection, _option, _in_force(_option))
    REMOVED_KEYS[f"algorithm.{_option}"] = (
        f"options nest under the estimator or loss they belong to: set "
        f"{' or '.join(f'algorithm.{s}.{_option}' for s in _sections)}")

REMOVED_KEYS["algorithm.actual_n"] = (
    "algorithm.n now counts the trajectories rolled out per task (set it to the old actual_n) and "
    "algorithm.segments_per_task the rows trained per task (the old n under dcpo), picked by "
    "algorithm.selection (published | spread_unused | all)")
