"""Evaluate a workflow through an engine on eval files: one JSONL row per question, resumable.

    rows = evaluate(files, out_dir, EvalConfig(workflow="memagent", engine=EngineSection(model="m/")))

Rows go to `<out_dir>/results.jsonl` as each question finishes. A re-run skips the (num_docs, task_id)
pairs already there; a half-written last line (a killed run) is cut off and that question re-run.
Row metrics use memrl.rewards.qa on the boxed prediction: em, sub_em (MemAgent's "accuracy"), f1.
Timing: `seconds` is one question's latency (queueing in the engine included); `started`/`finished` and
`session` let the report compute throughput time per question (wall span of a session / its questions).

`workflow="full_context"` is the baseline: the whole document in one prompt, centre-truncated to
`full_context.max_context_tokens`, answered in `\\boxed{}`.
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

from memrl.errors import UserError, model_dir, writable_dir
from memrl.types import Segment, Task, Trajectory

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "eval_config.json"
FULL_CONTEXT = "full_context"

FULL_CONTEXT_TEMPLATE = """You are given a problem and a long document. Read the document, then answer the problem and put the final answer inside \\boxed{{}}.

<problem>
{problem}
</problem>

<document>
{context}
</document>

Answer:""".replace("{{}}", "{}")


@dataclass
class EngineSection:
    """Which engine serves the model during evaluation."""

    name: str = "hf"
    """Engine kind: hf (transformers, embedded), or any kind memrl.engines.make_engine knows."""
    model: str = ""
    """Model directory (HuggingFace format) or served model name."""
    device: str = "cpu"
    dtype: str | None = None
    """torch dtype name; default float32 on CPU, bfloat16 on CUDA."""
    max_batch_size: int = 16
    """Rows decoded together by the engine's batcher."""
    seed: int = 0


@dataclass
class FullContextConfig:
    """The full-context baseline: whole document in one prompt, truncated in the middle to a budget."""

    max_context_tokens: int = 120_000
    """Document tokens kept (head half + tail half); the rest of the model window is prompt + answer."""
    max_final_tokens: int = 1024
    temperature: float = 0.0
    top_p: float = 1.0
    template: str | None = None
    """Inline prompt with {problem} and {context} (default: a boxed-answer prompt)."""
    template_file: str | None = None


@dataclass
class EvalConfig:
    """One evaluation run. Workflow settings come separately (the workflow's own config dataclass)."""

    workflow: str = "memagent"
    """A registered workflow (memagent, rememr1, ...) or full_context (the baseline)."""
    engine: EngineSection = field(default_factory=EngineSection)
    full_context: FullContextConfig = field(default_factory=FullContextConfig)
    limit: int = 0
    """Questions per file (the first ones); 0 = all."""
    concurrency: int = 16
    """Questions in flight at once (their model calls batch in the engine)."""
    seed: int = 0
    """Seed of the per-question RNGs (only matters when sampling)."""
    name: str = ""
    """Run name in tables and plots (default: the output directory's name)."""
    progress: bool = True


# ---------------------------------------------------------------- full-context baseline


async def run_full_context(task: Task, engine: Any, cfg: FullContextConfig, rng: random.Random) -> Trajectory:
    """Baseline: one call with the (centre-truncated) whole document; the answer is the last \\boxed{}."""
    from memrl.engines.base import SamplingParams
    from memrl.rewards.qa import extract_boxed
    from memrl.workflows.memagent import centre_truncate, decode_response
    from memrl.workflows.templates import chat_prompt, load_template

    tok = engine.tokenizer
    tpl = load_template("full_context", ("problem", "context"), cfg.template_file,
                        cfg.template if cfg.template is not None or cfg.template_file else FULL_CONTEXT_TEMPLATE)
    ids = list(tok.encode(task.context, add_special_tokens=False)) if task.context else []
    kept = centre_truncate(ids, cfg.max_context_tokens)
    _, prompt_ids = chat_prompt(tok, tpl.render(problem=task.question, context=tok.decode(kept)))
    seed = rng.getrandbits(31) if cfg.temperature > 0 else None
    sp = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, max_tokens=cfg.max_final_tokens, seed=seed)
    out = await engine.generate(prompt_ids, sp)
    text = decode_response(tok, out.token_ids)
    boxed = extract_boxed(text)
    seg = Segment(prompt_ids=prompt_ids, response_ids=list(out.token_ids), response_logprobs=list(out.logprobs),
                  info={"kind": "final", "answer_text": text, "prediction": boxed or "",
                        "finish_reason": out.finish_reason})
    metrics = {"context_tokens": float(len(ids)), "tokens_read": float(len(kept)),
               "truncated": float(len(kept) < len(ids)), "no_box": float(boxed is None),
               "generated_tokens": float(len(out.token_ids))}
    return Trajectory(task.task_id, "", [seg], final_answer=boxed or "", metrics=metrics,
                      info={"answer_text": text, "memories": []})


