"""Typed training configs: one dataclass per component, defaults = the published MemAgent recipe
(arXiv 2507.02259; the MemAgent repository's run_memory_7B.sh). Load with `memrl.config.load_config(TrainConfig, overrides, preset)`:

    memrl train workflow=memagent algorithm=grpo algorithm.n=8 workflow.chunk_tokens=1000

The workflow section is free-form (a dict: `name` + the fields of that workflow's config class); it is
parsed once into that class (`memrl.workflows.parse_workflow`) before anything runs, so an unknown or
mistyped workflow field fails with its dotted name.

Each field declares its own range (`valid`, checked by `memrl.config.check_config`); what involves several
fields is checked by the `check()` method of the section that holds them (`TrainConfig.check()` runs them
all, then what spans sections), each a one-line `ConfigError` naming the fields. `memrl.training.assemble.
validate` runs both before any work.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.config import (
    MAX_COEF,
    MAX_COUNT,
    MAX_LR,
    MAX_MB,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    ConfigError,
    valid,
)
from memrl.data.synthetic import SyntheticConfig
from memrl.engines.base import FAILED_REQUEST_MODES
from memrl.engines.config import EngineConfig
from memrl.engines.registry import engine_kind, replica_names
from memrl.precision import COMPUTE_CHOICES, resolve_compute_dtype
from memrl.rewards.extract import EXTRACT_MODES
from memrl.rewards.published_metrics import METRIC_RULES
from memrl.threads import ThreadsSection
from memrl.training.algorithm_section import AlgorithmSection
from memrl.training.monitor.health import ON_COLLAPSE, HealthSection
from memrl.training.monitor.trackers import check_installed, mlflow_uri_problem, wandb_id_problem
from memrl.training.sync.adapter_sync import check as check_lora_sync
from memrl.training.update.lora import LoraSection


@dataclass
class ModelSection:
    """The policy to train: a HuggingFace causal-LM directory."""

    path: str = ""
    """HF model directory (config, safetensors, tokenizer). Required."""
    dtype: str = valid("float32", choices=("float32", "bfloat16"))
    """Weights (and optimizer state) dtype: float32 or bfloat16."""
    compute_dtype: str | None = valid(None, choices=COMPUTE_CHOICES)
    """Mixed precision (memrl.precision): bfloat16 = the forward and backward of the update, the old-logprob
    and reference passes (and the hf engine, unless engine.hf.compute_dtype says otherwise) compute in
    bfloat16 under autocast over the float32 weights and optimizer state; logits, log-probabilities and the
    loss in float32. None = the weights' dtype. On a CPU it needs bfloat16 instructions (refused without);
    docs/results/real_model.md has the side-by-side measurement. auto = bfloat16 where the hardware has
    bfloat16 instructions, else float32; `check()` replaces auto with the dtype chosen and logs it."""
    device: str = "cpu"
    """Where the trainer runs ("cpu", "cuda")."""
    gradient_checkpointing: bool = False
    lora: LoraSection = field(default_factory=LoraSection)
    """LoRA adapters (memrl.training.update.lora; docs/guides/lora.md); rank 0 = full fine-tuning."""

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
        self.compute_dtype = resolve_compute_dtype(self.compute_dtype, self.device, "model.compute_dtype")


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
    zero_grad_steps: str = valid("take", choices=("take", "skip"))
    """An optimizer step whose global gradient is exactly zero (every row's advantage 0 and no KL, entropy or
    other term: a group-relative step where all rewards agree). "take" (verl, slime, TRL; memrl's default):
    AdamW still steps, so its momentum from earlier steps and the weight decay move the weights with no
    learning signal (docs/results/health.md). "skip": no optimizer step (the learning-rate schedule still
    advances, as it follows RL steps); train/zero_grad_skipped says when."""


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
    of every share (memrl.training.step.schedule); 1 cuts the whole batch at once (memrl's rule, and a 1-GPU
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
    values and gradients to float rounding, also under FSDP2 and LoRA (memrl.training.update.chunked_logprobs;
    docs/guides/scaleout.md). Models whose logits are not known to be plain lm_head(hidden) keep the full logits,
    the reason logged once. 0 = the full logits; 1024 holds ~0.6 GB of fp32 logits per chunk at a 152K
    vocabulary."""
    prefix_sharing: str = valid("auto", choices=("never", "always", "auto"))
    """Forward a prefix that rows of a micro-batch share once (memrl.training.update.prefix_sharing): the update, the
    recomputed old logprobs and the KL reference's pass, the same values and gradients to float rounding,
    self-checked against the per-row forward on the run's first shared micro-batch (a mismatch logs a
    warning and turns it off for the run). "always" refuses what it cannot apply to (trainer.num_workers > 1,
    sequence parallelism, gradient checkpointing, an MoE router loss, routing replay); "auto" is on where it
    applies and off elsewhere (the default: faster on every workflow measured, docs/guides/prefix_sharing.md);
    "never" forwards every row whole, as the per-row trainers do (float rounding then differs from auto, so
    every sampled token after the first update may too: the demos' tables recorded before 2026-11-28 used it).
    perf/shared_token_ratio logs forwarded / row tokens each step."""
    prefix_min_tokens: int = valid(16, ge=1, le=MAX_TOKENS)
    """prefix_sharing: the shortest prefix worth a forward of its own (rows sharing fewer tokens forward whole)."""
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
    """Where step metrics go (memrl.training.monitor.trackers): jsonl (metrics.jsonl, always written: resume and
    `memrl view` read it), tensorboard (<out_dir>/tb), wandb (offline, <out_dir>/wandb), mlflow (local
    store, <out_dir>/mlruns unless mlflow_uri). The tracker run ids live in the checkpoints, so a resumed
    run continues the same runs. wandb / mlflow need `pip install 'memrl[track]'`."""
    mlflow_uri: str = ""
    """loggers has mlflow: its tracking URI ("" = file:<out_dir>/mlruns, mlflow 3's file store, in maintenance
    mode; recommended for local tracking: sqlite:///<dir>/mlflow.db, which needs sqlalchemy). Checked before
    the run: the scheme, a file store that is a file, a sqlite store without sqlalchemy."""
    val_every: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """Validate on the `val` section's files every k steps (memrl.training.step.validation); 0 = off. The
    published MemAgent script validates every 5 steps, ReMemR1's and MemAct's every 10."""
    save_best: str = ""
    """A logged metric whose highest value's checkpoint is kept as checkpoints/best; "" = off. memrl ranks
    by validation (val/mean_accuracy, val/<dataset>/<N>/accuracy, ...); ReMemR1's save_best_val ranks by
    the training batch's mean score (reward/mean here)."""
    save_best_after: int = valid(0, ge=0, le=MAX_COUNT, note="0 = every step saves")
    """save_best: steps <= k still set the best value but save no checkpoint (ReMemR1's trainer skips its
    first 20 steps so: `global_steps > 20`)."""
    progress: bool = True
    on_collapse: str = valid("warn", choices=ON_COLLAPSE)
    """What a health alarm of `health.guard` does (memrl.training.monitor.guard; docs/guides/health.md): warn = one line
    above the progress bar, the run goes on; stop = the run ends naming the last good checkpoint; rollback =
    back to the last good checkpoint (whose weights sampled a step before the streak), the learning rate
    scaled and new sampling seeds
    (health.rollback_*), at most health.max_rollbacks times. Every alarm is in the step metrics (health/*)."""
    dump_every: int = valid(10, ge=0, le=MAX_COUNT, note="0 = off")
    """Append a sample of this step's trajectories to trajectories.jsonl every k steps (`memrl view`); 0 = off."""
    dump_trajectories: int = valid(4, ge=1, le=MAX_COUNT)
    """Trajectories per dump, whole groups in batch order (so advantages compare within a group)."""
    dump_max_mb: float = valid(200.0, ge=0, le=MAX_MB)
    """Stop dumping (one warning) once trajectories.jsonl reaches this size."""
    num_workers: int = valid(1, ge=1, le=MAX_PARALLEL)
    """Training ranks (FSDP2). 1 = in the trainer's process; N > 1 = Ray actors (memrl.training.ranks.placement)."""
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
    """Ulysses sequence parallelism (memrl.training.update.ulysses; docs/guides/scaleout.md): groups of S consecutive
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
    within sync_check_tol, else the run stops naming the engine (memrl.training.sync.sync_check; its cost is
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
    health: HealthSection = field(default_factory=HealthSection)
    """Training health (memrl.training.monitor.health): the alarms' thresholds and the rollback of trainer.on_collapse."""
    threads: ThreadsSection = field(default_factory=ThreadsSection)
    """CPU threads of the driver and its workers (memrl.threads): torch intra-op / inter-op, OpenMP wait policy."""
    out_dir: str = "runs/train"

    def _check_rollback(self) -> None:
        """trainer.on_collapse=rollback restores a checkpoint in place: one rank, full weights, synchronous, and
        checkpoints kept often enough that one predates every alarm streak."""
        t, h = self.trainer, self.health
        refused = {"trainer.num_workers > 1": t.num_workers > 1, "model.lora.rank > 0": self.model.lora.rank > 0,
                   "rollout.max_staleness > 0": self.rollout.max_staleness > 0,
                   "trainer.save_every=0 (no checkpoint to go back to)": t.save_every == 0}
        for what, on in refused.items():
            if on:
                raise ConfigError(f"trainer.on_collapse=rollback does not support {what}")
        within = -(-h.patience // t.save_every)  # saved from the streak's first sampling weights until it fires
        if t.keep_checkpoints and t.keep_checkpoints <= within:
            raise ConfigError(
                f"trainer.keep_checkpoints={t.keep_checkpoints} must be > {within} with trainer.on_collapse=rollback, "
                f"trainer.save_every={t.save_every} and health.patience={h.patience}: the checkpoint before a streak "
                "would be pruned before the alarm fires (0 keeps all)")

    def _check_routing_replay(self) -> None:
        """algorithm.routing_replay: r2 records in the trainer's old-logprob pass, r3 in the in-process engine's
        padded cache; one rank."""
        replay, kind = self.algorithm.routing_replay, engine_kind(self.engine.name)
        refused = {"algorithm.old_logprobs=engine (r2 records in the trainer's old-logprob pass)":
                   replay == "r2" and self.algorithm.old_logprobs != "trainer",
                   "trainer.num_workers > 1": self.trainer.num_workers > 1,
                   f"engine.name={self.engine.name} (r3 records in the in-process hf engine)":
                   replay == "r3" and (not kind.serves_policy or self.rollout.num_engines > 0)}
        for what, on in refused.items():
            if on:
                raise ConfigError(f"algorithm.routing_replay={replay} does not support {what}")
        problem = kind.routing_problem(self.engine) if replay == "r3" and kind.routing_problem else None
        if problem:  # the engine kind's own say (EngineKind.routing_problem)
            raise ConfigError(f"algorithm.routing_replay={replay} does not support {problem}")

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
        if self.trainer.prefix_sharing == "always":
            blocker = prefix_sharing_blocker(self)
            if blocker:
                raise ConfigError(f"trainer.prefix_sharing=always does not support {blocker}; set it to auto or never")
        if self.trainer.on_collapse == "rollback":
            self._check_rollback()
        if self.algorithm.routing_replay != "none":
            self._check_routing_replay()
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


def prefix_sharing_blocker(cfg: TrainConfig) -> str:
    """What keeps trainer.prefix_sharing from applying to a run ("" when nothing does): "always" refuses it, "auto"
    forwards every row whole. Each one changes the forwards' count or shape per rank, or counts tokens."""
    t, a = cfg.trainer, cfg.algorithm
    blockers = {"trainer.num_workers > 1 (FSDP ranks must run as many forwards)": t.num_workers > 1,
                "trainer.sequence_parallel > 1": t.sequence_parallel > 1,
                "model.gradient_checkpointing (its layers drop the KV cache in training)": cfg.model.gradient_checkpointing,
                "trainer.router_aux_loss_coef > 0 (the router loss counts shared tokens once)": t.router_aux_loss_coef > 0,
                f"algorithm.routing_replay={a.routing_replay} (it records per-row forwards)": a.routing_replay != "none"}
    return next((what for what, on in blockers.items() if on), "")
