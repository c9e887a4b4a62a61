"""The policy worker: model (+ KL reference), optimizer and the sharded update of one training rank, and
`build_workers`, which makes the trainer's worker group of them (memrl.training.ranks.worker_group).

`PolicyWorker` is the same code at world size 1 (in the trainer's process, no process group, a plain
module) and at world size N (one per rank in a Ray actor, FSDP2 over gloo/NCCL; placed in bundles of a
placement group, memrl.training.ranks.placement). `train_rows` takes this rank's share of a mini-batch, whose
row weights the driver fixed over the whole mini-batch (memrl.training.update.packing), so the update equals the
single-process one. Checkpoints are HF directories written by rank 0 from the gathered state dict, with
the optimizer's tensors as a torch.distributed.checkpoint directory every rank writes its shards to, so a
run resumes at any world size (memrl.training.checkpoints.checkpoint).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import AutoTokenizer

from memrl.algorithms.base import options_kwargs
from memrl.algorithms.losses import MISMATCH_PAIRS, MISMATCH_SUMS, mismatch_means
from memrl.engines.ray_engines import on_bundle
from memrl.engines.weight_transfer import WeightTransfer
from memrl.errors import UserError
from memrl.model_open import open_model
from memrl.precision import autocast, torch_dtype
from memrl.threads import apply_inherited
from memrl.training.algorithm_section import off_policy_cap
from memrl.training.checkpoints.checkpoint import OPTIM_DIR, STATE_FILE, load_state, save_checkpoint, temp_dir
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.ranks.placement import placement_group, replica_kind, share_gpu
from memrl.training.ranks.worker_group import LocalRank, RankGroup, WorkerGroup
from memrl.training.update import lora as L
from memrl.training.update import ulysses as U
from memrl.training.update.optim import decay_groups, lr_lambda, skips_zero_advantage
from memrl.training.update.packing import MicroBatch, TrainBatch, blank_row, collate
from memrl.training.update.policy import clip_norm, ppo_micro_loss, teacher_forced_logprobs, token_logprobs
from memrl.training.update.prefix_sharing import Sharer
from memrl.training.update.routing import RoutingReplay
from memrl.types import Segment

__all__ = ["PolicyWorker", "RayRank", "build_workers", "node_address"]


def node_address() -> tuple[str, int]:
    """This process's node IP (Ray's, when Ray runs here; else 127.0.0.1) and a free port on it."""
    try:
        import ray  # noqa: PLC0415 - optional (ray extra)

        ip = ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"
    except ImportError:
        ip = "127.0.0.1"
    return ip, D.free_port(ip)


class _GatheredModel:
    """What `checkpoint.save_checkpoint` needs of a model (`save_pretrained`), writing a gathered
    full state dict instead of the (possibly sharded) module's own."""

    def __init__(self, model: Any, state: dict[str, torch.Tensor]) -> None:
        self.model, self.state = model, state

    def save_pretrained(self, path: Any, **kw: Any) -> None:
        # save_pretrained empties the dict it is given: hand it a shallow copy.
        self.model.save_pretrained(path, state_dict=dict(self.state), **kw)


