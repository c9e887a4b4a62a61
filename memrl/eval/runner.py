"""Evaluate a workflow through an engine on eval files: one JSONL row per question, resumable.

    rows = evaluate(files, out_dir, EvalConfig(workflow={"name": "memagent"}, engine=EngineConfig(model="m/")))

Rows go to `<out_dir>/results.jsonl` as each question finishes. Each row names what it answered: the
source file (`file` name, `file_path`, `file_bytes` and `file_sha256`, the first 16 hex digits of the
SHA-256 of the file's bytes: the identity, so a moved file resumes and a changed one re-runs; the row's
`heldout_sha256`, memrl.eval.evaluator.ROW_COLUMNS, is the whole SHA-256, as a recipe's rows), `dataset`
(Task.meta["dataset"], "" when the file does not say), `num_docs` (the row's N: its num_docs, else RULER's
sequence length, else the N of an `eval_..._<N>` file name, else 0), `task_id` and `sample` (0..samples-1).
A re-run skips the rows whose (file_sha256, dataset, num_docs, task_id, sample) is already there, so a
second file, or a second dataset at the same N, into the same --out runs in full. Rows written before
this identity existed resume by (file name, num_docs, task_id). A half-written last line (a killed run)
is cut off and that question re-run; any other unreadable line (invalid JSON, not UTF-8, not a row) is
counted and named in one warning, left in place, and its question re-run. The run's record (eval_config.json)
holds the SHA-256 of engine.model's weight files (`weights_sha256`): a resume onto other weights at the same
path (a `checkpoints/latest` that training moved since) is refused, since it would mix two models' rows.
Row metrics use memrl.rewards.qa on the boxed prediction: em, sub_em (MemAgent's "accuracy"), f1; a workflow
that declares its own row columns (WorkflowSpec.row_columns) gives the values of those it names (a
multi-question trajectory scores itself) and adds the others.
Scoring (`golds`, `extract`; docs/guides/eval_scoring.md): the prediction is the last \\boxed{} (extract=boxed),
the text after the last "the answer is" (answer_is, MemAgent's protocol) or the whole final text (raw),
scored against the best of all gold answers (golds=any) or answers[0] only (golds=first, as the public
evaluations do). A task whose meta["metric"] names a registered eval metric (memrl.rewards.eval_metrics:
RULER's string_match_all / string_match_part) also gets that metric under its name, over all answers.
`reward` is the workflow's outcome reward (awaited when async; a failing one counts reward_error, 0).
Timing: `seconds` is one question's latency (queueing in the engine included); `started`/`finished` and
`session` let the report compute throughput time per question (wall span of a session / its questions).

Questions run through memrl.eval.evaluator's `Rollout` (default `EngineRollout` over the engine, one
event loop for the whole call; `evaluate(..., rollout=...)` injects another), sample k of a file's
questions as one call seeded like the k-th trajectory of the demos' evaluation (`first_sample=k`), so the
demos, validation and `memrl eval` sample the same trajectories from the same seed.

`workflow=full_context` is the baseline (memrl.workflows.full_context): the whole document in one prompt,
centre-truncated to `workflow.max_context_tokens`, answered in `\\boxed{}`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tqdm import tqdm

from memrl.config import (
    MAX_COUNT,
    MAX_SEED,
    MAX_TOKENS,
    ConfigError,
    check_config,
    check_shared_fields,
    redact_secrets,
    valid,
)
from memrl.data.io import DataError, load_tasks
from memrl.data.ruler import name_label
from memrl.downloads import sha256_file
from memrl.engines import build_engine, engine_kind
from memrl.engines.base import FAILED_REQUEST_MODES, EngineError, SamplingParams
from memrl.engines.config import EngineConfig, HFSection
from memrl.errors import UserError, model_dir, writable_dir
from memrl.eval.evaluator import EngineRollout, row_labels
from memrl.eval.results_file import ROW_SCORES as ROW_SCORES
from memrl.eval.results_file import file_identity, read_results, result_row, row_key, weights_identity
from memrl.eval.results_file import score_prediction as score_prediction
from memrl.eval.task_judge import TaskJudge, with_task_judge
from memrl.model_open import model_config
from memrl.rewards.extract import EXTRACT_MODES
from memrl.rewards.published_metrics import METRIC_RULES
from memrl.runtime import RolloutRuntime
from memrl.services.registry import retriever_problem
from memrl.threads import ThreadsSection, in_effect
from memrl.types import Task, Trajectory
from memrl.workflows import DEFAULT_WORKFLOW, parse_workflow
from memrl.workflows.rollouts import takes_services
from memrl.workflows.templates import check_thinking_switch

log = logging.getLogger(__name__)

RESULTS_FILE = "results.jsonl"
CONFIG_FILE = "eval_config.json"

EVAL_ENGINE_DEFAULTS: dict[str, Any] = {"max_batch_size": 16, "hf.deterministic": False}
"""Where `memrl eval`'s engine defaults differ from the `engine` section's (memrl.engines.config, `memrl train`
and validation): 16 sequences decoded together and continuous (time-window) batching; every other engine
default is the section's. The one place these differences are written."""


