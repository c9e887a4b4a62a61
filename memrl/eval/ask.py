"""Run a (trained) memory agent over a user's own document: `memrl ask` and `memrl.eval.ask.ask`.

  memrl ask --model runs/train/checkpoints/step_000100 --file report.txt --question "Who signed it?" \\
      [--workflow memagent|rememr1] [--show-memory] [workflow.chunk_tokens=512 ...]

One question, one trajectory, greedy unless workflow.temperature says otherwise, through the same engine
and workflow config as `memrl eval` (dotted overrides of memrl.eval.runner.EvalConfig). The answer is the
workflow's prediction (the last \\boxed{} of the final reply); a reply without one gives the reply itself,
said so.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memrl.config import load_config
from memrl.data.checks import bad_text
from memrl.errors import UsageError, UserError
from memrl.eval.runner import EvalConfig, make_eval_engine, workflow_config
from memrl.runtime import RolloutRuntime
from memrl.threads import apply as set_threads
from memrl.types import Segment, Task
from memrl.workflows import DEFAULT_WORKFLOW, ask_workflows
from memrl.workflows.chunked import READING

ASK_WORKFLOWS = ask_workflows()
"""The workflows `memrl ask` runs: those whose WorkflowSpec says `ask` (they read chunk by chunk and keep a
memory)."""
MAX_FILE_BYTES = 256 << 20
"""The largest document read (256 MiB of text is far past any context a memory agent is run on here)."""


@dataclass
class AskResult:
    """What the agent said and what it kept."""

    answer: str
    """The prediction (the final reply's last \\boxed{}), or the whole final reply when it boxed nothing."""
    boxed: bool
    """Whether the final reply had a \\boxed{} answer."""
    final_text: str
    memories: list[str] = field(default_factory=list)
    """The memory after each chunk, in reading order."""
    recalls: list[str] = field(default_factory=list)
    """The recall query of each step ("" where none), for a workflow that recalls (its spec's recall_key);
    empty otherwise."""
    model_calls: int = 0
    seconds: float = 0.0


def read_document(path: str | Path) -> str:
    """The text of `path` (UTF-8), or UserError naming the file."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"--file {p}: no such file" if not p.exists() else f"--file {p} is not a regular file")
    size = p.stat().st_size
    if size > MAX_FILE_BYTES:
        raise UserError(f"--file {p}: {size:,} bytes, over the {MAX_FILE_BYTES:,} memrl ask reads")
    raw = p.read_bytes()
    if b"\0" in raw[:65536]:
        raise UserError(f"--file {p} looks binary (it holds NUL bytes); give a text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"--file {p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    if not text.strip():
        raise UserError(f"--file {p} is empty")
    return text


MODEL_KEYS = ("engine.model", "model.path", "model")
"""Override keys that would name another model than --model (the last two are not EvalConfig keys: refused
here, with the reason, rather than as unknown keys)."""
WORKFLOW_KEYS = ("workflow", "workflow.name")
"""Override keys that would choose another workflow than --workflow."""


def check_overrides(overrides: list[str] | tuple[str, ...]) -> None:
    """UsageError for an override that contradicts --model or --workflow: `engine.model=` (or `model.path=`)
    would silently answer with another model than --model, and `workflow.name=` (or `workflow=`) would run a
    workflow --workflow does not offer; both are chosen with their flags only."""
    for ov in overrides:
        key = ov.split("=", 1)[0].strip().lstrip("+")
        if key in MODEL_KEYS:
            raise UsageError(f"override {key}=...: memrl ask takes the model from --model only; drop the override "
                             "and give the directory as --model")
        if key in WORKFLOW_KEYS:
            raise UsageError(f"override {key}=...: memrl ask takes the workflow from --workflow only "
                             f"({' or '.join(ASK_WORKFLOWS)}); drop the override")


class _Reading:
    """The chunked loop's observer (memrl.workflows.chunked.READING) for one question: a progress bar over the
    chunks on stderr (tqdm: chunks done, rate, time left), and each memory handed to `on_memory` as it is
    written."""

    def __init__(self, progress: bool, on_memory: Callable[[int, str, str], None] | None, recall_key: str | None):
        self.bar: Any = None
        self.progress = progress
        self.on_memory = on_memory
        self.recall_key = recall_key
        self.done = 0

    def chunks(self, n: int) -> None:
        if self.progress and self.bar is None:
            self.bar = tqdm(total=n, unit="chunk", desc="reading", file=sys.stderr, dynamic_ncols=True)

    def segment(self, seg: Segment) -> None:
        if seg.info.get("kind") != "memory":
            return
        self.done += 1
        if self.on_memory is not None:
            recall = str(seg.info.get(self.recall_key) or "") if self.recall_key else ""
            if self.bar is not None:
                self.bar.clear()  # the bar is redrawn below the memory, not torn through it
            self.on_memory(self.done, str(seg.info.get("memory", "")), recall)
        if self.bar is not None:
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def ask(model: str | Path, text: str, question: str, workflow: str = DEFAULT_WORKFLOW,
        overrides: list[str] | tuple[str, ...] = (), apply_threads: bool = False, progress: bool = False,
        on_memory: Callable[[int, str, str], None] | None = None) -> AskResult:
    """Run `workflow` (one of ASK_WORKFLOWS) of the model directory `model` over `text` for `question`.
    `apply_threads`: set this process's torch threads from the config's `threads` section (memrl.threads), as
    `memrl ask` does; a Python caller keeps its own thread setting unless it asks for that. `progress`: a
    progress bar over the chunks on stderr. `on_memory(i, memory, recall)`: called with each memory as it is
    written (chunk i, from 1; the step's recall query or "")."""
    if workflow not in ASK_WORKFLOWS:
        raise UserError(f"workflow {workflow!r}: memrl ask runs {' or '.join(ASK_WORKFLOWS)}")
    if not question.strip():
        raise UserError("--question is empty")
    bad = bad_text(question)  # bytes that are not UTF-8 on the command line arrive as lone surrogates
    if bad is not None:
        raise UserError(f"--question is not valid UTF-8 text: it holds {bad}")
    if not text.strip():
        raise UserError("the document is empty")
    check_overrides(overrides)
    cfg = load_config(EvalConfig, [f"engine.model={model}", f"workflow.name={workflow}", *overrides])
    if apply_threads:
        set_threads(cfg.threads)
    spec, wf_cfg = workflow_config(cfg)
    task = Task(task_id="ask", question=question, context=text, answers=[])
    t0 = time.perf_counter()
    engine = make_eval_engine(cfg.engine)
    reading = _Reading(progress, on_memory, spec.recall_key)
    token = READING.set(reading)  # before the runtime's loop copies this context
    try:
        with RolloutRuntime(engine, spec, wf_cfg, concurrency=1) as rt:
            traj = rt.sample([task], 1, cfg.seed)[0].trajectories[0]
    finally:
        READING.reset(token)
        reading.close()
    segs = traj.segments
    final = str(traj.info.get("answer_text", ""))
    boxed = bool(traj.final_answer)
    mem = [s for s in segs if s.info.get("kind") == "memory"]
    key = spec.recall_key
    return AskResult(answer=traj.final_answer if boxed else final.strip(), boxed=boxed, final_text=final,
                     memories=[str(s.info.get("memory", "")) for s in mem],
                     recalls=[str(s.info.get(key) or "") for s in mem] if key else [],
                     model_calls=len(segs), seconds=time.perf_counter() - t0)


def render_memory(i: int, memory: str, recall: str = "") -> str:
    """One memory as `memrl ask --show-memory` prints it (as soon as it is written)."""
    rec = f"  (recall: {recall})" if recall else ""
    return "\n".join([f"memory after chunk {i}{rec}:", *("  " + ln for ln in (memory.splitlines() or [""]))])


def render(res: AskResult, show_memory: bool, streamed: bool = False) -> str:
    """What `memrl ask` prints at the end; `streamed`: the memories were printed as they were written
    (render_memory), so only the final reply follows them."""
    lines: list[str] = []
    if show_memory:
        if not streamed:
            lines.extend(render_memory(i, m, res.recalls[i - 1] if res.recalls else "")
                         for i, m in enumerate(res.memories, 1))
        lines.append("final reply:")
        lines.extend("  " + ln for ln in (res.final_text.splitlines() or [""]))
    lines.append(f"answer: {res.answer}" if res.boxed else f"answer (no \\boxed{{}} in the reply; the reply): {res.answer}")
    lines.append(f"({len(res.memories)} chunks, {res.model_calls} model calls, {res.seconds:.1f} s)")
    return "\n".join(lines)


