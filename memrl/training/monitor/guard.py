"""The collapse guard: what a run does when a health alarm fires (memrl.training.monitor.health), as
trainer.on_collapse says.

- warn: one line above the progress bar (the log without one) when an alarm first fires; the run goes on.
- stop: the run ends with a one-line CollapseError naming the alarm and the last good checkpoint (the
  newest one whose weights sampled a step before the alarm's streak began: a streak from step s began with
  the weights saved after step s - 1, so that is checkpoint s - 2 or older); the collapsed step is not saved.
- rollback: the run goes back to that checkpoint (weights, optimizer, scheduler, RNG, data position and
  health state), the checkpoints after it are removed, the learning rate is scaled by
  health.rollback_lr_scale and the rollouts get new seeds (health.rollback_reseed), the event is appended
  to <out_dir>/health_events.jsonl, and the run goes on; after health.max_rollbacks rollbacks a collapse
  stops it. The rollback count is saved in every checkpoint, so a resumed run samples and trains as the
  uninterrupted one.

Every alarm is logged (health/*) whatever the mode; only the alarms in health.guard trigger stop / rollback.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from memrl.errors import UserError
from memrl.training.checkpoints.checkpoint import LATEST, STEP_DIR, CheckpointError, verify_checkpoint
from memrl.training.monitor.health import Alarm, HealthMonitor

log = logging.getLogger(__name__)


class Trainer(Protocol):
    """What the guard uses of memrl.training.trainer.Trainer (which imports this module)."""

    cfg: Any
    parts: Any
    health: HealthMonitor

    @property
    def step(self) -> int: ...
    @property
    def ckpt_root(self) -> Path: ...
    def save(self) -> Path: ...
    def sync(self, first: bool = False) -> dict[str, float]: ...
    def restore(self, checkpoint: Path, state: dict[str, Any], lr_scale: float = 1.0) -> None: ...

RECORDS = "health_events.jsonl"
"""The run's record of the guard's actions (one JSON object a line), beside metrics.jsonl."""

SEED_STRIDE = 1_000_000
"""health.rollback_reseed: rollback r adds r x this to every later step's rollout seed (MAX_COUNT steps)."""


class CollapseError(UserError):
    """The guard stopped the run (trainer.on_collapse=stop, or rollback with none left)."""


def good_checkpoint(root: Path, before: int) -> tuple[Path, dict[str, Any]] | None:
    """The newest loadable checkpoint under `root` of a step < `before`, with its state (None: none kept)."""
    steps = sorted((int(p.name[5:]), p) for p in root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name))
    for step, p in reversed(steps):
        if step >= before:
            continue
        try:
            return p, verify_checkpoint(p)
        except CheckpointError as e:
            log.warning("checkpoint %s is not usable for the guard: %s", p, e)
    return None


def drop_after(root: Path, keep: Path) -> list[str]:
    """Remove the checkpoints newer than `keep` and point `latest` at it (a rollback); returns their names."""
    step = int(keep.name[5:])
    gone = [p for p in root.glob("step_*") if p.is_dir() and STEP_DIR.fullmatch(p.name) and int(p.name[5:]) > step]
    pointer = root / f".{LATEST}.tmp"
    pointer.write_text(keep.name + "\n", encoding="utf-8")
    os.replace(pointer, root / LATEST)  # first: a kill while removing resumes from `keep`
    for p in gone:
        shutil.rmtree(p, ignore_errors=True)
    return sorted(p.name for p in gone)


def record(out: Path, row: dict[str, Any]) -> None:
    """Append one event to <out>/health_events.jsonl."""
    with (out / RECORDS).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")


def read_records(out: Path) -> list[dict[str, Any]]:
    p = out / RECORDS
    if not p.is_file():
        return []
    return [json.loads(line) for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def truncate_records(out: Path, rollbacks: int) -> int:
    """Drop the rollback events past the `rollbacks` a resumed checkpoint counts (the run redoes them);
    returns how many."""
    rows = read_records(out)
    kept = [r for r in rows if r.get("event") != "rollback" or int(r.get("rollback", 0)) <= rollbacks]
    if len(kept) != len(rows):
        tmp = out / (RECORDS + ".tmp")
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in kept), encoding="utf-8")
        os.replace(tmp, out / RECORDS)
    return len(rows) - len(kept)


def seed_offset(cfg: Any, rollbacks: int) -> int:
    """What health.rollback_reseed adds to every rollout seed after `rollbacks` rollbacks (`cfg`: the health
    section)."""
    return rollbacks * SEED_STRIDE if cfg.rollback_reseed else 0