@dataclass
class EvalConfig:
    """One evaluation run: `memrl eval` overrides, spelled as in `memrl train` (workflow.*, engine.*)."""

    workflow: dict[str, Any] = field(default_factory=lambda: {"name": DEFAULT_WORKFLOW})
    """A registered workflow (`name`: memagent, rememr1, full_context = the baseline, ...) and its config
    fields (workflow.chunk_tokens=5000); greedy decoding unless workflow.temperature is given."""
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(
        max_batch_size=EVAL_ENGINE_DEFAULTS["max_batch_size"],
        hf=HFSection(deterministic=EVAL_ENGINE_DEFAULTS["hf.deterministic"])))
    """The engine (memrl.engines.config): `engine.model` is the model directory (--model). Its defaults are
    `memrl train`'s except EVAL_ENGINE_DEFAULTS."""
    limit: int = valid(0, ge=0, le=MAX_COUNT, note="0 = all")
    """Questions per file (the first ones); 0 = all."""
    concurrency: int = valid(16, ge=1, le=MAX_COUNT)
    """Questions in flight at once (their model calls batch in the engine)."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the per-question RNGs (only matters when sampling)."""
    name: str = ""
    """Run name in tables and plots (default: the output directory's name)."""
    progress: bool = True
    golds: str = valid("any", choices=("any", "first"))
    """Which gold answers a prediction is scored against: any = the best over all of them (memrl);
    first = answers[0] only (MemAgent's, ReMemR1's and vime's evaluations)."""
    extract: str = valid("boxed", choices=EXTRACT_MODES)
    """How the prediction is read from the final text (memrl.rewards.extract): boxed = the last \\boxed{};
    answer_is = the text after the last "the answer is" (MemAgent's protocol for its RL models);
    boxed_published = the published evaluations' box reader (also `\\boxed ans`); boxed_last300 = that
    reader over the last 300 characters only (vime's evaluation); raw = the whole text."""
    docs_from: str = ""
    """Index-only eval files (contexts stored as document indices: MemAgent's sets of 12800 documents and
    more, RULER QA past 2M tokens): the dev file the indices point into (`--docs-from`); "" = none."""
    samples: int = valid(1, ge=1, le=MAX_COUNT)
    """Answers per question (rows carry `sample` 0..samples-1); more than 1 needs workflow.temperature > 0
    to differ."""
    metric_rules: str = valid("memrl", choices=METRIC_RULES)
    """How em / sub_em / f1 score a prediction (memrl.rewards.published_metrics): memrl (memrl.rewards.qa);
    memagent = MemAgent's and ReMemR1's evaluations (ASCII punctuation only, an empty prediction scores
    0, each score rounded to 2 decimals per question); vime = vime's (an empty prediction has sub_em 1,
    no yes/no rule in f1)."""
    requires_templates: bool = False
    """True (the *_eval_official presets): the run needs the user's prompt files,
    workflow.memory_template_file and workflow.final_template_file (or the inline memory_template /
    final_template); a config without them is a one-line error naming the missing key (memrl ships no
    published prompt text)."""
    failed_requests: str = valid("error", choices=FAILED_REQUEST_MODES)
    """A question whose model request the engine could not serve (memrl.engines.base.EngineError: an
    unreachable server, an HTTP error such as a prompt over the server's --max-model-len): "error" (memrl)
    stops the run, naming it; "drop" (vime's evaluation) leaves it out: no row, so the file's mean is over
    the questions answered; "drop_or_empty" (MemAgent's and ReMemR1's, whose `output == ''` test is met by
    a failed request and by an empty final reply alike) also leaves out a question whose final reply
    decodes to "" (memrl's decoded reply is whitespace-stripped: an all-blank reply counts as empty here).
    Each drop is logged with its reason and counted in the run's closing warning; a later run into the
    same --out asks the question again."""
    strip_text: bool = False
    """True (the published evaluations): each question and context whitespace-stripped (str.strip) before
    use; False (memrl): as the file holds them."""
    length_buckets: list[int] = valid(default_factory=lambda: [4000, 8000], ge=1, le=MAX_TOKENS)
    """LongBench files: increasing upper bounds of the length buckets the report groups rows by (each row's
    N = its bucket's lower bound); [4000, 8000] = LongBench-E's 0-4k, 4-8k, 8k+."""
    judge: TaskJudge = field(default_factory=TaskJudge)
    """The LLM judge of tasks whose official score is a judge's (LongMemEval; memrl.eval.task_judge): with
    `judge.url` (and judge.model) each such answer gets a `longmemeval_judge` verdict; no url = no judge
    calls (the rule score is still reported)."""
    threads: ThreadsSection = field(default_factory=ThreadsSection)
    """CPU threads (memrl.threads): torch intra-op / inter-op, OpenMP wait policy; `memrl eval` and `memrl ask`
    apply them (recorded in eval_config.json as what was in effect)."""

    def __post_init__(self) -> None:
        check_config(self)  # the declared ranges (valid), also for a config built in code

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
        if not self.length_buckets or list(self.length_buckets) != sorted(set(self.length_buckets)):
            raise ValueError(f"length_buckets must be increasing bounds (e.g. [4000, 8000]), got {self.length_buckets!r}")