def get_spec(name: str):
    """The WorkflowSpec of a registered workflow, or of the full-context baseline."""
    from memrl.config import ConfigError
    from memrl.workflows import WorkflowSpec, boxed_em_outcome, get_workflow

    if name == FULL_CONTEXT:
        return WorkflowSpec(FULL_CONTEXT, run_full_context, FullContextConfig, boxed_em_outcome)
    try:
        return get_workflow(name)
    except KeyError as e:
        raise ConfigError(f"workflow: {e.args[0]} or {FULL_CONTEXT}") from e


def workflow_config(cfg: EvalConfig, overrides: Sequence[str] = ()) -> Any:
    """The workflow's config: its defaults, greedy decoding for evaluation, then `overrides` (dotted)."""
    from memrl.config import load_config

    if cfg.workflow == FULL_CONTEXT:
        from omegaconf import OmegaConf

        from memrl.config import ConfigError

        try:
            merged = OmegaConf.merge(OmegaConf.structured(cfg.full_context), OmegaConf.from_dotlist(list(overrides)))
            return OmegaConf.to_object(merged)
        except Exception as e:  # noqa: BLE001 - OmegaConf raises several types
            raise ConfigError(f"invalid full_context override in {list(overrides)}: {e}") from e
    spec = get_spec(cfg.workflow)
    names = {f.name for f in dataclasses.fields(spec.config_cls)}
    greedy = ["temperature=0"] if "temperature" in names else []
    return load_config(spec.config_cls, greedy + list(overrides))


# ---------------------------------------------------------------- engines


def make_eval_engine(sec: EngineSection) -> Any:
    """The engine named by `sec` (hf directly; other kinds through memrl.engines.make_engine)."""
    if not sec.model:
        raise UserError("eval: engine.model is empty; pass --model DIR (or engine.model=DIR)")
    if sec.name == "hf":
        from memrl.engines.hf import HFEngine

        model_dir(sec.model, "--model")
        return HFEngine(sec.model, device=sec.device, dtype=sec.dtype, max_batch_size=sec.max_batch_size,
                        seed=sec.seed)
    try:
        from memrl.engines import make_engine  # type: ignore[attr-defined]
    except ImportError as e:
        raise UserError(f"eval: engine {sec.name!r} is not available in this version (only 'hf')") from e
    return make_engine(sec.name, sec.model, device=sec.device, max_batch_size=sec.max_batch_size)


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


def result_row(
    task: Task, traj: Trajectory, num_docs: int, file: str, started: float, finished: float, session: str = ""
) -> dict[str, Any]:
    """The JSONL row of one finished question; started/finished are wall-clock times (time.time())."""
    from memrl.rewards.qa import qa_metrics

    pred = traj.final_answer or ""
    m = qa_metrics(pred, task.answers)
    memories = traj.info.get("memories")
    if memories is None:
        memories = [s.info["memory"] for s in traj.segments if s.info.get("kind") != "final" and "memory" in s.info]
    tm = traj.metrics
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
        "tokens_read": int(tm.get("tokens_read", tm.get("context_tokens", 0))),
        "context_tokens": int(tm.get("context_tokens", 0)),
        "generated_tokens": int(sum(len(s.response_ids) for s in traj.segments)),
        "model_calls": len(traj.segments),
        "seconds": round(finished - started, 4),
        "started": round(started, 4),
        "finished": round(finished, 4),
        "session": session,
        "metrics": {k: float(v) for k, v in tm.items()},
    }


# ---------------------------------------------------------------- the run


def _check_config(out: Path, record: dict[str, Any]) -> None:
    """Refuse to resume into a directory made with another workflow, model or workflow config."""
    p = out / CONFIG_FILE
    if p.exists():
        old = json.loads(p.read_text())
        keys = ("workflow", "model", "workflow_config")
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
    workflow_overrides: Sequence[str] = (),
    engine: Any = None,
) -> list[dict[str, Any]]:
    """Evaluate every file (smallest N first) into out_dir/results.jsonl; returns all rows, old and new.

    `engine` may be passed in (tests, notebooks); otherwise it is built from cfg.engine and closed after.
    """
    from memrl.data.io import load_tasks

    out = writable_dir(out_dir, "--out")
    spec = get_spec(cfg.workflow)
    wf_cfg = workflow_config(cfg, workflow_overrides)
    record = {"workflow": cfg.workflow, "model": cfg.engine.model, "engine": dataclasses.asdict(cfg.engine),
              "workflow_config": dataclasses.asdict(wf_cfg), "files": [str(f) for f in files],
              "name": cfg.name or out.resolve().name, "seed": cfg.seed}
    _check_config(out, record)

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
                row = result_row(task, traj, n, f, starts.pop(task.task_id), time.time(), session)
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                new.append(row)
                acc.append(row["sub_em"])
                bar.set_postfix(acc=f"{100 * sum(acc) / len(acc):.1f}%", refresh=False)
                bar.update(1)

            await rollout(tasks, timed_spec, engine, wf_cfg, n=1, concurrency=cfg.concurrency, seed=cfg.seed,
                          on_done=on_done, score=False)
    finally:
        bar.close()
    return new