def begin(trainer: Trainer) -> None:
    """At the start of the loop (fresh or resumed): health_events.jsonl holds the rollbacks the checkpoint
    counts; under on_collapse=rollback a fresh run saves its step-0 checkpoint (a collapse in the first steps
    goes back to the initial weights)."""
    truncate_records(trainer.parts.out, trainer.health.rollbacks)
    if trainer.cfg.trainer.on_collapse == "rollback" and trainer.step == 0:
        trainer.save()


def alarm_line(step: int, alarms: list[Alarm], mode: str) -> str:
    """The one line shown when alarms first fire."""
    said = "; ".join(f"{a.name}: {a.reason}" for a in alarms)
    return f"step {step}: health alarm ({said}); trainer.on_collapse={mode}"


def last_good(root: Path, start: int) -> tuple[Path, dict[str, Any]] | None:
    """The checkpoint to go back to when an alarm's streak began at step `start`: step s's rollout samples
    with the weights saved after step s - 1, so the streak's first bad rollout came from checkpoint start - 1
    (the update that broke the run is in it) and the last good weights are the newest checkpoint before
    that one; a streak from step 1 or 2 goes back to step 0, the run's initial weights (rollback saves them)."""
    return good_checkpoint(root, max(start - 1, 1))


def stop_message(step: int, alarms: list[Alarm], root: Path, start: int, why: str) -> str:
    """CollapseError's line: the alarms, why the run stops, and the last good checkpoint."""
    good = last_good(root, start)
    where = (f"the last good checkpoint is {good[0]} (step {int(good[1]['step'])}, whose weights sampled a step "
             f"before the streak began at step {start})" if good else f"no checkpoint from before step {start} is kept")
    said = "; ".join(f"{a.name}: {a.reason}" for a in alarms)
    return f"step {step}: training collapsed ({said}); {why}; {where}"


def act(trainer: Trainer, alarms: list[Alarm], metrics: dict[str, float], logger: Any) -> bool:
    """After step `trainer.step` was logged (`metrics`) with `alarms` firing: show the ones that fired first now, then
    do what trainer.on_collapse says. Returns True when the run rolled back (the step is not saved);
    raises CollapseError to stop."""
    cfg, step = trainer.cfg, trainer.step
    mode, h = cfg.trainer.on_collapse, cfg.health
    new = [a for a in alarms if a.streak == h.patience]
    if new:
        logger.note(alarm_line(step, new, mode))
    acting = [a for a in alarms if a.name in h.guard]
    if mode == "warn" or not acting:
        return False
    root, start = trainer.ckpt_root, trainer.health.streak_start(acting, step)
    if mode == "stop":
        raise CollapseError(stop_message(step, acting, root, start, "stopped (trainer.on_collapse=stop)"))
    if trainer.health.rollbacks >= h.max_rollbacks:
        raise CollapseError(stop_message(step, acting, root, start, f"stopped after health.max_rollbacks="
                                         f"{h.max_rollbacks} rollback(s)"))
    good = last_good(root, start)
    if good is None:
        raise CollapseError(stop_message(step, acting, root, start, "cannot roll back"))
    rollback(trainer, good[0], good[1], step, acting, metrics, logger)
    return True


def rollback(trainer: Trainer, path: Path, state: dict[str, Any], step: int, alarms: list[Alarm],
             metrics: dict[str, float], logger: Any) -> None:
    """Back to checkpoint `path` (its `state`) in place, with the next rollback's learning rate and seeds; the
    event row keeps the trigger step's health/* and reward/mean (metrics.jsonl drops the steps undone)."""
    cfg, health = trainer.cfg, trainer.health
    count = health.rollbacks + 1
    at_ckpt = int((state.get("health") or {}).get("rollbacks", 0))  # the rollbacks its learning rate already has
    scale = cfg.health.rollback_lr_scale ** (count - at_ckpt)
    trainer.restore(path, state, scale)
    gone = drop_after(trainer.ckpt_root, path)
    health.rollbacks = count
    logger.rewind(trainer.step)
    row = {"event": "rollback", "rollback": count, "step": step, "to_step": trainer.step, "checkpoint": str(path),
           "removed": gone, "alarms": [a.name for a in alarms], "lr_scale": cfg.health.rollback_lr_scale ** count,
           "seed_offset": seed_offset(cfg.health, count),
           "metrics": {k: v for k, v in metrics.items() if k.startswith("health/") or k == "reward/mean"}}
    record(trainer.parts.out, row)
    logger.note(f"step {step}: rolled back to {path} (rollback {count} of {cfg.health.max_rollbacks}, learning rate "
                f"x{row['lr_scale']:g}{', new sampling seeds' if row['seed_offset'] else ''})")
    trainer.sync(first=True)