GOLDS_MODES = ("any", "first")
TEMPLATE_FILE_KEYS = ("memory_template_file", "final_template_file")
"""The workflow keys a requires_templates config must set (the user's copies of the published prompts)."""


def workflow_config(cfg: EvalConfig) -> tuple[Any, Any]:
    """(spec, config) of `cfg.workflow`: the section's fields, the rest from the spec's eval_defaults
    (greedy decoding unless the spec says otherwise), then the config class's own defaults."""
    spec, wf = parse_workflow(cfg.workflow, stage="eval")
    check_shared_fields(wf, SamplingParams, "workflow")  # temperature / top_p before the model loads
    return spec, wf


# ---------------------------------------------------------------- engines


def make_eval_engine(sec: EngineConfig) -> Any:
    """The engine `sec` names (memrl.engines.build_engine), after checking the model directory exists."""
    if not sec.model:
        raise UserError("eval: engine.model is empty; pass --model DIR (or engine.model=DIR)")
    if engine_kind(sec.name).reads_weights:
        model_dir(sec.model, "--model")
        model_config(sec.model, "--model")  # a model_type or config transformers refuses: before the engine loads
    return build_engine(sec)


# ---------------------------------------------------------------- results file


def num_docs_of(path: str, tasks: Sequence[Task]) -> int:
    """A file's document count: the rows' num_docs, else the N of an eval_{N} file name, else 0."""
    vals = {t.meta.get("num_docs") for t in tasks}
    if len(vals) == 1 and isinstance(next(iter(vals)), int):
        return int(next(iter(vals)))
    m = re.search(r"eval_(\d+)", Path(path).name)
    return int(m.group(1)) if m else 0


