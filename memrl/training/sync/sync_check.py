"""`rollout.sync_check`: after every weight sync, prove the rollout engine serves the trained weights.

The engine greedily continues a fixed probe prompt by `rollout.sync_check_tokens` tokens and returns
their logprobs; the trainer's policy scores the same tokens teacher-forced (log_softmax at T=1, the
engine's greedy convention). If any of them differs by more than `rollout.sync_check_tol`, the run
stops with one line naming the engine: an engine that kept the old (or the base) weights cannot go
unnoticed. The check's cost is logged as time/sync_check_s, the largest difference as
sync/probe_max_abs_diff.

The tolerance must sit above the engine's numerical noise (float32 on the CPU: ~1e-5; bfloat16 engines
need ~0.05-0.1) and below what one update moves: with a tiny learning rate a stale engine may differ by
less than the noise and pass. The trainer's side scores the probe through the worker group
(`WorkerGroup.probe_logprobs`: memrl.training.update.policy.teacher_forced_logprobs, the policy in process
at world size 1; every FSDP2 rank runs the sharded forward, rank 0's result); Ray replicas are probed
through the engine group (the replica that takes the request).
"""

from __future__ import annotations

import math
import time
from typing import Any

from memrl.engines.base import SamplingParams
from memrl.engines.registry import engine_kind
from memrl.errors import UserError

PROBE_TEXT = "Q: Which colour is the key? M: No memory yet. S: the key is red and the box is"
"""The fixed probe (its first `PROBE_TOKENS` token ids; any tokenizer encodes it to something)."""
PROBE_TOKENS = 12


class SyncCheckError(UserError):
    """The engine's logprobs on the probe do not match the trainer's after a weight sync."""


def probe_ids(tokenizer: Any) -> list[int]:
    ids = list(tokenizer.encode(PROBE_TEXT, add_special_tokens=False))[:PROBE_TOKENS]
    if not ids:
        raise UserError("rollout.sync_check: the tokenizer encodes the probe text to no tokens")
    return ids


def engine_name(cfg: Any) -> str:
    r = cfg.rollout
    if r.num_engines > 0:
        return f"{r.engine or cfg.engine.name} (rollout.num_engines={r.num_engines} Ray replicas)"
    return engine_kind(cfg.engine.name).describe_config(cfg.engine)


def check_sync(cfg: Any, when: str, tokenizer: Any, engine: Any, runtime: Any, workers: Any) -> dict[str, float]:
    """Run the probe on `engine` (on the run's `runtime`, whose loop the engine's client lives on) against
    `workers.probe_logprobs` (the policy in process at world size 1, the FSDP2 ranks above); {} when
    rollout.sync_check is off, else the metrics. `when`: which sync, for the message. Raises
    SyncCheckError (one line, naming the engine) on a mismatch."""
    r = cfg.rollout
    if not r.sync_check:
        return {}
    t0 = time.perf_counter()
    prompt = probe_ids(tokenizer)
    sampling = SamplingParams(temperature=0.0, max_tokens=r.sync_check_tokens, seed=0)
    comp = runtime.run(engine.generate(prompt, sampling))
    tokens = list(comp.token_ids)
    ours = list(workers.probe_logprobs(prompt, tokens))
    diffs = [abs(a - b) if math.isfinite(a) and math.isfinite(b) else math.inf
             for a, b in zip(comp.logprobs, ours, strict=True)]
    worst = max(diffs, default=0.0)
    if not comp.token_ids or worst > r.sync_check_tol:
        at = diffs.index(worst) if diffs else 0
        raise SyncCheckError(
            f"rollout.sync_check failed {when}: engine {engine_name(cfg)} gives "
            f"logprob {comp.logprobs[at] if diffs else float('nan'):.6f} to probe token {at}, the trainer "
            f"{ours[at] if diffs else float('nan'):.6f} (|diff| {worst:.3g} > rollout.sync_check_tol="
            f"{r.sync_check_tol}); the engine is not serving the trained weights")
    return {"time/sync_check_s": time.perf_counter() - t0, "sync/probe_max_abs_diff": worst}
