"""Evaluate a workflow through an engine on eval files: one JSONL row per question, resumable.

    rows = evaluate(files, out_dir, EvalConfig(workflow={"name": "memagent"}, engine=EngineConfig(model="m/")))

Rows go to `<out_dir>/results.jsonl` as each question finishes. A re-run skips the (num_docs, task_id)
pairs already there; a half-written last line (a killed run) is cut off and that question re-run.
Row metrics use memrl.rewards.qa on the prediction: em, sub_em (MemAgent's "accuracy"), f1; a MemAct
row (multi-question reward metrics present) has em = sub_em = all sub-questions right, f1 = their mean F1.
Scoring (`golds`, `extract`; docs/eval_scoring.md): the prediction is the last \\boxed{} (extract=boxed),
the text after the last "the answer is" (answer_is, MemAgent's protocol) or the whole final text (raw),
scored against the best of all gold answers (golds=any) or answers[0] only (golds=first, as the public
evaluations do). A task whose meta["metric"] names a registered eval metric (memrl.rewards.eval_metrics:
RULER's string_match_all / string_match_part) also gets that metric under its name, over all answers.
`reward` is the workflow's outcome reward (awaited when async; a failing one counts reward_error, 0).
Timing: `seconds` is one question's latency (queueing in the engine included); `started`/`finished` and
`session` let the report compute throughput time per question (wall span of a session / its questions).

`workflow=full_context` is the baseline (memrl.workflows.full_context): the whole document in one prompt,
centre-truncated to `workflow.max_context_tokens`, answered in `\\boxed{}`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.config import redact_secrets
from memrl.engines.config import EngineConfig, HFSection
from memrl.errors import UserError, model_dir, writable_dir
from memrl.types import Task, Trajectory
from memrl.workflows.full_context import FULL_CONTEXT_TEMPLATE, FullContextConfig  # noqa: F401 - re-exported
from memrl.workflows.full_context import run as run_full_context  # noqa: F401 - re-exported

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "eval_config.json"
FULL_CONTEXT = "full_context"

@dataclass
class EvalConfig:
    """One evaluation run: `memrl eval` overrides, spelled as in `memrl train` (workflow.*, engine.*)."""

    workflow: dict[str, Any] = field(default_factory=lambda: {"name": "memagent"})
    """A registered workflow (`name`: memagent, rememr1, full_context = the baseline, ...) and its config
    fields (workflow.chunk_tokens=5000); greedy decoding unless workflow.temperature is given."""
    engine: EngineConfig = field(
        default_factory=lambda: EngineConfig(max_batch_size=16, hf=HFSection(deterministic=False)))
    """The engine (memrl.engines.config): `engine.model` is the model directory (--model)."""
    limit: int = 0
    """Questions per file (the first ones); 0 = all."""
    concurrency: int = 16
    """Questions in flight at once (their model calls batch in the engine)."""
    seed: int = 0
    """Seed of the per-question RNGs (only matters when sampling)."""
    name: str = ""
    """Run name in tables and plots (default: the output directory's name)."""
    progress: bool = True
    golds: str = "any"
    """Which gold answers a prediction is scored against: any = the best over all of them (memrl);
    first = answers[0] only (MemAgent's, ReMemR1's and vime's evaluations)."""
    extract: str = "boxed"
    """How the prediction is read from the final text (memrl.rewards.extract): boxed = the last \\boxed{};
    answer_is = the text after the last "the answer is" (MemAgent's protocol for its RL models);
    boxed_published = the published evaluations' box reader (also `\\boxed ans`); boxed_last300 = that
    reader over the last 300 characters only (vime's evaluation); raw = the whole text."""
    metric_rules: str = "memrl"
    """How em / sub_em / f1 score a prediction (memrl.rewards.published_metrics): memrl (memrl.rewards.qa);
    memagent = MemAgent's and ReMemR1's evaluations (ASCII punctuation only, an empty prediction scores
    0, each score rounded to 2 decimals per question); vime = vime's (an empty prediction has sub_em 1,
    no yes/no rule in f1)."""
    requires_templates: bool = False
    """True (the *_eval_official presets): the run needs the user's prompt files,
    workflow.memory_template_file and workflow.final_template_file (or the inline memory_template /
    final_template); a config without them is a one-line error naming the missing key (memrl ships no
    published prompt text)."""

    def __post_init__(self) -> None:
        from memrl.rewards.extract import EXTRACT_MODES
        from memrl.rewards.published_metrics import METRIC_RULES

        if self.golds not in GOLDS_MODES:
            raise ValueError(f"golds must be one of {', '.join(GOLDS_MODES)}, got {self.golds!r}")
        if self.extract not in EXTRACT_MODES:
            raise ValueError(f"extract must be one of {', '.join(EXTRACT_MODES)}, got {self.extract!r}")
        if self.metric_rules not in METRIC_RULES:
            raise ValueError(f"metric_rules must be one of {', '.join(METRIC_RULES)}, got {self.metric_rules!r}")
        if self.requires_templates:
            # a file, or the same text given inline (workflow.memory_template=...)
            missing = [k for k in TEMPLATE_FILE_KEYS
                       if not self.workflow.get(k) and not self.workflow.get(k.removesuffix("_file"))]
            if missing:
                raise ValueError(
                    f"{', '.join('workflow.' + k for k in missing)} must be set: this config has "
                    "requires_templates=true (a published-eval preset); save the published prompts to files "
                    "and pass workflow.memory_template_file=PATH workflow.final_template_file=PATH")


GOLDS_MODES = ("any", "first")
TEMPLATE_FILE_KEYS = ("memory_template_file", "final_template_file")
"""The workflow keys a requires_templates config must set (the user's copies of the published prompts)."""


def get_spec(name: str):
    """The WorkflowSpec of a registered workflow (full_context, the baseline, is one)."""
    from memrl.config import ConfigError
    from memrl.workflows import get_workflow

    try:
        return get_workflow(name)
    except KeyError as e:
        raise ConfigError(f"workflow: {e.args[0]}") from e


def workflow_config(cfg: EvalConfig) -> tuple[Any, Any]:
    """(spec, config) of `cfg.workflow`: the workflow's defaults, greedy decoding for evaluation, then
    the section's fields."""
    from memrl.workflows import parse_workflow

    return parse_workflow(cfg.workflow, defaults={"temperature": 0.0, "no_prune_prob": 0.0})


# ---------------------------------------------------------------- engines


def make_eval_engine(sec: EngineConfig) -> Any:
    """The engine `sec` names (memrl.engines.build_engine), after checking the model directory exists."""
    from memrl.engines import build_engine

    if not sec.model:
        raise UserError("eval: engine.model is empty; pass --model DIR (or engine.model=DIR)")
    if sec.name != "openai":
        model_dir(sec.model, "--model")
    return build_engine(sec)


# ---------------------------------------------------------------- results file


def read_results(path: str | os.PathLike[str], repair: bool = False) -> list[dict[str, Any]]:
    """Rows of a results.jsonl. A last line cut off by a kill is dropped (and cut from the file if repair).

    A malformed line elsewhere is an error naming the file and line.
    """
    p = Path(path)
    if not p.exists():
        return []
    data = p.read_bytes()
    end = data.rfind(b"\n") + 1
    rows = []
    for lineno, line in enumerate(data[:end].splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise UserError(f"{p}: line {lineno} is not valid JSON ({e.msg}); fix or remove it") from e
    tail = data[end:]
    if tail.strip():
        try:  # a complete last row that only lacks its newline
            rows.append(json.loads(tail))
            if repair:
                with open(p, "ab") as f:
                    f.write(b"\n")
        except json.JSONDecodeError:
            log.warning("%s: dropping a half-written last line (%d bytes) from an interrupted run", p, len(tail))
            if repair:
                with open(p, "r+b") as f:
                    f.truncate(end)
    return rows


def num_docs_of(path: str, tasks: Sequence[Task]) -> int:
    """A file's document count: the rows' num_docs, else the N of an eval_{N} file name, else 0."""
    vals = {t.meta.get("num_docs") for t in tasks}
    if len(vals) == 1 and isinstance(next(iter(vals)), int):
        return int(next(iter(vals)))
    m = re.search(r"eval_(\d+)", Path(path).name)
    return int(m.group(1)) if m else 0


def score_prediction(task: Task, traj: Trajectory, golds: str = "any", extract: str = "boxed",
                     metric_rules: str = "memrl") -> tuple[str, dict[str, float]]:
    """(prediction, metrics) of a finished question: em / sub_em / f1 of the prediction `extract` reads,
    against all gold answers (golds=any, best of them) or answers[0] (first); plus the eval metric the
    task's meta["metric"] names, over all answers. A MemAct row keeps its own final answer. em / sub_em /
    f1 follow `metric_rules` (memrl, or a published evaluation's: memrl.rewards.published_metrics)."""
    from memrl.rewards.eval_metrics import get_metric
    from memrl.rewards.extract import extract_prediction
    from memrl.rewards.published_metrics import published_qa_metrics, published_task_metric
    from memrl.rewards.qa import qa_metrics

    if extract == "boxed" or "answer_text" not in traj.info or "multiq_questions" in traj.metrics:
        pred = traj.final_answer or ""
    else:
        pred = extract_prediction(traj.info["answer_text"], extract)
    answers = task.answers if golds == "any" else task.answers[:1]
    m = qa_metrics(pred, answers) if metric_rules == "memrl" else published_qa_metrics(pred, answers, metric_rules)
    name = task.meta.get("metric")
    if name:
        try:
            fn = get_metric(str(name))
        except KeyError as e:
            raise UserError(f"task {task.task_id}: meta['metric']: {e.args[0]}") from e
        m[str(name)] = published_task_metric(fn(pred, task.answers), pred, metric_rules)
    return pred, m


def result_row(
    task: Task, traj: Trajectory, num_docs: int, file: str, started: float, finished: float, session: str = "",
    tokenizer: Any = None, golds: str = "any", extract: str = "boxed", metric_rules: str = "memrl",
) -> dict[str, Any]:
    """The JSONL row of one finished question; started/finished are wall-clock times (time.time()).
    `steps` holds one memrl.records record per model call (what `memrl view` shows). Scoring:
    `score_prediction`; a task's named eval metric (meta["metric"]) is a column of its own."""
    from memrl.records import segment_records

    pred, m = score_prediction(task, traj, golds, extract, metric_rules)
    extra = {k: v for k, v in m.items() if k not in ("em", "sub_em", "f1")}
    tm = traj.metrics
    if "multiq_questions" in tm:  # MemAct: all sub-questions right (memrl.rewards.multiq), mean sub-question F1
        m = {"em": tm["multiq_all_correct"], "sub_em": tm["multiq_all_correct"], "f1": tm["multiq_f1_mean"]}
    memories = traj.info.get("memories")
    if memories is None:
        memories = [s.info["memory"] for s in traj.segments if s.info.get("kind") != "final" and "memory" in s.info]
    return {
        "task_id": task.task_id,
        "num_docs": num_docs,
        "file": Path(file).name,
        "question": task.question,
        "answers": task.answers,
        "prediction": pred,
        "answer_text": traj.info.get("answer_text", ""),
        "memory_trace": list(memories),
        "em": m["em"],
        "sub_em": m["sub_em"],
        "f1": m["f1"],
        **extra,
        "tokens_read": int(tm.get("tokens_read", tm.get("context_tokens", 0))),
        "context_tokens": int(tm.get("context_tokens", 0)),
        # MemAct rows also hold tool output; their own count is what the model generated
        "generated_tokens": int(tm.get("generated_tokens", 0) if "multiq_questions" in tm
                                else sum(len(s.response_ids) for s in traj.segments)),
        "model_calls": len(traj.segments),
        "reward": traj.reward,
        "seconds": round(finished - started, 4),
        "started": round(started, 4),
        "finished": round(finished, 4),
        "session": session,
        "metrics": {k: float(v) for k, v in tm.items()},
        "steps": segment_records(traj.segments, tokenizer),
    }


# ---------------------------------------------------------------- the run


def _check_config(out: Path, record: dict[str, Any]) -> None:
    """Refuse to resume into a directory made with another workflow, model or workflow config."""
    p = out / CONFIG_FILE
    if p.exists():
        old = json.loads(p.read_text())
        keys = ("workflow", "model", "workflow_config", "scoring")
        # directories written before scoring options existed were scored with today's defaults
        old.setdefault("scoring", {"golds": "any", "extract": "boxed"})
        diff = [k for k in keys if old.get(k) != record.get(k)]
        if diff and (out / RESULTS_FILE).exists():
            raise UserError(
                f"{out} holds results of a different run ({', '.join(diff)} differ from {p}); "
                "use another --out directory or delete it"
            )
    p.write_text(json.dumps(record, indent=1, default=str) + "\n")


def evaluate(
    files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    cfg: EvalConfig,
    engine: Any = None,
) -> list[dict[str, Any]]:
    """Evaluate every file (smallest N first) into out_dir/results.jsonl; returns all rows, old and new.

    `engine` may be passed in (tests, notebooks); otherwise it is built from cfg.engine and closed after.
    """
    from memrl.data.io import load_tasks

    out = writable_dir(out_dir, "--out")
    spec, wf_cfg = workflow_config(cfg)
    record = {"workflow": spec.name, "model": cfg.engine.model, "engine": dataclasses.asdict(cfg.engine),
              "workflow_config": dataclasses.asdict(wf_cfg), "files": [str(f) for f in files],
              "name": cfg.name or out.resolve().name, "seed": cfg.seed,
              "scoring": {"golds": cfg.golds, "extract": cfg.extract,
                          # only when set, so directories from before the option still resume
                          **({"metric_rules": cfg.metric_rules} if cfg.metric_rules != "memrl" else {})}}
    _check_config(out, redact_secrets(record))  # api keys never reach the disk

    loaded = []
    for f in files:
        tasks = load_tasks(f)
        if cfg.limit:
            tasks = tasks[: cfg.limit]
        loaded.append((num_docs_of(str(f), tasks), str(f), tasks))
    loaded.sort(key=lambda x: x[0])

    results_path = out / RESULTS_FILE
    rows = read_results(results_path, repair=True)
    done = {(r["num_docs"], r["task_id"]) for r in rows}
    todo = [(n, f, [t for t in ts if (n, t.task_id) not in done]) for n, f, ts in loaded]
    total = sum(len(ts) for _, _, ts in todo)
    if rows:
        log.info("%s: %d rows already done, %d to go", results_path, len(rows), total)
    if total == 0:
        return rows

    own_engine = engine is None
    if own_engine:
        engine = make_eval_engine(cfg.engine)
    try:
        with open(results_path, "a", encoding="utf-8") as fh:
            rows += asyncio.run(_run_all(todo, spec, wf_cfg, engine, cfg, fh, total))
    finally:
        if own_engine:
            asyncio.run(engine.close())
    return rows


async def _run_all(todo, spec, wf_cfg, engine, cfg: EvalConfig, fh, total: int) -> list[dict[str, Any]]:
    from tqdm import tqdm

    from memrl.workflows.runner import rollout

    new: list[dict[str, Any]] = []
    bar = tqdm(total=total, unit="q", disable=not cfg.progress, dynamic_ncols=True)
    starts: dict[str, float] = {}
    session = f"{int(time.time())}-{os.getpid()}"

    async def timed(task: Task, eng: Any, c: Any, rng: random.Random) -> Trajectory:
        starts[task.task_id] = time.time()
        return await spec.run(task, eng, c, rng)

    timed_spec = dataclasses.replace(spec, run=timed)
    try:
        for n, f, tasks in todo:
            if not tasks:
                continue
            bar.set_description(f"N={n}")
            acc: list[float] = []

            def on_done(task: Task, traj: Trajectory, n: int = n, f: str = f, acc: list[float] = acc) -> None:
                row = result_row(task, traj, n, f, starts.pop(task.task_id), time.time(), session,
                                 tokenizer=getattr(engine, "tokenizer", None), golds=cfg.golds, extract=cfg.extract,
                                 metric_rules=cfg.metric_rules)
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                new.append(row)
                acc.append(row["sub_em"])
                bar.set_postfix(acc=f"{100 * sum(acc) / len(acc):.1f}%", refresh=False)
                bar.update(1)

            await rollout(tasks, timed_spec, engine, wf_cfg, n=1, concurrency=cfg.concurrency, seed=cfg.seed,
                          on_done=on_done, score=True)
    finally:
        bar.close()
    return new
