"""Typed training configs: one dataclass per component, defaults = the published MemAgent recipe
(arXiv 2507.02259; the MemAgent repository's run_memory_7B.sh). Load with `memrl.config.load_config(TrainConfig, overrides, preset)`:

    memrl train workflow=memagent algorithm=grpo algorithm.n=8 workflow.chunk_tokens=1000

The workflow section is free-form (a dict: `name` + the fields of that workflow's config class); it is
parsed once into that class (`memrl.workflows.parse_workflow`) before anything runs, so an unknown or
mistyped workflow field fails with its dotted name.

Each field declares its own range (`valid`, checked by `memrl.config.check_config`); what involves several
fields is checked by the `check()` method of the section that holds them (`TrainConfig.check()` runs them
all, then what spans sections), each a one-line `ConfigError` naming the fields. `memrl.training.trainer.
validate` runs both before any work.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.algorithms.losses import AGG_MODES, KL_KINDS
from memrl.algorithms.options import (
    OFF_POLICY_MODES,
    AEPOOptions,
    DCPOOptions,
    FoldGRPOOptions,
    GRPOOptions,
    GSPOOptions,
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
    MAX_LR,
    MAX_MB,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    OPEN_SECTIONS,
    REMOVED_KEYS,
    ConfigError,
    section_from_dict,
    valid,
)
from memrl.data.synthetic import SyntheticConfig
from memrl.engines.base import FAILED_REQUEST_MODES
from memrl.engines.config import EngineConfig
from memrl.engines.registry import engine_kind, replica_names
from memrl.precision import check_compute_dtype
from memrl.rewards.extract import EXTRACT_MODES
from memrl.rewards.infomem import InfoMemOptions
from memrl.rewards.published_metrics import METRIC_RULES
from memrl.rewards.registry import NONE, model_reward_name, model_reward_names, model_reward_options
from memrl.training.adapter_sync import check as check_lora_sync
from memrl.training.lora import LoraSection
from memrl.training.trackers import check_installed, mlflow_uri_problem, wandb_id_problem


def off_policy_cap(a: AlgorithmSection) -> float | None:
    """The cap of the chosen off-policy correction: tis_cap under tis, decoupled_cap under decoupled."""
    return a.tis_cap if a.off_policy == "tis" else a.decoupled_cap if a.off_policy == "decoupled" else None


@dataclass
class ModelSection:
    """The policy to train: a HuggingFace causal-LM directory."""

    path: str = ""
    """HF model directory (config, safetensors, tokenizer). Required."""
    dtype: str = valid("float32", choices=("float32", "bfloat16"))
    """Weights (and optimizer state) dtype: float32 or bfloat16."""
    compute_dtype: str | None = valid(None, choices=("float32", "bfloat16"))
    """Mixed precision (memrl.precision): bfloat16 = the forward and backward of the update, the old-logprob
    and reference passes (and the hf engine, unless engine.hf.compute_dtype says otherwise) compute in
    bfloat16 under autocast over the float32 weights and optimizer state; logits, log-probabilities and the
    loss in float32. None = the weights' dtype. On a CPU it needs bfloat16 instructions (refused without);
    docs/results/real_model.md has the side-by-side measurement."""
    device: str = "cpu"
    """Where the trainer runs ("cpu", "cuda")."""
    gradient_checkpointing: bool = False
    lora: LoraSection = field(default_factory=LoraSection)
    """LoRA adapters (memrl.training.lora; docs/guides/lora.md); rank 0 = full fine-tuning."""

    def check(self) -> None:
        """A model directory is named; a CUDA device exists when one is asked for."""
        if not self.path:
            raise ConfigError("model.path is required (a HuggingFace model directory)")
        try:
            torch.device(self.device)
        except RuntimeError:
            raise ConfigError(f"model.device={self.device!r} is not a torch device (cpu, cuda, cuda:N, ...)") from None
        if self.device.startswith("cuda"):
            if not torch.cuda.is_available():
                raise ConfigError(f"model.device={self.device} but torch.cuda.is_available() is False")
        check_compute_dtype(self.compute_dtype, self.device, "model.compute_dtype")


@dataclass
class DataSection:
    """Training tasks: the synthetic generator, or a data file read by memrl.data.io."""

    name: str = valid("synthetic", choices=("synthetic", "file"))
    """"synthetic" or "file"."""
    path: str = ""
    """Data file (JSON / JSONL / parquet) when name=file."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the synthetic stream / the shuffle of a file."""
    shuffle: bool = True
    """name=file: visit the file's tasks in a new seeded order every epoch. False = the file's own order,
    every epoch (the published MemAgent and ReMemR1 scripts set verl's data.shuffle=False)."""
    docs_from: str = ""
    """name=file: the dev file (HotpotQA / 2Wiki / SQuAD) whose documents an index-only file's contexts
    index (MemAgent's eval_index layout; memrl.data.index_only); "" = none (such a file is then an error)."""
    sampling: str = valid("mixed", choices=("mixed", "task_balanced"))
    """name=file: "mixed" visits the file's tasks in order (shuffled per epoch); "task_balanced" (QwenLong-L1.5)
    draws every batch of trainer.batch_size tasks with the same number from each task kind (Task.meta[task_key]),
    each kind from its own shuffled list (memrl.data.mixture)."""
    task_key: str = "data_source"
    """sampling=task_balanced: the Task.meta key naming a task's kind (MemAgent parquet rows: data_source)."""
    synthetic: SyntheticConfig = field(default_factory=SyntheticConfig)

    def check(self) -> None:
        """A data file is named when the data come from one; task-balanced sampling needs one."""
        if self.name == "file" and not self.path:
            raise ConfigError("data.path is required when data.name=file")
        if self.sampling == "task_balanced" and self.name != "file":
            raise ConfigError("data.sampling=task_balanced needs data.name=file (a mixture of task kinds); the "
                              "synthetic stream has one kind")


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
    loss_agg=seq-mean-token-mean), or an import path package.module:fn of a function marked
    @memrl.algorithms.base.register_loss(name, Options)."""
    ppo: PPOOptions = field(default_factory=PPOOptions)
    """Options of the ppo loss: clip_low, clip_high (DAPO's clip-higher when > clip_low), dual_clip_c."""
    gspo: GSPOOptions = field(default_factory=GSPOOptions)
    """Options of the gspo loss: seq_clip_low, seq_clip_high of the sequence ratio (GSPO's published 3e-4 / 4e-4)."""
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


@dataclass
class OptimSection:
    """AdamW with linear warm-up then constant (MemAgent: lr 1e-6, 20 warm-up steps)."""

    lr: float = valid(1e-6, gt=0, le=MAX_LR)
    """Peak learning rate."""
    warmup_steps: int = valid(20, ge=0, le=MAX_COUNT)
    """Linear warm-up over this many RL steps (the scheduler steps once per batch, as verl's update_actor
    does, whatever trainer.mini_batches is); 0 = none."""
    weight_decay: float = valid(0.01, ge=0, le=MAX_COEF)
    weight_decay_scope: str = valid("all", choices=("all", "matrices"))
    """Which parameters weight_decay applies to: "all" (memrl; the verl forks' AdamW over every parameter) or
    "matrices" (Megatron-LM's rule, vime: biases and 1-D parameters such as norms get none;
    megatron/core/optimizer _get_param_groups)."""
    beta1: float = valid(0.9, ge=0, lt=1)
    beta2: float = valid(0.999, ge=0, lt=1)
    grad_clip: float = valid(1.0, ge=0, le=MAX_COEF, note="0 = no clipping")
    """Clip the global gradient norm to this before every optimizer step; 0 = no clipping (never a
    zero-length update)."""


@dataclass
class TrainerSection:
    """The driver loop: how many steps, batch size, packing, saving and logging."""

    steps: int = valid(150, ge=0, le=MAX_COUNT)
    """RL steps (batches) to train."""
    batch_size: int = valid(128, ge=1, le=MAX_COUNT)
    """Tasks (groups) per step; each gives `algorithm.n` trajectories."""
    concurrency: int = valid(1024, ge=1, le=MAX_COUNT)
    """Trajectories in flight at once (the rollout runner's cap)."""
    mini_batches: int = valid(1, ge=1, le="batch_size")
    """Optimizer steps per RL step, the batch cut as `mini_batch_split` says; 1 = fully on-policy. The
    published MemAgent / ReMemR1 scripts take 16 (train_batch_size 128 / ppo_mini_batch_size 8)."""
    mini_batch_split: str = valid("groups", choices=("groups", "rows"))
    """How `mini_batches` cuts a batch. "groups": whole groups, group i to mini-batch i mod k (memrl's
    default). "rows": verl's rule in the MemAgent / ReMemR1 forks (dp_actor.update_policy, td_split):
    the batch's rows in verl's order (every trajectory's first call, then every second call, ..., the final
    answers last) cut into k contiguous slices whose sizes differ by at most one, larger ones first."""
    mini_batch_rows: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """vime / slime: one optimizer step every k rows (--global-batch-size), rows in batch order (each
    trajectory's calls together); a last slice of fewer rows is a step of its own. Needs mini_batches=1."""
    mini_batch_ranks: int = valid(1, ge=1, le=4096)
    """mini_batch_split=rows: the data-parallel size of the published run whose cut to reproduce. verl cuts
    each rank's contiguous share of the batch into `mini_batches` slices and optimizer step j trains slice j
    of every share (memrl.training.schedule); 1 cuts the whole batch at once (memrl's rule, and a 1-GPU
    verl run). Independent of memrl's own trainer.num_workers: the same rows per step at any world size."""
    loss_weights: str = valid("mini_batch", choices=("mini_batch", "per_rank"))
    """How a row's loss weight is normalized within its optimizer step. "mini_batch" (memrl): over the whole
    mini-batch (token-mean: 1 / its trained tokens), whatever the ranks. "per_rank": the MemAgent / ReMemR1
    forks at data-parallel size W = `mini_batch_ranks` (dp_actor.py update_policy: each rank's loss is the
    `algorithm.loss_agg` mean over ITS slice, FSDP averages over the W ranks): token-mean 1 / (W x trained
    tokens of the row's rank slice). Needs mini_batch_split=rows (the slices); equal to "mini_batch" at W=1."""
    mini_batch_rows_tail: str = valid("step", choices=("step", "drop"))
    """mini_batch_rows=r and a batch of rows not a multiple of r: "step" (memrl) trains the last rows as
    a smaller step of their own; "drop" leaves them out of the update, as vime's custom convert does
    (examples/mem_agent/custom_convert.py trims the unrolled rows to a multiple of --global-batch-size;
    a batch of fewer than r rows is kept whole)."""
    token_budget: int = valid(16384, ge=1, le=MAX_TOKENS)
    """Padded tokens per micro-batch (rows x longest row); gradient accumulation over micro-batches."""
    logits_chunk_tokens: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = full logits")
    """> 0: the update, the recomputed old logprobs and the KL reference's pass compute log-probabilities
    and entropy from this many tokens' logits at a time, recomputed in the backward pass, never holding
    the [tokens x vocabulary] fp32 logits (~19.5 GB for one 32K-token row of a 152K vocabulary); the same
    values and gradients to float rounding, also under FSDP2 and LoRA (memrl.training.chunked_logprobs;
    docs/guides/scaleout.md). Models whose logits are not known to be plain lm_head(hidden) keep the full logits,
    the reason logged once. 0 = the full logits; 1024 holds ~0.6 GB of fp32 logits per chunk at a 152K
    vocabulary."""
    skip_zero_advantage: bool = True
    """Leave rows whose advantage is exactly 0 (uniform groups, unchanged steps) out of the forward and
    backward pass. Exact (same loss and gradient, the batch's normalizers kept) and applied only with the
    PPO loss and no KL or entropy term; `train/rows_zero_adv_skipped` counts them, and the logged entropy,
    clipfrac and approx_kl are then means over the trained rows."""
    save_every: int = valid(50, ge=0, le=MAX_COUNT, note="0 = only at the end")
    """Checkpoint every k steps (and at the end); 0 = only at the end."""
    keep_checkpoints: int = valid(2, ge=0, le=MAX_COUNT, note="0 = keep all")
    """Newest checkpoints kept; 0 = all."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    tensorboard: bool = True
    """False drops "tensorboard" from `loggers` (the older switch, kept as an alias)."""
    loggers: list[str] = valid(default_factory=lambda: ["jsonl", "tensorboard"],
                               choices=("jsonl", "tensorboard", "wandb", "mlflow"))
    """Where step metrics go (memrl.training.trackers): jsonl (metrics.jsonl, always written: resume and
    `memrl view` read it), tensorboard (<out_dir>/tb), wandb (offline, <out_dir>/wandb), mlflow (local
    store, <out_dir>/mlruns unless mlflow_uri). The tracker run ids live in the checkpoints, so a resumed
    run continues the same runs. wandb / mlflow need `pip install 'memrl[track]'`."""
    mlflow_uri: str = ""
    """loggers has mlflow: its tracking URI ("" = file:<out_dir>/mlruns, mlflow 3's file store, in maintenance
    mode; recommended for local tracking: sqlite:///<dir>/mlflow.db, which needs sqlalchemy). Checked before
    the run: the scheme, a file store that is a file, a sqlite store without sqlalchemy."""
    val_every: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """Validate on the `val` section's files every k steps (memrl.training.validation); 0 = off. The
    published MemAgent script validates every 5 steps, ReMemR1's and MemAct's every 10."""
    save_best: str = ""
    """A logged metric whose highest value's checkpoint is kept as checkpoints/best; "" = off. memrl ranks
    by validation (val/mean_accuracy, val/<dataset>/<N>/accuracy, ...); ReMemR1's save_best_val ranks by
    the training batch's mean score (reward/mean here)."""
    save_best_after: int = valid(0, ge=0, le=MAX_COUNT, note="0 = every step saves")
    """save_best: steps <= k still set the best value but save no checkpoint (ReMemR1's trainer skips its
    first 20 steps so: `global_steps > 20`)."""
    progress: bool = True
    dump_every: int = valid(10, ge=0, le=MAX_COUNT, note="0 = off")
    """Append a sample of this step's trajectories to trajectories.jsonl every k steps (`memrl view`); 0 = off."""
    dump_trajectories: int = valid(4, ge=1, le=MAX_COUNT)
    """Trajectories per dump, whole groups in batch order (so advantages compare within a group)."""
    dump_max_mb: float = valid(200.0, ge=0, le=MAX_MB)
    """Stop dumping (one warning) once trajectories.jsonl reaches this size."""
    num_workers: int = valid(1, ge=1, le=MAX_PARALLEL)
    """Training ranks (FSDP2). 1 = in the trainer's process; N > 1 = Ray actors (memrl.training.placement)."""
    cpus_per_worker: float = valid(1.0, gt=0, le=MAX_PARALLEL)
    gpus_per_worker: float = valid(0.0, ge=0, le=MAX_PARALLEL)
    """Ray resources of each training rank (GPUs > 0 trains on CUDA with NCCL)."""
    fsdp_bf16: bool = False
    """FSDP2 mixed precision: bf16 compute, fp32 gradient reduction (num_workers > 1)."""
    cpu_offload: bool = False
    """FSDP2 CPU offload of parameters and optimizer state (num_workers > 1)."""
    router_aux_loss_coef: float = valid(0.0, ge=0, le=MAX_COEF, note="0 = off")
    """A mixture-of-experts model (Qwen3-MoE): add this times the router's load-balancing loss (the
    forward's aux_loss with output_router_logits) to each micro-batch's loss, weighted by its share of the
    mini-batch; logged as loss/router_aux. 0 = off (memrl, and verl's actor); Qwen3-MoE's config says 0.001."""
    sequence_parallel: int = valid(1, ge=1, le=MAX_PARALLEL, note="1 = off")
    """Ulysses sequence parallelism (memrl.training.ulysses; docs/guides/scaleout.md): groups of S consecutive
    ranks share each micro-batch, every row cut into S runs of tokens, with all-to-alls over the attention
    heads; the data-parallel size is num_workers / S. S must divide num_workers and the model's attention
    heads (and its KV heads divide S or S divide them); Qwen2 / Qwen3 dense models, full fine-tuning, the
    ppo loss. token_budget then counts one rank's tokens (a micro-batch holds S x token_budget padded tokens)."""

    def check(self) -> None:
        """One update schedule is set; the loggers hold jsonl, each once, and are installed."""
        if self.mini_batch_ranks != 1 and self.mini_batch_split != "rows":
            raise ConfigError(
                f"trainer.mini_batch_ranks={self.mini_batch_ranks} is verl's per-rank cut of the turn-major rows: "
                f"it needs trainer.mini_batch_split=rows, got {self.mini_batch_split!r}")
        if self.loss_weights == "per_rank" and (self.mini_batch_split != "rows" or self.mini_batch_rows != 0):
            raise ConfigError(
                "trainer.loss_weights=per_rank weighs each rank slice of verl's cut: it needs "
                f"trainer.mini_batch_split=rows and trainer.mini_batch_rows=0, got {self.mini_batch_split!r} and "
                f"{self.mini_batch_rows}")
        if self.mini_batch_rows != 0 and self.mini_batches != 1:
            raise ConfigError(
                f"trainer.mini_batch_rows={self.mini_batch_rows} (a step every k rows) and trainer.mini_batches="
                f"{self.mini_batches} both set the update schedule; set one (the other to its default)")
        self.check_loggers()

    def check_loggers(self) -> None:
        """trainer.loggers: jsonl always (resume and `memrl view` read metrics.jsonl), each name once; a
        missing wandb / mlflow fails now, before any model loads."""
        names = list(self.loggers)
        if "jsonl" not in names or len(set(names)) != len(names):
            raise ConfigError(f"trainer.loggers={names} must hold jsonl (metrics.jsonl is what resume and memrl "
                              "view read) and each logger once")
        check_installed(names)
        if self.mlflow_uri and "mlflow" not in names:
            raise ConfigError(f"trainer.mlflow_uri={self.mlflow_uri} is set but trainer.loggers={names} has no "
                              "mlflow; add mlflow to trainer.loggers or drop the URI")
        problem = mlflow_uri_problem(self.mlflow_uri)
        if problem:
            raise ConfigError(f"trainer.mlflow_uri={self.mlflow_uri}: {problem}")
        env_id = os.environ.get("WANDB_RUN_ID")
        problem = wandb_id_problem(env_id) if "wandb" in names and env_id is not None else None
        if problem:
            raise ConfigError(f"WANDB_RUN_ID={env_id!r} (wandb's run id, from the environment) is {problem}")


@dataclass
class ValSection:
    """Validation during training (trainer.val_every): the files and sampling of the evaluation that runs
    through memrl.eval.runner.evaluate, the code of `memrl eval`, on the trainer's engine."""

    files: list[str] = field(default_factory=list)
    """Eval files (as `memrl eval` reads them; several datasets and lengths); each (dataset, N) gets its
    own val/<dataset>/<N>/<metric> metrics."""
    samples: int = valid(1, ge=1, le=MAX_COUNT)
    """Answers per question; > 1 adds mean_at_k / pass_at_k (the published MemAgent script samples 4)."""
    temperature: float = valid(0.0, ge=0, le=MAX_TEMPERATURE, note="0 = greedy")
    """Sampling temperature of validation (memrl eval's greedy default; MemAgent's script: 1.0)."""
    top_p: float = valid(1.0, gt=0, le=1, note="1 = off")
    """Nucleus sampling of validation (MemAgent's script: 0.7)."""
    max_questions: int = valid(0, ge=0, le=MAX_COUNT, note="0 = all")
    """Questions per file (the first ones); 0 = all."""
    before_train: bool = False
    """With trainer.val_every > 0: also validate the initial weights, logged at step 0 (the published
    scripts do)."""
    golds: str = valid("any", choices=("any", "first"))
    """As `memrl eval golds=`: score against any gold answer or answers[0] only."""
    extract: str = valid("boxed", choices=EXTRACT_MODES)
    """As `memrl eval extract=` (memrl.rewards.extract)."""
    metric_rules: str = valid("memrl", choices=METRIC_RULES)
    """As `memrl eval metric_rules=` (memrl.rewards.published_metrics)."""
    failed_requests: str = valid("error", choices=FAILED_REQUEST_MODES)
    """As `memrl eval failed_requests=`: a question whose model request the engine could not serve stops
    the run ("error"), or is left out of the validation metrics ("drop"; "drop_or_empty" also leaves out an
    empty final reply), each drop logged and counted."""
    strip_text: bool = False
    """As `memrl eval strip_text=`: each question and context whitespace-stripped before use."""


@dataclass
class RolloutSection:
    """Rollout engine replicas placed by Ray (transformers engines; requests go to the least busy one)."""

    num_engines: int = valid(0, ge=0, le=MAX_PARALLEL)
    """0 = the in-process engine of `engine.name`; N >= 1 = N Ray actor engines, each built from the
    whole `engine` section (its kind from rollout.engine, its device from the resources below)."""
    cpus_per_engine: float = valid(1.0, gt=0, le=MAX_PARALLEL)
    gpus_per_engine: float = valid(0.0, ge=0, le=MAX_PARALLEL)
    engine: str = valid("", choices=lambda: ("", *replica_names()))
    """Replica kind: "hf" (memrl.engines.hf.HFEngine) or "vllm" (memrl.engines.vllm.VLLMEngine);
    "" = engine.name (vllm-cpu counts as vllm)."""
    weight_sync: str = valid("auto", choices=("auto", "object_store", "broadcast", "directory"))
    """How each update reaches the replicas: "object_store" (the gathered state dict put once in Ray's
    object store, every replica reads it), "broadcast" (a collective broadcast from trainer rank 0 into
    every replica over a group of their own: memrl.engines.weight_transfer), "directory" (rank 0 writes
    safetensors to rollout.sync_dir, every replica reads them; needs a filesystem they all see).
    "auto" = broadcast for vLLM replicas on their own GPUs, directory for vLLM on CPU (or sharing the
    ranks' GPUs, where NCCL cannot pair two ranks on one device), object_store for hf replicas."""
    broadcast_backend: str = valid("auto", choices=("auto", "gloo", "nccl"))
    """weight_sync=broadcast: "gloo", "nccl", or "auto" (nccl when the replicas have GPUs, else gloo)."""
    broadcast_bucket_mb: int = valid(256, ge=1, le=MAX_MB)
    """weight_sync=broadcast: tensors go in buckets of at most this many MiB (one collective each)."""
    sync_dir: str = ""
    """weight_sync=directory: where rank 0 writes the weights ("" = <out_dir>/engine_weights)."""
    colocate: bool = False
    """Engines share the trainer ranks' bundles (and GPUs): engine i sits with rank i; vLLM sleeps
    during the update. Needs rollout.num_engines <= trainer.num_workers."""
    gpu_memory_utilization: float = valid(0.4, gt=0, le=1)
    """vLLM: share of its GPU for weights + KV cache (keep room for the trainer when colocated)."""
    sync_check: bool = False
    """After every weight sync, the engine's greedy logprobs on a fixed probe must match the trainer's
    within sync_check_tol, else the run stops naming the engine (memrl.training.sync_check; its cost is
    logged as time/sync_check_s). With trainer.num_workers > 1 the ranks score the probe (rank 0's result)."""
    sync_check_tol: float = valid(1e-3, gt=0, le=MAX_COEF)
    """sync_check: the largest |engine logprob - trainer logprob| allowed (float32: 1e-3; bf16 engines ~0.1)."""
    sync_check_tokens: int = valid(4, ge=1, le=64)
    """sync_check: tokens the engine generates greedily after the probe."""
    max_staleness: int = valid(0, ge=0, le=MAX_COUNT, note="0 = synchronous")
    """Asynchronous training (docs/guides/async.md): 0 = sample, update, sync in turn (the synchronous loop);
    k >= 1 = the rollouts of the next k steps run while the trainer updates, and no trained segment was
    sampled by a policy more than k versions older than the one it updates."""
    partial: str = valid("continue", choices=("continue", "abort"))
    """max_staleness >= 1: a trajectory in flight across a weight sync "continue"s on the new weights (its
    segments keep the versions that sampled them) or is "abort"ed and sampled again on the new weights."""
    partial_max_aborts: int = valid(1, ge=0, le=MAX_COUNT)
    """partial=abort: times one trajectory may be aborted and resampled (after that it continues)."""

    def check(self) -> None:
        """A weight-sync mode is chosen only for Ray replicas; asynchronous rollouts need replicas that
        keep serving during the update."""
        if self.weight_sync != "auto" and self.num_engines < 1:
            raise ConfigError(
                f"rollout.weight_sync={self.weight_sync} applies to Ray replicas: it needs rollout.num_engines >= 1 "
                "(the in-process engine shares the module or takes the state dict)")
        if self.max_staleness > 0 and self.colocate:
            raise ConfigError(
                f"rollout.max_staleness={self.max_staleness} needs rollout.colocate=false: colocated engines give "
                "their memory to the update, so nothing can sample while it runs")


@dataclass
class RaySection:
    """How to reach Ray when trainer.num_workers > 1 or rollout.num_engines > 0."""

    address: str = ""
    """"" = start a local Ray; "host:port" = join a cluster started with `ray start --head`."""
    temp_dir: str = ""
    """Ray's session/log directory for a local start ("" = Ray's default)."""
    num_cpus: int = valid(0, ge=0, le=MAX_PARALLEL, note="0 = all")
    """CPUs a local Ray start offers (0 = all the machine's)."""
    worker_niceness: int = valid(0, ge=0, le=19)
    """How many nice levels a local Ray start puts its workers (training ranks, engine replicas) below the
    driver. 0: the same priority as the driver, which trains at world size 1 and runs the rollout loop.
    Ray's own default is 15; with it a replica sharing a machine with a busy driver slowed the demo recipe's
    Ray runs by 16% (synchronous) and 22% (max_staleness=1) (docs/guides/async.md). A cluster joined with ray.address keeps its own setting."""


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


@dataclass
class TrainConfig:
    """Everything `memrl train` needs; presets in memrl/configs/*.yaml."""

    model: ModelSection = field(default_factory=ModelSection)
    engine: EngineConfig = field(default_factory=EngineConfig)
    """The rollout engine (memrl.engines.config); hf by default, serving the trained module itself."""
    workflow: dict[str, Any] = field(default_factory=lambda: {"name": "memagent"})
    """The workflow (`name`: registered, or an import path package.module:SPEC of a WorkflowSpec) and its
    config fields, e.g. workflow.chunk_tokens=5000 (memrl.workflows.parse_workflow checks them against the
    workflow's config class; the spec's train_defaults fill what it leaves out, e.g. max_chunks=8)."""
    data: DataSection = field(default_factory=DataSection)
    algorithm: AlgorithmSection = field(default_factory=AlgorithmSection)
    optim: OptimSection = field(default_factory=OptimSection)
    trainer: TrainerSection = field(default_factory=TrainerSection)
    val: ValSection = field(default_factory=ValSection)
    rollout: RolloutSection = field(default_factory=RolloutSection)
    ray: RaySection = field(default_factory=RaySection)
    out_dir: str = "runs/train"

    def _check_async_engine(self) -> None:
        """rollout.max_staleness > 0 with the in-process engine: it must keep its own weights."""
        k, e = self.rollout.max_staleness, self.engine
        kind = engine_kind(e.name)
        problem = kind.async_problem(e, k) if kind.async_problem is not None else None
        if problem:
            raise ConfigError(problem)

    def _check_sequence_parallel(self) -> None:
        """trainer.sequence_parallel=S > 1: S divides the ranks; what it does not split is refused by name."""
        t, sp = self.trainer, self.trainer.sequence_parallel
        if sp == 1:
            return
        if t.num_workers % sp:
            raise ConfigError(f"trainer.sequence_parallel={sp} must divide trainer.num_workers={t.num_workers}")
        refused = {"model.lora.rank > 0 (LoRA)": self.model.lora.rank > 0,
                   "trainer.router_aux_loss_coef > 0 (MoE load balancing is not per token)": t.router_aux_loss_coef > 0,
                   f"algorithm.loss={self.algorithm.loss} (only ppo is known to be per token)": self.algorithm.loss != "ppo"}
        for what, on in refused.items():
            if on:
                raise ConfigError(f"trainer.sequence_parallel={sp} does not support {what}")

    def check(self) -> None:
        """Each section's own check (what involves several of its fields), then what spans sections."""
        self.algorithm.check()
        self.trainer.check()
        self.data.check()
        self.model.check()
        self.rollout.check()
        if self.trainer.num_workers != 1 and self.rollout.num_engines < 1:
            raise ConfigError(
                f"trainer.num_workers={self.trainer.num_workers} needs rollout.num_engines >= 1 (the in-process "
                "engine serves the live module of world size 1)")

        self._check_sequence_parallel()
        check_lora_sync(self)  # engine.vllm / engine.openai lora_sync=adapter
        if self.rollout.max_staleness > 0 and self.rollout.num_engines < 1:
            self._check_async_engine()
        t = self.trainer
        a = self.algorithm
        if a.off_policy != "none" and a.old_logprobs == "engine" and (t.mini_batches != 1 or t.mini_batch_rows != 0):
            raise ConfigError(
                f"algorithm.off_policy={a.off_policy} with algorithm.old_logprobs=engine needs one optimizer step "
                f"per RL step (trainer.mini_batches=1 and trainer.mini_batch_rows=0, got {t.mini_batches} and "
                f"{t.mini_batch_rows}): its proximal logprobs then come from each row's training forward, which "
                "is the pre-update policy only for the first optimizer step; set algorithm.old_logprobs=trainer "
                "(docs/guides/async.md)")
        if self.workflow.get("turn_tokens") == "reencoded" and (a.old_logprobs != "trainer" or a.off_policy != "none"):
            raise ConfigError(
                "workflow.turn_tokens=reencoded needs algorithm.old_logprobs=trainer and algorithm.off_policy=none "
                f"(got {a.old_logprobs} and {a.off_policy}): a re-encoded token the engine did not sample has no "
                "engine logprob (a 0.0 placeholder, counted in reencoded_unsampled_tokens)")
        kind = engine_kind(self.engine.name)
        problem = kind.train_problem(self.engine) if kind.train_problem is not None else None
        if problem:
            raise ConfigError(problem)
