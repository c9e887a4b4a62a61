"""A run directory as the viewer reads it: a byte-offset index over its rows, loaded on demand.

Eval runs hold results.jsonl (one row per question), training runs trajectories.jsonl (the dump of
memrl.training.monitor.dump) and metrics.jsonl. Only a small summary per row stays in memory; a trajectory is
read from disk by its offset when asked for. The index grows when the file does (a live run).
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.errors import UserError
from memrl.rewards.steps import answer_word_recall

log = logging.getLogger(__name__)

RESULTS = "results.jsonl"
DUMPS = "trajectories.jsonl"
METRICS = "metrics.jsonl"
MAX_POINTS = 400
"""Points per training curve sent to the page (evenly thinned)."""


class ViewerError(UserError):
    """Bad input for the viewer (missing directory, unknown row, bad parameter); the message says which."""


@dataclass
class Entry:
    """What the question list needs of one row, plus where the row lies in its file."""

    offset: int
    length: int
    key: str
    task_id: str
    size: int
    """The row's length axis: num_docs (eval) or the number of chunks (training)."""
    correct: bool
    workflow: str
    question: str
    prediction: str
    calls: int
    step: int | None = None
    score: float = 0.0

    def public(self, idx: int) -> dict[str, Any]:
        return {"idx": idx, "key": self.key, "task_id": self.task_id, "length": self.size,
                "correct": self.correct, "workflow": self.workflow, "question": self.question[:300],
                "prediction": self.prediction[:200], "calls": self.calls, "step": self.step,
                "score": self.score}


_STEPS_KEYS = (b', "steps": ', b',"steps":')


def _head(line: bytes) -> dict[str, Any]:
    """A row without its `steps` (the last key of eval rows and dumps, and the bulk of them), parsed
    from the bytes before it; the whole line when that fails. A quote inside a JSON string is escaped,
    so `"steps":` with a bare quote is a key."""
    for k in _STEPS_KEYS:
        pos = line.find(k)
        if pos > 0:
            try:
                out = json.loads(line[:pos] + b"}")
                if isinstance(out, dict):
                    return out
            except ValueError:
                break
    out = json.loads(line)
    if not isinstance(out, dict):
        raise ValueError("not a JSON object")
    return out


def _number(r: dict[str, Any], key: str, kind: type) -> Any:
    """r[key] as int or float; a bool, string or null is a wrong type, named."""
    v = r.get(key, 0)
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ValueError(f"{key!r} must be a number, got {v!r}")
    return kind(v)


def _load_json(path: Path) -> dict[str, Any]:
    try:
        out = json.loads(path.read_text(encoding="utf-8"))
        return out if isinstance(out, dict) else {}
    except (OSError, json.JSONDecodeError):
        return {}