def _read_state(start: str) -> dict[str, Any]:
    """trainer_state.pt memory-mapped (every rank reads it; pages are shared, tensors load lazily) and
    weights-only; checkpoints written before name-keyed optimizer states need the full unpickler."""
    try:
        return torch.load(Path(start) / STATE_FILE, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - older checkpoints pickled other objects
        return load_state(start)


class PolicyWorker:
    """One training rank. `start`: a checkpoint directory to resume from (weights + optimizer), or None."""

    def __init__(self, cfg: TrainConfig, info: D.DistInfo = D.DistInfo(), start: str | None = None) -> None:
        D.init_group(info)
        self.cfg, self.info = cfg, info
        self.loss_kwargs = options_kwargs(cfg.algorithm.options()[1])
        src = L.base_source(cfg.model, start)  # LoRA: the base; the checkpoint holds the adapter
        dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
        self.weights_dtype, self.compute_dtype = dtype, torch_dtype(cfg.model.compute_dtype)
        self.device = cfg.model.device
        if info.world_size > 1 and self.device.startswith("cuda"):
            self.device = f"cuda:{torch.cuda.current_device()}"
        self.tokenizer = AutoTokenizer.from_pretrained(src)
        key = "model.path" if str(src) == str(cfg.model.path) else "checkpoint"
        self.model = open_model(src, key, dtype=dtype).to(self.device)
        if cfg.model.gradient_checkpointing:
            # transformers >= 5.24 names it activation checkpointing (the old name warns); older ones only have the old
            enable = getattr(self.model, "activation_checkpointing_enable", None) or self.model.gradient_checkpointing_enable
            enable()
        if L.enabled(cfg.model):
            self.model = L.wrap(self.model, cfg.model.lora, cfg.trainer.seed, start, cfg.model.gradient_checkpointing)
        t = cfg.trainer
        if t.router_aux_loss_coef > 0 and not hasattr(self.model.config, "output_router_logits"):
            raise UserError(f"trainer.router_aux_loss_coef={t.router_aux_loss_coef} needs a mixture-of-experts model "
                             f"(a config with output_router_logits, e.g. qwen3_moe); {src} is "
                             f"{self.model.config.model_type}")
        self.sp, self.sp_group, self.sp_rank = t.sequence_parallel, None, 0
        if self.sp > 1:  # Ulysses: blocks of sp consecutive ranks share each micro-batch (memrl.training.update.ulysses)
            if info.world_size % self.sp:
                raise UserError(f"trainer.sequence_parallel={self.sp} must divide the world size {info.world_size}")
            try:
                U.check_model(self.model.config, self.sp)
            except ValueError as e:
                raise UserError(f"{src}: {e}") from None
            self.sp_group, self.sp_rank = D.block_group(self.sp), info.rank % self.sp
        D.shard_model(self.model, t.fsdp_bf16, t.cpu_offload)
        if L.enabled(cfg.model) and D.grouped():
            L.first_forward(self.model, self.tokenizer.pad_token_id or 0)  # FSDP2's dtypes, adapter on
        self.routing = None  # algorithm.routing_replay=r2 (memrl.training.update.routing)
        if cfg.algorithm.routing_replay != "none":
            try:
                self.routing = RoutingReplay(self.model)
            except ValueError as e:
                raise UserError(f"algorithm.routing_replay={cfg.algorithm.routing_replay}: {src}: {e}") from None
        self.ref = None
        if cfg.algorithm.kl_coef > 0 and L.enabled(cfg.model):
            self.ref = L.BaseReference(self.model)  # the initial policy: the same module, adapters off
        elif cfg.algorithm.kl_coef > 0:
            # The reference is the INITIAL policy, also when resuming; sharded like the policy.
            self.ref = open_model(cfg.model.path, "model.path", dtype=dtype).to(self.device).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
            D.shard_model(self.ref, t.fsdp_bf16, t.cpu_offload)
        low = self.weights_dtype != torch.float32 or self.compute_dtype not in (None, torch.float32)
        self.sharer = Sharer(cfg, self.model, t.token_budget * self.sp, low, self._no_grad_logprobs, info.world_size)
        o = cfg.optim
        self.opt = torch.optim.AdamW(decay_groups(self.model, o.weight_decay_scope), lr=o.lr,
                                     betas=(o.beta1, o.beta2), weight_decay=o.weight_decay)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lr_lambda(o.warmup_steps))
        if start is not None:
            self._load_optimizer(start)

    def _load_optimizer(self, start: str) -> None:
        """The optimizer and scheduler states of checkpoint `start`."""
        state = _read_state(start)
        D.load_optimizer(self.model, self.opt, start, state)
        self.sched.load_state_dict(state["scheduler"])

    def load_checkpoint(self, path: str, lr_scale: float = 1.0) -> None:
        """Back to checkpoint `path` in place (trainer.on_collapse=rollback; world size 1, full fine-tuning):
        its weights, optimizer and scheduler, then the learning rate (peak and schedule) times `lr_scale`."""
        loaded = open_model(path, "checkpoint", dtype=self.weights_dtype)
        with torch.no_grad():
            self.model.load_state_dict(loaded.state_dict())
        del loaded
        self._load_optimizer(path)
        self.sched.base_lrs = [b * lr_scale for b in self.sched.base_lrs]
        for g in self.opt.param_groups:
            g["lr"] *= lr_scale
            if "initial_lr" in g:
                g["initial_lr"] *= lr_scale

    def _no_grad_logprobs(self, *mbs: MicroBatch) -> tuple[torch.Tensor, ...]:
        """The policy's logprobs of micro-batches `mbs` (no gradient; the prefix-sharing self-check's forwards)."""
        a, chunk = self.cfg.algorithm, self.cfg.trainer.logits_chunk_tokens
        with torch.no_grad(), self._compute():
            return tuple(token_logprobs(self.model, mb, a.temperature, chunk_tokens=chunk)[0] for mb in mbs)

    # ------------------------------------------------------------------ the update
    def train_rows(self, share: TrainBatch, step_scheduler: bool = True) -> dict[str, float]:
        """One optimizer step on this rank's `share` of a mini-batch (its rows with the weights the driver
        fixed over the whole mini-batch; at world size 1 the whole of it), gradients accumulated over
        token-budget micro-batches; metrics are sums / norms over the GLOBAL mini-batch. `step_scheduler`:
        advance the learning-rate schedule after the step (the trainer does so once per RL step, after its
        last mini-batch, as verl does)."""
        ws = D.world_size()
        mine = share
        all_w = kept_w = share.weight_sum()
        if skips_zero_advantage(self.cfg):
            # Exact: a row with A = 0 adds nothing to the PPO loss or its gradient (no KL or entropy term), and
            # the weights keep the whole batch's normalizers. Logged means then cover the trained rows.
            keep = [i for i, s in enumerate(share.segments) if float(s.advantage or 0.0) != 0.0
                    or any(a != 0.0 for a in s.token_advantages or ())]
            mine = TrainBatch([share.segments[i] for i in keep], [share.weights[i] for i in keep], share.batch_rows)
            kept_w = mine.weight_sum()
        batches = self.sharer.pack(mine.segments) if len(mine) else []
        if self.routing is not None and self.cfg.algorithm.routing_replay == "r3":
            self.routing.recorded = self._rollout_routing(mine.segments)
        # FSDP collectives run per forward/backward: every rank runs the same number of micro-batches,
        # padding with a row of weight 0 (it adds nothing to the loss or the gradient).
        n_steps = D.all_reduce_max(len(batches), self._comm_device())
        pad = self.tokenizer.pad_token_id or 0
        self.model.train()
        self.opt.zero_grad(set_to_none=True)
        sums: dict[str, float] = {"loss/total": 0.0}
        mm = dict.fromkeys(MISMATCH_SUMS, 0.0)  # train/inference mismatch: token sums (docs/guides/async.md)
        pair_mm = {name: dict.fromkeys(MISMATCH_SUMS, 0.0) for name in MISMATCH_PAIRS}  # old_logprobs=trainer
        tokens = forwarded = 0
        for j in range(n_steps):
            if j < len(batches):
                idx = batches[j]
                rows = [mine.segments[i] for i in idx]
                mb = self.sharer.share(collate(rows, [mine.weights[i] for i in idx], pad).to(self.device), rows)
                tokens += mb.num_tokens
                forwarded += mb.share.forwarded_tokens if mb.share is not None else mb.num_tokens
            else:
                mb = collate([blank_row(pad)], [0.0], pad).to(self.device)
            keys = [id(mine.segments[i]) for i in batches[j]] if j < len(batches) else [None]
            with self._sequence_parallel(), self._replay(keys, mb):  # forward and backward (a checkpointed
                part = self._micro_step(self._shard(mb), ws)  # layer's recompute too)
            for k, v in part.mismatch.items():
                mm[k] += v
            for name, sums_of in part.pairs.items():
                for k, v in sums_of.items():
                    pair_mm[name][k] += v
            sums["loss/total"] += float(part.loss.detach())
            for k, v in part.sums.items():
                sums[f"loss/{k}"] = sums.get(f"loss/{k}", 0.0) + v
        if n_steps == 0 and share.batch_rows:  # every row skipped (A = 0 throughout): the step the full pass would take,
            for p in self.model.parameters():  # with zero gradients (Adam's momentum and weight decay still act)
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), clip_norm(self.cfg.optim.grad_clip))
        grad_norm = float(gn.full_tensor() if hasattr(gn, "full_tensor") else gn)  # global: the same on every rank
        skip_zero = grad_norm == 0.0 and self.cfg.optim.zero_grad_steps == "skip"  # the norm is global: every rank agrees
        if math.isfinite(grad_norm) and not skip_zero:
            self.opt.step()
        else:  # no weight changes; a non-finite norm: the driver sees it and stops the run (memrl.training.trainer)
            self.opt.zero_grad(set_to_none=True)
        if step_scheduler and math.isfinite(grad_norm):
            self.sched.step()
        self.model.eval()
        keys = sorted(sums)
        # The loss sums are per token (each rank of a sequence-parallel group sums its own tokens); the
        # counts of rows, micro-batches and tokens come from one rank of each group.
        once = 1.0 if self.sp_rank == 0 else 0.0
        totals = D.all_reduce_sum([sums[k] for k in keys] + [once * x for x in (len(batches), len(share), len(mine),
                                                                                 tokens, all_w, kept_w, forwarded)]
                                  + [mm[k] for k in MISMATCH_SUMS]
                                  + [pair_mm[n][k] for n in MISMATCH_PAIRS for k in MISMATCH_SUMS], self._comm_device())
        out = dict(zip(keys, totals[: len(keys)], strict=True))
        n_mb, rows_all, rows_kept, n_tok, w_all, w_kept, n_fwd = totals[len(keys): len(keys) + 7]
        kind = replica_kind(self.cfg)
        at = len(keys) + 7
        for name in (kind, *MISMATCH_PAIRS):
            for k, v in mismatch_means(dict(zip(MISMATCH_SUMS, totals[at: at + len(MISMATCH_SUMS)], strict=True))).items():
                out[f"mismatch/{name}/{k}"] = v
            at += len(MISMATCH_SUMS)
        if 0 < w_kept < w_all:  # entropy / clipfrac / approx_kl / is_weight: weighted means over the trained tokens
            for k in ("loss/entropy", "loss/clipfrac", "loss/approx_kl", "loss/is_weight", "loss/cov_share"):
                if k in out:
                    out[k] *= w_all / w_kept
        out["train/grad_norm"] = grad_norm
        out["train/zero_grad_skipped"] = float(skip_zero)
        out["train/lr"] = self.sched.get_last_lr()[0]
        out["train/micro_batches"], out["train/rows"], out["train/tokens"] = n_mb, rows_all, n_tok
        out["train/rows_zero_adv_skipped"] = rows_all - rows_kept
        out["train/forwarded_tokens"] = n_fwd  # prefix sharing: each shared prefix once (else = train/tokens)
        out.update(self.sharer.take_check())  # prefix sharing's self-check, in the step that ran it
        return out

    def _micro_step(self, mb: MicroBatch, ws: int) -> Any:
        """The reference's log-probs (no gradient), the PPO loss of micro-batch `mb`, its backward."""
        a, chunk = self.cfg.algorithm, self.cfg.trainer.logits_chunk_tokens
        ref_lp = None
        with self._compute():  # mixed precision: the forwards in bfloat16; the backward below outside autocast
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp, _ = token_logprobs(self.ref, mb, a.temperature, chunk_tokens=chunk)
            part = ppo_micro_loss(self.model, mb, a.temperature, a.loss, self.loss_kwargs,
                                  ref_lp, a.kl_coef, a.kl_kind, a.entropy_coef,
                                  a.off_policy, off_policy_cap(a), a.mismatch_clip,
                                  self.cfg.trainer.router_aux_loss_coef, chunk, (a.llds.coef, a.llds.rows))
        # FSDP averages gradients over ranks; the weights already sum over the global batch. Under sequence
        # parallelism each rank's gradient is its tokens' share, so the world sum is still the whole.
        (part.loss * ws if ws > 1 else part.loss).backward()
        return part

    def _replay(self, keys: list[int | None], mb: MicroBatch) -> Any:
        """algorithm.routing_replay: the rows' experts from the old-logprob pass (r2) or the rollout (r3)."""
        return nullcontext() if self.routing is None else self.routing.replay(keys, mb.input_ids.shape[1])

    def _compute(self) -> Any:
        """The block in which forwards run in model.compute_dtype (autocast; nothing when unset)."""
        return autocast(self.device, self.compute_dtype, self.weights_dtype)

    def _shard(self, mb: MicroBatch) -> MicroBatch:
        """This rank's sequence shard of `mb` (memrl.training.update.ulysses.shard); `mb` itself without SP."""
        return U.shard(mb, self.sp, self.sp_rank) if self.sp > 1 else mb

    def _sequence_parallel(self) -> Any:
        """The block in which the policy and reference run Ulysses attention (nothing without SP)."""
        if self.sp == 1:
            return nullcontext()
        return U.sharded([m for m in (self.model, self.ref) if m is not None], self.sp_group)

    def old_logprobs(self, rows: list[Segment]) -> list[list[float]]:
        """algorithm.old_logprobs=trainer: this rank's rows' response logprobs under the current (pre-update)
        policy, no gradient, at the sampling temperature, in micro-batches packed by the token budget (every
        rank runs as many forwards, padding with a blank row, as FSDP's collectives need)."""
        return self._response_pass(rows, with_entropy=False)[0]

    def old_logprobs_entropy(self, rows: list[Segment]) -> tuple[list[list[float]], list[list[float]]]:
        """`old_logprobs` and, from the same forward, each response token's entropy (AEPO's gate reads it)."""
        return self._response_pass(rows, with_entropy=True)

    def _rollout_routing(self, rows: list[Segment]) -> dict[int, torch.Tensor]:
        """r3: the engine's recorded experts of `rows` (Segment.routing) by row; r2: none yet."""
        if self.cfg.algorithm.routing_replay != "r3":
            return {}
        return {id(s): s.routing for s in rows if s.routing is not None}

    def _record(self, rows: list[Segment], idx: list[int], mb: MicroBatch) -> Any:
        """algorithm.routing_replay: r2 keeps each row's experts of this forward, r3 replays the rollout's
        (nothing when off)."""
        if self.routing is None or not idx:
            return nullcontext()
        if self.cfg.algorithm.routing_replay == "r3":
            return self.routing.replay([id(rows[i]) for i in idx], mb.input_ids.shape[1])
        lengths = [len(rows[i].prompt_ids) + len(rows[i].response_ids) for i in idx]
        return self.routing.record(mb.input_ids.shape[1], lengths, [id(rows[i]) for i in idx])

    def _response_pass(self, rows: list[Segment], with_entropy: bool) -> tuple[list[list[float]], list[list[float]]]:
        pad = self.tokenizer.pad_token_id or 0
        batches = self.sharer.pack(rows) if rows else []
        n_steps = D.all_reduce_max(len(batches), self._comm_device())
        out: list[list[float]] = [[] for _ in rows]
        ents: list[list[float]] = [[] for _ in rows]
        if self.routing is not None:  # one RL step's records at a time; r3: the rollout's
            self.routing.recorded = self._rollout_routing(rows)
        self.model.eval()
        with torch.no_grad(), self._sequence_parallel(), self._compute():
            for j in range(n_steps):
                idx = batches[j] if j < len(batches) else []
                mb = collate([rows[i] for i in idx] or [blank_row(pad)], None, pad).to(self.device)
                mb = self.sharer.share(mb, [rows[i] for i in idx]) if idx else mb
                with self._record(rows, idx, mb):
                    lp, ent = token_logprobs(self.model, self._shard(mb), self.cfg.algorithm.temperature,
                                             with_entropy=with_entropy,
                                             chunk_tokens=self.cfg.trainer.logits_chunk_tokens)
                if self.sp > 1:  # every rank of the group gets the whole rows' log-probs
                    lp = U.gather(lp, self.sp_group, mb.targets.shape[1])
                    if ent is not None:
                        ent = U.gather(ent, self.sp_group, mb.targets.shape[1])
                for k, i in enumerate(idx):
                    p, n = len(rows[i].prompt_ids), len(rows[i].response_ids)
                    out[i] = lp[k, p - 1 : p - 1 + n].tolist()
                    if ent is not None:
                        ents[i] = ent[k, p - 1 : p - 1 + n].tolist()
        return out, ents

    def _comm_device(self) -> str:
        return self.device if self.info.backend == "nccl" else "cpu"

    # ------------------------------------------------------------------ state
    def full_state(self) -> dict[str, torch.Tensor]:
        """The gathered model weights on CPU (rank 0; other ranks get {}). Collective at world size > 1."""
        return D.full_model_state(self.model)

    def engine_weights(self) -> dict[str, torch.Tensor]:
        """What an engine loads after an update: without a process group the live module's state dict (the
        in-process engine shares or copies it), else the gathered weights (rank 0; collective); a LoRA
        policy's merged into the base under HuggingFace names."""
        return L.engine_state(self.full_state() if D.grouped() else self.model.state_dict(), self.cfg.model)

    def optim_state(self) -> dict[str, Any]:
        """The optimizer state keyed by parameter name, full on rank 0 (collective at world size > 1)."""
        return D.full_optim_state(self.model, self.opt)

    def probe_logprobs(self, prompt: list[int], tokens: list[int]) -> list[float]:
        """The policy's teacher-forced logprobs (log_softmax at T=1) of `tokens` after `prompt`
        (rollout.sync_check, memrl.training.sync.sync_check; collective at world size > 1: every rank runs the
        sharded forward)."""
        with self._compute():
            return teacher_forced_logprobs(self.model, prompt, tokens)

    def save(self, root: str, step: int, driver_state: dict[str, Any], keep: int = 0,
             extra_files: dict[str, str] | None = None) -> str:
        """Checkpoint `root/step_XXXXXX` (collective): every rank writes its optimizer shards (DCP) into
        the temporary directory, then rank 0 adds the HF directory from the gathered weights and
        trainer_state.pt (scheduler, param groups, `driver_state`) and renames it into place."""
        weights = self.full_state()
        tmp = temp_dir(root, step, fixed=True) if D.rank() == 0 else Path(root) / f".step_{step:06d}-new"
        if D.grouped():
            torch.distributed.barrier()  # the directory exists before any rank writes into it
        path = ""
        try:
            optim = D.save_optim_dcp(self.model, self.opt, tmp / OPTIM_DIR)  # layout, groups, fresh
            if D.rank() == 0:
                state = dict(driver_state, scheduler=self.sched.state_dict(), **optim)
                if L.is_peft(self.model):  # LoRA: PEFT's adapter files (from the gathered state under ranks)
                    model = L.checkpoint_model(self.model, self.tokenizer, self.cfg.model,
                                               weights if D.grouped() else None)
                else:
                    model = _GatheredModel(self.model, weights) if D.grouped() else self.model
                path = str(save_checkpoint(root, step, model, self.tokenizer, state, keep=keep,
                                           extra_files=extra_files, tmp=tmp))
        finally:
            if D.rank() == 0 and tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)  # a failed save leaves nothing behind
        if D.grouped():
            torch.distributed.barrier()
        return path

    # ------------------------------------------------------------------ weight sync (rank 0 sends)
    def _tied(self) -> bool:
        return bool(getattr(self.model.config, "tie_word_embeddings", False))

    def transfer_address(self) -> tuple[str, int]:
        """This rank's node IP and a free port there (rank 0's hosts the weight-transfer rendezvous)."""
        return node_address()

    def join_transfer(self, spec: Any) -> None:
        """Rank 0 joins the weight-transfer group as its sender (memrl.engines.weight_transfer); the other
        ranks only take part in the gathers."""
        if self.info.rank != 0:
            return
        self.transfer = WeightTransfer(spec, 0, self.device if spec.backend == "nccl" else None)

    def send_weights(self) -> tuple[float, float]:
        """Gather the weights (collective), rank 0 broadcasts them; (gather s, send s). A tied lm_head is
        left out: the receivers tie it to the embedding."""
        t0 = time.perf_counter()
        weights = self.full_state() if D.grouped() else self.model.state_dict()
        weights = L.engine_state(weights, self.cfg.model)  # LoRA: merged, HF names
        t1 = time.perf_counter()
        if D.rank() == 0:
            self.transfer.send(weights, skip=("lm_head.weight",) if self._tied() else ())
        return t1 - t0, time.perf_counter() - t1

    def write_weights(self, path: str) -> float:
        """Gather the weights (collective), rank 0 writes `path`/model.safetensors (atomically: a temp file
        renamed); returns seconds. A tied lm_head is left out, as in HF checkpoints."""
        t0 = time.perf_counter()
        weights = L.engine_state(self.full_state(), self.cfg.model)  # LoRA: merged, HF names
        if D.rank() == 0:
            d = Path(path)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / ".model.safetensors.tmp"
            skip = "lm_head.weight" if self._tied() else None
            save_file({k: v.contiguous() for k, v in weights.items() if k != skip}, str(tmp), metadata={"format": "pt"})
            os.replace(tmp, d / "model.safetensors")
        return time.perf_counter() - t0

    def close(self) -> None:
        if D.grouped() and self.info.world_size > 1:  # a group of one belongs to whoever made it
            D.leave_group()