def task_length(task: Task, file_n: int) -> int:
    """A row's N: its num_docs, else its RULER sequence length, else its LongBench length bucket (the
    bucket's lower bound), else the file's N."""
    for key in ("num_docs", "seq_length", "length_bucket"):
        v = task.meta.get(key)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return file_n


@dataclass
class EvalFile:
    """One loaded eval file: its identity, N (the smallest of its rows) and tasks with their (dataset, N)."""

    path: str
    ident: dict[str, Any]
    n: int
    tasks: list[Task]
    labels: dict[str, tuple[str, int]]
    """task_id -> (dataset, N)."""
    sha256: str
    """The SHA-256 of the file's bytes, 64 hex digits: its rows' heldout_sha256, as a recipe's rows carry the
    held-out tasks' (`ident`'s file_sha256, the resume key, is its first 16)."""

    def key(self, task: Task, sample: int) -> tuple[Any, ...]:
        ds, n = self.labels[task.task_id]
        return (self.ident["file_sha256"], ds, n, task.task_id, sample)

    def legacy_key(self, task: Task, sample: int) -> tuple[Any, ...]:
        return ("legacy", self.ident["file"], self.labels[task.task_id][1], task.task_id, sample)


def load_eval_file(path: str | os.PathLike[str], cfg: EvalConfig) -> EvalFile:
    """Tasks of one eval file (first cfg.limit), each labelled with its (dataset, N); ids must be unique."""
    tasks = load_tasks(path, docs_from=cfg.docs_from or None, buckets=cfg.length_buckets)
    if cfg.limit:
        tasks = tasks[: cfg.limit]
    if cfg.strip_text:  # the published evaluations strip both before use
        tasks = [dataclasses.replace(t, question=t.question.strip(), context=t.context.strip()) for t in tasks]
    seen: dict[str, int] = {}
    for i, t in enumerate(tasks):
        if t.task_id in seen:
            raise DataError(f"{path}: rows {seen[t.task_id]} and {i} have the same task id {t.task_id!r}; "
                            "an eval file needs one id per question")
        seen[t.task_id] = i
    file_n = num_docs_of(str(path), tasks) or (name_label(path)[1] or 0)
    labels = {}
    for t in tasks:
        ds = t.meta.get("dataset")
        labels[t.task_id] = (ds if isinstance(ds, str) else "", task_length(t, file_n))
    n = min((v[1] for v in labels.values()), default=file_n)
    sha = sha256_file(path)
    return EvalFile(str(path), file_identity(path, sha), n, tasks, labels, sha)


# ---------------------------------------------------------------- the run


def _defaults(config_cls: type) -> dict[str, Any] | None:
    """A workflow config's default fields as its record holds them (None: a plugin's config that has required
    fields, or whose defaults alone do not validate; an older record then resumes only field for field)."""
    try:
        return redact_secrets(dataclasses.asdict(config_cls()))
    except (TypeError, ValueError):
        return None