@dataclass
class Run:
    """One run directory; thread-safe (the server answers requests on several threads)."""

    path: Path
    kind: str = ""
    name: str = ""
    workflow: str = ""
    entries: list[Entry] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    _end: int = 0
    _tail_warned: int = -1
    skipped: int = 0
    """Complete lines that are not usable rows (each also named in `warnings`)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def open(cls, path: str | Path) -> Run:
        """The run at `path`; a clear error when it is missing or holds nothing the viewer can show."""
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"run directory {p} does not exist")
        if not p.is_dir():
            raise ViewerError(f"{p} is not a directory (give an eval --out or a training out_dir)")
        if not any((p / f).exists() for f in (RESULTS, DUMPS, METRICS)):
            raise ViewerError(f"{p} holds no {RESULTS}, {DUMPS} or {METRICS}; "
                              "is it an eval or training output directory?")
        run = cls(p)
        run.kind = "eval" if (p / RESULTS).exists() else "train"
        cfg = _load_json(p / "eval_config.json")
        run.name = str(cfg.get("name") or p.resolve().name)
        run.workflow = str(cfg.get("workflow", ""))
        run.refresh()
        return run

    @property
    def rows_path(self) -> Path:
        return self.path / (RESULTS if self.kind == "eval" else DUMPS)

    # ------------------------------------------------------------ index
    def refresh(self) -> None:
        """Index the complete lines appended since the last call (streamed); a half-written last line waits."""
        with self._lock:
            p = self.rows_path
            if not p.exists():
                return
            tail = 0
            with open(p, "rb") as f:
                f.seek(self._end)
                pos = self._end
                for line in f:
                    if not line.endswith(b"\n"):
                        tail = len(line)
                        break
                    if line.strip():
                        self._add(line[:-1], pos)
                    pos += len(line)
            self._end = pos
            if tail and tail != self._tail_warned:
                self.warnings.append(f"{p}: the last line ({tail} bytes) is incomplete (a running or "
                                     "killed run); it is left out")
                self._tail_warned = tail

    def _add(self, line: bytes, offset: int) -> None:
        lineno = len(self.entries) + self.skipped + 1
        try:
            r = _head(line)
            entry = self._entry(r, offset, len(line), lineno)
        except (ValueError, TypeError) as e:
            self.skipped += 1
            self.warnings.append(f"{self.rows_path}: the line at byte {offset} is not a usable row ({e}); skipped")
            log.warning("view: %s: the line at byte %d is not a usable row (%s); skipped", self.rows_path, offset, e)
            return
        self.entries.append(entry)

    def _entry(self, r: dict[str, Any], offset: int, length: int, lineno: int) -> Entry:
        """One row's index entry; ValueError/TypeError naming the field when a field the list needs is
        missing or of the wrong type (such a row must not count as a wrong answer)."""
        m = r.get("metrics") or {}
        if not isinstance(m, dict):
            raise ValueError(f"metrics must be an object, got {type(m).__name__}")
        if self.kind == "eval":
            for k in ("task_id", "num_docs", "sub_em"):
                if k not in r:
                    raise ValueError(f"it has no {k!r}")
            size = _number(r, "num_docs", int)
            key = f"{size}/{r.get('task_id', lineno)}"
            score = _number(r, "sub_em", float)
            step = None
        else:
            size = int(_number(m, "num_chunks", int) if "num_chunks" in m else _number(r, "model_calls", int))
            key = f"{r.get('step', 0)}/{r.get('trajectory_id', lineno)}"
            score = _number(r, "reward", float) if r.get("reward") is not None else 0.0
            step = _number(r, "step", int) if r.get("step") is not None else 0
        return Entry(
            offset=offset, length=length, key=key, task_id=str(r.get("task_id", "")), size=size,
            correct=score > 0 if self.kind == "train" else score >= 1.0,
            workflow=str(r.get("workflow") or self.workflow), question=str(r.get("question", "")),
            prediction=str(r.get("prediction", "")),
            calls=_number(r, "model_calls", int) if r.get("model_calls") is not None else 0,
            step=step, score=score,
        )

    # ------------------------------------------------------------ queries
    def questions(self, offset: int = 0, limit: int = 50, correct: str = "", length: str = "",
                  workflow: str = "", q: str = "") -> dict[str, Any]:
        """One page of the (filtered) question list, plus the filter choices."""
        self.refresh()
        if correct not in ("", "correct", "wrong"):
            raise ViewerError(f"correct must be 'correct' or 'wrong', got {correct!r}")
        want_len = None
        if length:
            try:
                want_len = int(length)
            except ValueError as e:
                raise ViewerError(f"length must be an integer, got {length!r}") from e
        needle = q.strip().lower()
        hits = []
        for i, e in enumerate(self.entries):
            if correct and e.correct != (correct == "correct"):
                continue
            if want_len is not None and e.size != want_len:
                continue
            if workflow and e.workflow != workflow:
                continue
            if needle and needle not in e.question.lower() and needle not in e.task_id.lower() \
                    and needle not in e.prediction.lower():
                continue
            hits.append(i)
        page = hits[offset: offset + limit]
        return {"total": len(hits), "offset": offset, "limit": limit,
                "items": [self.entries[i].public(i) for i in page],
                "lengths": sorted({e.size for e in self.entries}),
                "workflows": sorted({e.workflow for e in self.entries if e.workflow})}

    def raw_row(self, idx: int) -> dict[str, Any]:
        self.refresh()
        if not 0 <= idx < len(self.entries):
            raise ViewerError(f"{self.name}: no row {idx} (the run has {len(self.entries)})")
        e = self.entries[idx]
        with open(self.rows_path, "rb") as f:
            f.seek(e.offset)
            data = f.read(e.length)
        try:
            return json.loads(data)
        except ValueError as err:
            raise ViewerError(f"{self.rows_path}: the row at byte {e.offset} ({e.key}) is not valid JSON "
                              f"({err}); was the file edited?") from err

    def row(self, idx: int) -> dict[str, Any]:
        """Row `idx` for the page: chunk texts left out (fetched on expand), memory diffs and gold marks added."""
        r = self.raw_row(idx)
        r["idx"] = idx
        r["key"] = self.entries[idx].key
        r["correct"] = self.entries[idx].correct
        r["steps"] = annotate_steps(r.get("steps") or [], r.get("answers") or [])
        return r

    def chunk(self, idx: int, step: int) -> str:
        steps = self.raw_row(idx).get("steps") or []
        if not 0 <= step < len(steps):
            raise ViewerError(f"{self.name}: row {idx} has no step {step} (it has {len(steps)})")
        return str((steps[step].get("info") or {}).get("chunk", ""))

    def find(self, key: str) -> int | None:
        self.refresh()
        for i, e in enumerate(self.entries):
            if e.key == key:
                return i
        return None

    def summary(self) -> dict[str, Any]:
        """Accuracy by length, the training metric names, warnings."""
        self.refresh()
        by: dict[int, list[Entry]] = {}
        for e in self.entries:
            by.setdefault(e.size, []).append(e)
        acc = [{"length": n, "questions": len(es), "accuracy": 100 * sum(e.correct for e in es) / len(es)}
               for n, es in sorted(by.items())]
        metric_names = sorted({k for r in self._metrics_rows() for k in r if k != "step"})
        workflow = self.workflow or ", ".join(sorted({e.workflow for e in self.entries if e.workflow}))
        return {"name": self.name, "kind": self.kind, "path": str(self.path), "workflow": workflow,
                "rows": len(self.entries), "skipped_rows": self.skipped, "accuracy_by_length": acc, "metric_names": metric_names,
                "has_plot": (self.path / "accuracy.png").exists(), "warnings": list(self.warnings)}

    def _metrics_rows(self) -> list[dict[str, Any]]:
        p = self.path / METRICS
        if not p.exists():
            return []
        out = []
        for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a half-written last line of a live run
            if isinstance(r, dict):
                out.append(r)
        return out

    def metrics(self, names: list[str]) -> dict[str, list[list[float]]]:
        """(step, value) series of the named metrics, thinned to at most MAX_POINTS each."""
        rows = self._metrics_rows()
        out: dict[str, list[list[float]]] = {}
        for n in names:
            pts = [[float(r.get("step", i + 1)), float(r[n])] for i, r in enumerate(rows)
                   if isinstance(r.get(n), int | float)]
            if len(pts) > MAX_POINTS:
                stride = len(pts) / MAX_POINTS
                pts = [pts[int(i * stride)] for i in range(MAX_POINTS - 1)] + [pts[-1]]
            out[n] = pts
        return out


# ---------------------------------------------------------------- per-step annotations

_WORDS = re.compile(r"\w+\s*|[^\w\s]+\s*|\s+")
"""Words and punctuation runs with their trailing whitespace: a replaced phrase is one change."""


def word_diff(old: str, new: str) -> list[list[str]]:
    """Word-level diff of two memories: [op, text] with op '=' kept, '-' deleted, '+' inserted."""
    a, b = _WORDS.findall(old), _WORDS.findall(new)
    ops: list[list[str]] = []

    def put(op: str, text: str) -> None:
        if ops and ops[-1][0] == op:
            ops[-1][1] += text
        elif text:
            ops.append([op, text])

    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "equal":
            put("=", "".join(a[i1:i2]))
            continue
        put("-", "".join(a[i1:i2]))
        put("+", "".join(b[j1:j2]))
    return ops


def annotate_steps(steps: list[dict[str, Any]], answers: list[str]) -> list[dict[str, Any]]:
    """Each step gets `memory_diff` (vs the memory before it), `gold_in_memory` and `gold_event`
    ('appeared' / 'left': the answer's words all in the memory, as memrl.rewards.steps.answer_word_recall
    == 1, i.e. the `answer_seen` metric); chunk texts are replaced by `chunk_chars`."""
    before: bool | None = None
    prev_mem: str | None = None
    for s in steps:
        info = s.get("info") or {}
        if "chunk" in info:
            info["chunk_chars"] = len(str(info.pop("chunk") or ""))
        mem = info.get("memory")
        s["gold_event"] = None
        if not isinstance(mem, str) or s.get("kind") == "final":
            continue
        old = info.get("previous_memory")
        old = old if isinstance(old, str) else (prev_mem or "")
        s["memory_diff"] = word_diff(old, mem)
        hit = bool(answers) and answer_word_recall(mem, answers) >= 1.0
        s["gold_in_memory"] = hit
        if hit and not before:
            s["gold_event"] = "appeared"
        elif before and not hit:
            s["gold_event"] = "left"
        before, prev_mem = hit, mem
    return steps
