"""A bounded sample of training trajectories in `<out_dir>/trajectories.jsonl`, for `memrl view`.

Every `trainer.dump_every` steps, whole groups (in batch order) up to `trainer.dump_trajectories`
trajectories are written, one compact line each: the task, outcome reward, per-call records
(memrl.records: step reward, advantage, trained tokens, info). Writing stops once the file reaches
`trainer.dump_max_mb` (one warning), so a long run cannot fill the disk.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from memrl.records import dumps, json_safe, segment_records
from memrl.types import Group, Task

log = logging.getLogger(__name__)

DUMP_FILE = "trajectories.jsonl"


def truncate_dump(trainer: Any) -> int:
    """On resume at step k: drop the dumped rows of steps after k (a kill between a dump and the next
    checkpoint), which the resumed run dumps again; returns how many (memrl.training.logging.truncate_steps)."""
    from memrl.training.logging import truncate_steps

    path = Path(trainer.out) / DUMP_FILE
    dropped = truncate_steps(path, trainer.step)
    if dropped:
        log.warning("%s: replaced %d row(s) of steps after %d, which are redone", path, dropped, trainer.step)
    return dropped


def note_tasks(trainer: Any, tasks: list[Task]) -> None:
    """Remember this step's tasks (question, answers) on the trainer until the next dump check."""
    seen = trainer.__dict__.setdefault("_dump_tasks", {})
    seen.update({t.task_id: t for t in tasks})


def trajectory_rows(step: int, groups: list[Group], tasks: dict[str, Task], limit: int, workflow: str,
                    tokenizer: Any = None) -> list[dict[str, Any]]:
    """Rows of the first whole groups holding up to `limit` trajectories (at least one group)."""
    rows: list[dict[str, Any]] = []
    for g in groups:
        if rows and len(rows) + len(g.trajectories) > limit:
            break
        task = tasks.get(g.task_id)
        for t in g.trajectories:
            rows.append({
                "step": step,
                "task_id": t.task_id,
                "trajectory_id": t.trajectory_id,
                "workflow": workflow,
                "question": task.question if task else "",
                "answers": list(task.answers) if task else [],
                "prediction": t.final_answer,
                "reward": json_safe(t.reward),
                "group_rewards": json_safe([tt.reward for tt in g.trajectories]),
                "metrics": json_safe(t.metrics),
                "memory_trace": json_safe(t.info.get("memories", [])),
                "model_calls": len(t.segments),
                "steps": segment_records(t.segments, tokenizer),
            })
    return rows


def maybe_dump(trainer: Any, groups: list[Group]) -> int:
    """The trainer hook: after the update of step `trainer.step + 1`; returns the lines written."""
    sec = trainer.cfg.trainer
    tasks = trainer.__dict__.pop("_dump_tasks", {})
    step = trainer.step + 1
    if not sec.dump_every or step % sec.dump_every or not groups:
        return 0
    path = Path(trainer.out) / DUMP_FILE
    cap = int(sec.dump_max_mb * 2**20)
    size = path.stat().st_size if path.exists() else 0
    if size >= cap:
        if not trainer.__dict__.get("_dump_capped"):
            log.warning("%s reached trainer.dump_max_mb=%s; no more trajectory dumps", path, sec.dump_max_mb)
            trainer._dump_capped = True
        return 0
    rows = trajectory_rows(step, groups, tasks, max(1, sec.dump_trajectories), trainer.cfg.workflow["name"],
                           getattr(trainer, "tokenizer", None))
    with open(path, "a", encoding="utf-8") as f:
        for r in rows:
            f.write(dumps(r) + "\n")
    trainer._dumped_rows = rows  # the trainer's trackers log them as a table (trainer.loggers)
    return len(rows)