def _check_config(out: Path, record: dict[str, Any], wf_defaults: dict[str, Any] | None = None) -> None:
    """Refuse to resume into a directory made with another workflow, model or workflow config. A workflow
    field the directory's record lacks (added to the workflow's config since) counts as its default
    (`wf_defaults`): such a run resumes when this one leaves the field at that default."""
    p = out / CONFIG_FILE
    if p.exists():
        old = json.loads(p.read_text())
        keys = ("workflow", "model", "workflow_config", "scoring", "strip_text")
        # directories written before scoring options existed were scored with today's defaults
        old.setdefault("scoring", {"golds": "any", "extract": "boxed"})
        if isinstance(old.get("workflow_config"), dict) and wf_defaults and old.get("workflow") == record["workflow"]:
            added = {k: v for k, v in wf_defaults.items() if k not in old["workflow_config"]}
            old["workflow_config"] = {**old["workflow_config"], **added}
            if added and old["workflow_config"] == record.get("workflow_config"):
                log.info("%s: resuming; workflow fields newer than its record, at their defaults: %s", out,
                         ", ".join(sorted(added)))
        diff = [k for k in keys if old.get(k) != record.get(k)]
        if old.get("length_buckets", [4000, 8000]) != record.get("length_buckets", [4000, 8000]):
            diff.append("length_buckets")  # LongBench rows' N (their bucket) would change
        # index-only contexts depend on the dev file: a different one (by content) may not resume
        if old.get("docs_from_sha256") and record.get("docs_from_sha256") \
                and old["docs_from_sha256"] != record["docs_from_sha256"]:
            diff.append("docs_from")
        if diff and (out / RESULTS_FILE).exists():
            raise UserError(
                f"{out} holds results of a different run ({', '.join(diff)} differ from {p}); "
                "use another --out directory or delete it"
            )
        was, now = old.get("weights_sha256"), record.get("weights_sha256")
        if was and now and was != now and (out / RESULTS_FILE).exists():
            raise UserError(
                f"{out}: engine.model={record.get('model')} now holds other weights (SHA-256 of its weight files "
                f"{now[:16]}...) than the rows in {RESULTS_FILE} were answered with ({was[:16]}..., {p}); "
                "resuming would mix two models: use another --out directory or delete it"
            )
    p.write_text(json.dumps(record, indent=1, default=str) + "\n")


