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
from memrl.training.monitor.metrics_log import truncate_steps
from memrl.types import Group

log = logging.getLogger(__name__)

DUMP_FILE = "trajectories.jsonl"


class TrajectoryDump:
    """The trainer's writer of `<out_dir>/trajectories.jsonl` (`sec`: the trainer section: dump_every,
    dump_trajectories, dump_max_mb). All its state is here (the size cap's warning, once); the tasks come
    from the groups (memrl.types.Group.task)."""

    def __init__(self, out: str | Path, sec: Any, workflow: str, tokenizer: Any = None) -> None:
        self.path = Path(out) / DUMP_FILE
        self.sec, self.workflow, self.tokenizer = sec, workflow, tokenizer
        self.capped = False

    def truncate(self, step: int) -> int:
        """On resume at step k: drop the dumped rows of steps after k (a kill between a dump and the next
        checkpoint), which the resumed run dumps again; returns how many
        (memrl.training.monitor.metrics_log.truncate_steps)."""
        dropped = truncate_steps(self.path, step)
        if dropped:
            log.warning("%s: replaced %d row(s) of steps after %d, which are redone", self.path, dropped, step)
        return dropped

    def write(self, step: int, groups: list[Group]) -> list[dict[str, Any]]:
        """After the update of `step`: on a dump step, a bounded sample of `groups` appended to the file;
        returns the rows written (the trainer's trackers log them as a table), [] otherwise."""
        sec = self.sec
        if not sec.dump_every or step % sec.dump_every or not groups:
            return []
        cap = int(sec.dump_max_mb * 2**20)
        size = self.path.stat().st_size if self.path.exists() else 0
        if size >= cap:
            if not self.capped:
                log.warning("%s reached trainer.dump_max_mb=%s; no more trajectory dumps", self.path, sec.dump_max_mb)
                self.capped = True
            return []
        rows = trajectory_rows(step, groups, max(1, sec.dump_trajectories), self.workflow, self.tokenizer)
        with open(self.path, "a", encoding="utf-8") as f:
            for r in rows:
                f.write(dumps(r) + "\n")
        return rows


def trajectory_rows(step: int, groups: list[Group], limit: int, workflow: str,
                    tokenizer: Any = None) -> list[dict[str, Any]]:
    """Rows of the first whole groups holding up to `limit` trajectories (at least one group); the
    question and answers are the group's Task's (empty for a group without one)."""
    rows: list[dict[str, Any]] = []
    for g in groups:
        if rows and len(rows) + len(g.trajectories) > limit:
            break
        task = g.task
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
