"""Metrics sinks for training: JSONL (one object per step), TensorBoard, and a tqdm bar with ETA."""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path
from typing import Any

from tqdm import tqdm

try:
    from torch.utils.tensorboard import SummaryWriter
except ImportError:  # tensorboard is a declared dependency; degrade to JSONL only
    SummaryWriter = None

log = logging.getLogger(__name__)


class MetricsLogger:
    """Appends `{"step": k, ...metrics}` lines to `metrics.jsonl`, mirrors them to TensorBoard.

    `keep_until=k` (a resumed run at step k) first drops the rows of steps after k: those steps are redone.
    """

    def __init__(self, out_dir: str | os.PathLike, tensorboard: bool = True, progress_total: int = 0,
                 progress_initial: int = 0, progress: bool = True, desc: str = "train",
                 keep_until: int | None = None, trackers: list[Any] | None = None) -> None:
        self.trackers = list(trackers or [])  # memrl.training.monitor.trackers (wandb, mlflow): every row goes there too
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.dropped = truncate_steps(self.path, keep_until) if keep_until is not None else 0
        self._fh = self.path.open("a", encoding="utf-8")
        self._tb = None
        if tensorboard and SummaryWriter is not None:
            self._tb = SummaryWriter(str(self.dir / "tb"))
        self._bar = None
        if progress and progress_total:
            self._bar = tqdm(total=progress_total, initial=progress_initial, desc=desc, unit="step",
                             dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        clean = {k: (float(v) if isinstance(v, int | float) else v) for k, v in metrics.items()}
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in clean.items()}
        self._fh.write(json.dumps({"step": step, **clean}, allow_nan=False, default=str) + "\n")
        self._fh.flush()
        if self._tb is not None:
            for k, v in clean.items():
                if isinstance(v, float) and math.isfinite(v):
                    self._tb.add_scalar(k, v, step)
        self._to_trackers("log", step, clean)
        if self._bar is not None:
            self._bar.update(1)
            shown = {k.split("/")[-1]: f"{clean[k]:.3g}" for k in ("reward/mean", "loss/total", "sft/loss")
                     if isinstance(clean.get(k), float)}
            self._bar.set_postfix(shown)

    def note(self, line: str) -> None:
        """One line for the user: above the progress bar (tqdm.write), or a log warning without one."""
        if self._bar is not None:
            self._bar.write(line)
            log.info("%s", line)  # the log files keep it too
        else:
            log.warning("%s", line)

    def rewind(self, step: int) -> None:
        """Drop the rows of steps after `step` (a rollback, memrl.training.monitor.guard: they are redone)."""
        self._fh.close()
        truncate_steps(self.path, step)
        self._fh = self.path.open("a", encoding="utf-8")
        if self._bar is not None:
            self._bar.n = step
            self._bar.refresh()

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A sample of trajectories (memrl.training.monitor.dump rows) to the trackers that keep tables."""
        self._to_trackers("table", step, rows)

    def _to_trackers(self, method: str, step: int, data: Any) -> None:
        """Call each tracker; one that fails (a store gone, a full disk, a server down) is logged and
        dropped: metrics.jsonl keeps every step, and the run goes on."""
        for t in list(self.trackers):
            try:
                getattr(t, method)(step, data)
            except Exception as e:  # noqa: BLE001 - whatever the tracker library raises
                self.trackers.remove(t)
                first = (str(e).strip().splitlines() or [""])[0][:300]
                log.warning("tracker %s failed at step %d (%s: %s); dropped for the rest of the run, %s keeps "
                            "every step", getattr(t, "name", type(t).__name__), step, type(e).__name__, first,
                            self.path)

    def close(self) -> None:
        for t in self.trackers:
            try:
                t.close()
            except Exception as e:  # noqa: BLE001 - a tracker that fails to close loses nothing of metrics.jsonl
                log.warning("tracker %s failed to close (%s: %s)", getattr(t, "name", type(t).__name__),
                            type(e).__name__, (str(e).strip().splitlines() or [""])[0][:300])
        self._fh.close()
        if self._tb is not None:
            self._tb.close()
        if self._bar is not None:
            self._bar.close()


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """All rows of a metrics.jsonl."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def truncate_steps(path: str | os.PathLike, keep_until: int) -> int:
    """Drop rows with step > keep_until (and a half-written line) from a JSONL file of `{"step": k, ...}`
    rows (metrics.jsonl, trajectories.jsonl); returns how many. A resumed run redoes those steps.

    The file is rewritten through a temporary sibling and os.replace, so a kill here loses nothing.
    """
    p = Path(path)
    if not p.is_file():
        return 0
    kept, dropped = [], 0
    for line in p.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            step = json.loads(line).get("step", 0)
        except (ValueError, AttributeError):  # cut off by a kill mid-write
            dropped += 1
            continue
        if isinstance(step, int | float) and step > keep_until:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, p)
    return dropped
