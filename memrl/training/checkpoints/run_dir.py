"""What `memrl train` may do with an out_dir that already holds a run.

- Without `--resume` or `--overwrite`, an out_dir with checkpoints or metrics is refused: a re-run would
  start from step 0 and rotate the finished run's checkpoints away.
- `--overwrite` deletes the old run's checkpoints and validation outputs first (metrics.jsonl and the
  trajectory dump are cut back by the new run, memrl.training.monitor.metrics_log / dump).
- `--resume` compares the config with the one the checkpoint saved: a setting that changes the run (data,
  model, algorithm, batch, optimizer, ...) is refused in one line listing every difference; only the
  settings in MAY_CHANGE (how long, how often to save and log, where to report) may differ.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from memrl.config import ConfigError, to_yaml
from memrl.errors import UsageError, UserError

CHECKPOINTS = "checkpoints"
METRICS = "metrics.jsonl"
CONFIG = "config.yaml"

MAY_CHANGE = (
    "out_dir", "trainer.steps", "trainer.progress", "trainer.loggers", "trainer.tensorboard", "trainer.mlflow_uri",
    "trainer.save_every", "trainer.keep_checkpoints", "trainer.dump_every", "trainer.dump_trajectories",
    "trainer.dump_max_mb",
    # where and on what it runs: a checkpoint resumes at any world size, on another engine or server
    "engine", "trainer.concurrency", "trainer.num_workers", "trainer.cpus_per_worker", "trainer.gpus_per_worker",
    "trainer.cpu_offload", "rollout.num_engines", "rollout.cpus_per_engine", "rollout.gpus_per_engine",
    "rollout.engine", "rollout.weight_sync", "rollout.broadcast_backend", "rollout.broadcast_bucket_mb",
    "rollout.sync_dir", "rollout.colocate", "rollout.gpu_memory_utilization", "rollout.sync_check",
    "rollout.sync_check_tol", "rollout.sync_check_tokens", "ray",
    # how the run watches itself: a run resumed after a collapse may turn the guard on (memrl.training.monitor.guard)
    "trainer.on_collapse", "health",
    # the CPU threads it runs with (memrl.threads): a laptop's run resumes on a shared node
    "threads",
)
"""Dotted keys (or sections) a resumed run may set differently from the run it continues: the number of
steps, logging, trackers, progress bars, checkpoint cadence, trajectory dumps, and the resources and
engine it runs on. Anything else (data, model, workflow, algorithm, optimizer, batch, seed, validation
files, ...) changes what the continued run computes."""


def run_marks(out: Path) -> list[str]:
    """What in `out` says a run was started there ([] for a new or foreign-only directory)."""
    marks = []
    steps = sorted((out / CHECKPOINTS).glob("step_*")) if (out / CHECKPOINTS).is_dir() else []
    if steps:
        marks.append(f"{len(steps)} checkpoint(s), the last {steps[-1].name}")
    if (out / METRICS).is_file() and (out / METRICS).stat().st_size:
        marks.append(METRICS)
    return marks


def prepare_run_dir(out_dir: str | Path, resume: bool, overwrite: bool) -> None:
    """Refuse a directory holding a run unless `resume` or `overwrite`; with `overwrite` delete its
    checkpoints and validation outputs."""
    if resume and overwrite:
        raise UsageError("--resume and --overwrite exclude each other: continue the run or start it again")
    out = Path(out_dir)
    marks = run_marks(out)
    if not marks or resume:
        return
    if not overwrite:
        raise UserError(f"out_dir={out} holds a run ({', '.join(marks)}); pass --resume to continue it or "
                        "--overwrite to delete it and start again from step 0")
    for name in (CHECKPOINTS, "val"):
        shutil.rmtree(out / name, ignore_errors=True)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        return {k: v for key, sub in node.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): node}


def config_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """'key (saved -> now)' for each dotted key outside MAY_CHANGE whose value differs."""
    a, b = _flat(saved), _flat(now)
    out = []
    for key in sorted(set(a) | set(b)):
        if any(key == k or key.startswith(k + ".") for k in MAY_CHANGE):
            continue
        if a.get(key) != b.get(key):
            out.append(f"{key} ({a.get(key, '<unset>')!r} -> {b.get(key, '<unset>')!r})")
    return out


def check_resumed_config(cfg: Any, checkpoint: Path) -> None:
    """ConfigError listing the run-changing differences between `cfg` and the config `checkpoint` saved
    (its config.yaml; a checkpoint without one is not compared). Both sides are compared as saved
    (secrets redacted), so an API key given again is no difference."""
    path = Path(checkpoint) / CONFIG
    if not path.is_file():
        return
    try:
        saved = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"--resume: cannot read the saved config {path}: {str(e).splitlines()[0]}") from e
    changes = config_changes(saved if isinstance(saved, dict) else {}, yaml.safe_load(to_yaml(cfg)))
    if changes:
        raise ConfigError(f"--resume: the config differs from the run's ({path}) in {len(changes)} setting(s) "
                          f"that change the run: {'; '.join(changes)}; resume with the saved values or train "
                          "into a new out_dir")