def evaluate(
    files: Sequence[str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    cfg: EvalConfig,
    engine: Any = None,
    rollout: Any = None,
    runtime: Any = None,
) -> list[dict[str, Any]]:
    """Evaluate every file (smallest N first) into out_dir/results.jsonl; returns all rows, old and new.

    The questions run through `rollout` (a memrl.eval.evaluator.Rollout of cfg's workflow), one sample
    index at a time; by default an EngineRollout on one memrl.runtime.RolloutRuntime (one event loop, one
    client per service): `runtime` when given (in-training validation passes the trainer's; its engine
    left open), else one made here over `engine` (tests, notebooks; left open) or over an engine built
    from cfg.engine, and closed before this returns.
    """
    check_config(cfg)  # also when called with a config built in code, not by load_config
    out = writable_dir(out_dir, "--out")
    spec, wf_cfg = workflow_config(cfg)
    if cfg.judge.url:
        cfg.judge.api_key()  # a missing key variable: one line now, not a zero score per question later
    problem = retriever_problem(wf_cfg, spec.name)  # before any engine is built, not at the first search
    if problem:
        raise ConfigError(problem)
    record = {"workflow": spec.name, "model": cfg.engine.model, "engine": dataclasses.asdict(cfg.engine),
              "workflow_config": dataclasses.asdict(wf_cfg), "files": [str(f) for f in files],
              "name": cfg.name or out.resolve().name, "seed": cfg.seed, "samples": cfg.samples,
              "scoring": {"golds": cfg.golds, "extract": cfg.extract,
                          # only when set, so directories from before the option still resume
                          **({"metric_rules": cfg.metric_rules} if cfg.metric_rules != "memrl" else {}),
                          **({"judge": cfg.judge.record()} if cfg.judge.url else {})}}
    record["threads"] = in_effect()  # what this run ran with (not compared on resume)
    if cfg.strip_text:  # only when set, so directories from before the option still resume
        record["strip_text"] = True
    if list(cfg.length_buckets) != [4000, 8000]:  # LongBench rows' N depends on it (the default stays unrecorded)
        record["length_buckets"] = list(cfg.length_buckets)
    if engine is None and rollout is None and runtime is None:  # the weights are read from engine.model
        digest = weights_identity(cfg.engine.model)
        if digest is not None:  # compared on resume (the same path may hold other weights by then)
            record["weights_sha256"] = digest
    if cfg.docs_from:
        if not Path(cfg.docs_from).is_file():
            raise UserError(f"docs_from {cfg.docs_from} does not exist (the dev file of index-only eval files)")
        record["docs_from"] = cfg.docs_from
        record["docs_from_sha256"] = file_identity(cfg.docs_from)["file_sha256"]
    _check_config(out, redact_secrets(record), _defaults(spec.config_cls))

    loaded: list[EvalFile] = []
    for f in files:
        ef = load_eval_file(f, cfg)
        twin = next((o for o in loaded if o.ident["file_sha256"] == ef.ident["file_sha256"]), None)
        if twin is not None:  # the same bytes twice (a copy, a repeated argument): its rows are the same rows
            log.warning("%s has the same content as %s; evaluating it once", f, twin.path)
            continue
        loaded.append(ef)
    loaded.sort(key=lambda ef: ef.n)

    results_path = out / RESULTS_FILE
    rows = drop_stale_rows(results_path, read_results(results_path, repair=True), loaded)
    done = {row_key(r) for r in rows}
    todo = []  # (file, sample, tasks not done at that sample)
    for ef in loaded:
        for k in range(cfg.samples):
            ts = [t for t in ef.tasks if ef.key(t, k) not in done and ef.legacy_key(t, k) not in done]
            if ts:
                todo.append((ef, k, ts))
    total = sum(len(ts) for _, _, ts in todo)
    if rows:
        log.info("%s: %d rows already done, %d to go", results_path, len(rows), total)
    if total == 0:
        return rows

    own = runtime is None and rollout is None
    if own:
        own_engine = engine is None
        runtime = RolloutRuntime(make_eval_engine(cfg.engine) if own_engine else engine, close_engine=own_engine)
    try:
        if own:  # the tokenizer is loaded now; nothing generated yet
            check_thinking_switch(getattr(runtime.engine, "tokenizer", None), getattr(wf_cfg, "enable_thinking", None),
                                  f"--model {cfg.engine.model}")
        with open(results_path, "a", encoding="utf-8") as fh:
            if rollout is None:
                run_spec = dropping_failed_requests(spec) if cfg.failed_requests != "error" else spec
                if cfg.judge.url:  # tasks scored by a judge (LongMemEval) get its verdict in the score stage
                    run_spec = with_task_judge(run_spec, cfg.judge, cfg.extract)
                rollout = EngineRollout(runtime.engine, run_spec, cfg.concurrency, runtime=runtime)
            tokenizer = getattr(rollout, "tokenizer", None) or getattr(engine, "tokenizer", None)
            rows += _run_all(todo, rollout, wf_cfg, cfg, fh, total, tokenizer, spec.row_columns, record["name"])
    finally:
        if own:
            runtime.close()
    return rows


def drop_stale_rows(path: Path, rows: list[dict[str, Any]], loaded: list[EvalFile]) -> list[dict[str, Any]]:
    """Rows of an earlier version of a file evaluated now (same resolved path, another content digest) are
    removed from `path` (rewritten through a temporary file): a rebuilt file is evaluated afresh, not
    counted twice. Rows of files not given this time stay."""
    now = {ef.ident["file_path"]: ef.ident["file_sha256"] for ef in loaded}
    stale = [r for r in rows if r.get("file_path") in now and r.get("file_sha256") != now[r["file_path"]]]
    if not stale:
        return rows
    gone = {id(r) for r in stale}
    keep = [r for r in rows if id(r) not in gone]
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in keep)
    os.replace(tmp, path)
    files = sorted({str(r["file_path"]) for r in stale})
    log.warning("%s: removed %d row(s) of an earlier version of %s (the file's content changed; evaluated again)",
                path, len(stale), ", ".join(files))
    return keep


FAILED_REQUEST = "failed_request"
"""Trajectory.info key of a question dropped under failed_requests=drop (its engine error)."""