class RankActor:
    """The body of a Ray actor holding one training rank's PolicyWorker (`RayRank` drives it)."""

    def __init__(self) -> None:
        self.worker: PolicyWorker | None = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: rank 0's hosts the process group's rendezvous."""
        return node_address()

    def setup(self, cfg: TrainConfig, info: D.DistInfo, start: str | None) -> None:
        apply_inherited()  # the driver's threads section (memrl.threads); intra_op's default: this actor's CPUs
        self.worker = PolicyWorker(cfg, info, start)

    def call(self, method: str, args: tuple[Any, ...], publish: bool) -> Any:
        """worker.`method`(*args); `publish`: rank 0 puts the result in the object store and returns
        [reference] (other ranks None)."""
        assert self.worker is not None, "RankActor.setup did not run"
        out = getattr(self.worker, method)(*args)
        if not publish:
            return out
        import ray  # noqa: PLC0415 - optional (ray extra)

        return [ray.put(out)] if self.worker.info.rank == 0 else None


class RayRank:
    """A rank in a Ray actor (`RankActor`): a call is an actor call; results come back through ray.get."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def start(self, method: str, *args: Any, publish: bool = False) -> Any:
        return self.actor.call.remote(method, args, publish)

    def wait(self, pending: list[Any]) -> list[Any]:
        import ray  # noqa: PLC0415 - optional (ray extra)

        return ray.get(pending)