def dropping_failed_requests(spec: Any) -> Any:
    """`spec` whose run answers an EngineError with an empty trajectory marked info[FAILED_REQUEST] (the
    error's text) instead of raising (EvalConfig.failed_requests drop / drop_or_empty); every other error
    still stops the run."""
    base, base_takes = spec.run, takes_services(spec.run)

    async def run(task: Task, engine: Any, wf_cfg: Any, rng: Any, services: Any = None) -> Trajectory:
        try:
            if base_takes:
                return await base(task, engine, wf_cfg, rng, services=services)
            return await base(task, engine, wf_cfg, rng)
        except EngineError as e:
            return Trajectory(task_id=task.task_id, trajectory_id="", segments=[], final_answer="",
                              info={FAILED_REQUEST: str(e)})

    return dataclasses.replace(spec, run=run)


def dropped_because(traj: Trajectory, mode: str) -> str:
    """Why `traj`'s question is left out under failed_requests=`mode` ("" = it is kept): its failed request,
    or (drop_or_empty) its empty final reply."""
    if mode == "error":
        return ""
    if FAILED_REQUEST in traj.info:
        return str(traj.info[FAILED_REQUEST])
    if mode == "drop_or_empty" and traj.info.get("answer_text", None) == "":
        return "the final reply is empty"
    return ""


def _run_all(todo, rollout, wf_cfg, cfg: EvalConfig, fh, total: int, tokenizer: Any,
             row_columns: Callable[[Trajectory], Mapping[str, Any]] | None = None,
             policy: str = "") -> list[dict[str, Any]]:
    """Each (file, sample k, tasks) of `todo` through `rollout` (sample k seeded as the rollout's k-th
    trajectory of a task); one row per finished question (with the workflow's `row_columns` and the
    evaluation row's labels: `policy` (the run's name), the decoding, the length as bucket, the seed and the
    file's digest), written and flushed as it finishes."""
    new: list[dict[str, Any]] = []
    bar = tqdm(total=total, unit="q", disable=not cfg.progress, dynamic_ncols=True)
    starts: dict[str, float] = {}
    dropped: list[str] = []  # failed_requests=drop: the questions left out
    session = f"{int(time.time())}-{os.getpid()}"

    def started(task: Task) -> None:
        starts[task.task_id] = time.time()

    try:
        for ef, k, tasks in todo:
            bar.set_description(f"{ef.ident['file']} N={ef.n}" + (f" sample {k}" if cfg.samples > 1 else ""))
            acc: list[float] = []

            def on_done(task: Task, traj: Trajectory, ef: EvalFile = ef, k: int = k, acc: list[float] = acc) -> None:
                ds, n = ef.labels[task.task_id]
                why = dropped_because(traj, cfg.failed_requests)
                if why:  # failed_requests=drop / drop_or_empty: no row, as the published evaluations
                    starts.pop(task.task_id, None)
                    dropped.append(task.task_id)
                    log.warning("%s: question %s sample %d dropped (failed_requests=%s): %s", ef.path,
                                task.task_id, k, cfg.failed_requests, why)
                    bar.update(1)
                    return
                row = result_row(task, traj, n, ef.path, starts.pop(task.task_id), time.time(), session,
                                 tokenizer=tokenizer, ident=ef.ident, dataset=ds, sample=k,
                                 golds=cfg.golds, extract=cfg.extract,
                                 metric_rules=cfg.metric_rules, row_columns=row_columns,
                                 labels=row_labels(policy, getattr(wf_cfg, "temperature", 0.0), n, cfg.seed,
                                                   ef.sha256))
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                new.append(row)
                acc.append(row["sub_em"])
                bar.set_postfix(acc=f"{100 * sum(acc) / len(acc):.1f}%", refresh=False)
                bar.update(1)

            rollout(tasks, wf_cfg, 1, cfg.seed, first_sample=k, on_start=started, on_done=on_done)
    finally:
        bar.close()
        if dropped:
            log.warning("%d question(s) dropped (failed_requests=%s); the means leave them out", len(dropped),
                        cfg.failed_requests)
    return new