def _ray_group(cfg: TrainConfig, start: str | None) -> RankGroup:
    """`trainer.num_workers` ranks as Ray actors, one per bundle of a placement group, forming one FSDP2
    group (gloo on CPU, NCCL when trainer.gpus_per_worker > 0); rank 0 hosts the rendezvous."""
    import ray  # noqa: PLC0415 - optional (ray extra)
    from ray.util.placement_group import remove_placement_group  # noqa: PLC0415 - optional (ray extra)


    t, r = cfg.trainer, cfg.rollout
    gpu = t.gpus_per_worker > 0
    wcfg = replace(cfg, model=replace(cfg.model, device="cuda" if gpu else "cpu"))
    extra_cpu = r.cpus_per_engine if r.colocate else 0.0
    pg = placement_group(t.num_workers, t.cpus_per_worker + extra_cpu, t.gpus_per_worker, "trainer.num_workers")
    cls = ray.remote(RankActor)
    actors = [cls.options(**on_bundle(pg, i, t.cpus_per_worker, share_gpu(cfg))).remote()
              for i in range(t.num_workers)]

    def release() -> None:
        for a in actors:
            ray.kill(a)
        remove_placement_group(pg)

    try:
        ip, port = ray.get(actors[0].address.remote())
        backend = "nccl" if gpu else "gloo"
        ray.get([a.setup.remote(wcfg, D.DistInfo(i, t.num_workers, ip, port, backend), start)
                 for i, a in enumerate(actors)])
    except BaseException:
        release()
        raise
    return RankGroup([RayRank(a) for a in actors], pg=pg, release=release, sequence_parallel=t.sequence_parallel)


def build_workers(cfg: TrainConfig, start: str | os.PathLike | None = None) -> WorkerGroup:
    """The trainer's worker group: in process at trainer.num_workers=1 (its live model, optimizer and
    scheduler exposed), Ray actors above. `start`: a checkpoint directory to resume from, or None."""
    path = str(start) if start is not None else None
    if cfg.trainer.num_workers > 1:
        return _ray_group(cfg, path)
    w = PolicyWorker(cfg, D.DistInfo(), path)
    return RankGroup([LocalRank(w)], model=w.model, opt=w.opt, sched=w.sched)
