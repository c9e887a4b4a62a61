"""Workflows: `async def run(task, engine, cfg, rng[, services]) -> Trajectory`, described by a WorkflowSpec.

Every command spells a workflow's settings the same way: `workflow=<name>` (or `workflow.name=<name>`)
chooses it and `workflow.<field>=value` sets a field of its config dataclass; `parse_workflow` turns that
section into (WorkflowSpec, config) once per run.

A name is either registered (`memagent`, `rememr1`, `full_context`, `memact`, `infmem`, `mem1`, `fold`,
`summarize`, `sliding_window`, or one given to
`register_workflow`) or an import path `package.module:ATTR` naming a WorkflowSpec instance, so a
workflow living outside memrl needs no edit here: its spec carries its run function, config class,
outcome reward, format-error metric keys and training / evaluation defaults. The built-ins are
registered by the same import paths (their modules are imported when first named; this module imports
none of them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.config import ConfigError, section_from_dict
from memrl.plugins import is_import_path, load_object
from memrl.rewards.verifiers import get_verifier, resolve_verifier
from memrl.types import Task, Trajectory
from memrl.workflows.templates import TemplateError, read_template_file

STAGES = ("train", "eval")
DEFAULT_WORKFLOW = "memagent"
"""The workflow `memrl eval` and `memrl ask` run when none is named."""


@dataclass(frozen=True)
class ReportSection:
    """A workflow's own summary in `memrl eval`'s report (WorkflowSpec.report): one summary per run whose
    rows are the workflow's, a markdown table of them appended to summary.md, and files written beside it.
    """

    summarize: Callable[[Sequence[dict[str, Any]], str], Any | None]
    """`(rows, run name) -> summary`, or None where the rows are not this workflow's."""
    markdown: Callable[[Sequence[Any]], str]
    """`(summaries) -> markdown table`."""
    write: Callable[[Path, Sequence[Any]], tuple[Path, ...]]
    """`(output directory, summaries) -> the files written there` (a CSV, a plot)."""


@dataclass(frozen=True)
class WorkflowSpec:
    """A workflow: its run function, its config dataclass and its outcome reward, plus what the commands
    need to know about it (all optional).

    `run(task, engine, cfg, rng[, services])` generates only. `reward(task, traj[, services])` returns a
    float or a memrl.types.Score, or an awaitable of one (an LLM judge); `step_rewards(task, traj)` returns
    one value (or None) per segment. Both are pure (they write nothing onto the trajectory): callers use
    memrl.workflows.rollouts.score_trajectory / score_groups, which return Scores. A function with a
    `services` parameter gets the run's memrl.services.session.Services (retriever and judge clients).
    """

    name: str
    run: Callable[..., Awaitable[Trajectory]]
    config_cls: type
    reward: Callable[..., Any]
    step_rewards: Callable[[Task, Trajectory], list[float | None]] | None = None
    """Per-segment step rewards (ReMemR1's; memagent's for algorithm=rememr1), returned by the score stage."""
    memory_prompts: Callable[..., tuple[list[int], list[int]]] | None = None
    """`(task, traj, cfg, tokenizer) -> (prompt ids with the final memory, the same prompt without memory)`:
    the pair InfoMem's final-memory reward scores the gold answer after (memrl.training.step.step_extras);
    None: the workflow has no final memory to score (memagent has one)."""
    batch_scores: Callable[..., Any] | None = None
    """`(groups, scores) -> scores`: the Scores of a scored batch (`[group][trajectory]`) adjusted with what
    only the whole batch shows (InfMem's published early-stop term reads the batch's step counter); run by
    memrl.workflows.rollouts.score_groups after every trajectory is scored, never on a trajectory scored
    alone (evaluation's streaming score). None: each trajectory's Score is its own."""
    branches: bool = False
    """The workflow records folding rows (row info "kind" main / branch, "branch_turns", "error_turns"; fold
    does): what FoldGRPO's built-in process rewards read (memrl.algorithms.fold). Without them foldgrpo is
    plain GRPO, so `memrl train` refuses it (memrl.training.assemble.validate)."""
    format_keys: tuple[str, ...] = ()
    """Trajectory metrics that count a format error or a fallback (> 0 = that error happened); the
    trainer logs format/<key> and the eval table counts questions with each (`format_counts`)."""
    train_defaults: Mapping[str, Any] = field(default_factory=dict, hash=False)
    """Values `memrl train` (and train-sft) gives config fields the workflow section leaves out, e.g.
    {"max_chunks": 8}. Keys must be fields of `config_cls`."""
    eval_defaults: Mapping[str, Any] | None = field(default=None, hash=False)
    """Values `memrl eval` and validation give config fields the section leaves out; None = greedy
    decoding ({"temperature": 0.0} when config_cls has a temperature field). Keys must be fields."""
    report: ReportSection | None = None
    """The workflow's own table in `memrl eval`'s report (under the standard one), with its CSV and plot;
    None: the standard table only."""
    ask: bool = False
    """The workflow reads a document chunk by chunk and keeps a memory (segments with info "kind": "memory"
    and "memory"), so `memrl ask` can run it."""
    recall_key: str | None = None
    """The memory segments' info key holding the query the step recalled by (`memrl ask --show-memory`
    prints it); None: the workflow recalls nothing."""
    row_columns: Callable[[Trajectory], Mapping[str, Any]] | None = None
    """The workflow's own columns of an evaluation row (`memrl eval`'s results.jsonl) from a scored trajectory:
    a standard score column it names (em, sub_em, f1: the trajectory scored itself, so its prediction is its
    final answer; generated_tokens) takes its value, any other is added after model_calls (e.g. InfMem's
    retrievals and stop step). None: the standard columns only (memrl.eval.runner.result_row)."""

    def __post_init__(self) -> None:
        if not dataclasses.is_dataclass(self.config_cls):
            raise TypeError(f"WorkflowSpec {self.name!r}: config_cls must be a dataclass, got {self.config_cls!r}")
        keys = (self.format_keys,) if isinstance(self.format_keys, str) else self.format_keys
        object.__setattr__(self, "format_keys", tuple(keys))
        if not all(isinstance(k, str) for k in self.format_keys):
            raise TypeError(f"WorkflowSpec {self.name!r}: format_keys must be metric names (strings)")
        known = self.config_fields()
        for attr in ("train_defaults", "eval_defaults"):
            values = getattr(self, attr)
            unknown = sorted(set(values or {}) - known)
            if unknown:
                raise ValueError(f"WorkflowSpec {self.name!r}: {attr} names {', '.join(unknown)}, not fields of "
                                 f"{self.config_cls.__name__}")

    def config_fields(self) -> set[str]:
        return {f.name for f in dataclasses.fields(self.config_cls)}

    def defaults(self, stage: str) -> dict[str, Any]:
        """The spec's own defaults for `stage` ("train" or "eval")."""
        if stage == "train":
            return dict(self.train_defaults)
        if stage == "eval":
            if self.eval_defaults is not None:
                return dict(self.eval_defaults)
            return {"temperature": 0.0} if "temperature" in self.config_fields() else {}
        raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}")


WorkflowRef = Callable[[], WorkflowSpec] | str

_REGISTRY: dict[str, WorkflowRef] = {}
_SEEN: dict[str, WorkflowSpec] = {}  # every spec resolved in this process (format keys of plugins)


def register_workflow(name: str, ref: WorkflowRef) -> None:
    """Make `workflow=name` mean `ref`: an import path "package.module:ATTR" of a WorkflowSpec (resolved
    when first named) or a function returning one (tests, notebooks)."""
    _REGISTRY[name] = ref


# The built-ins, by the same mechanism a plugin uses: each module defines its own SPEC.
register_workflow("memagent", "memrl.workflows.memagent:SPEC")
register_workflow("rememr1", "memrl.workflows.rememr1:SPEC")
register_workflow("full_context", "memrl.workflows.full_context:SPEC")
register_workflow("memact", "memrl.workflows.memact:SPEC")
register_workflow("infmem", "memrl.workflows.infmem:SPEC")
register_workflow("mem1", "memrl.workflows.mem1:SPEC")
register_workflow("fold", "memrl.workflows.fold:SPEC")
register_workflow("summarize", "memrl.workflows.summarize:SPEC")
register_workflow("sliding_window", "memrl.workflows.sliding_window:SPEC")
BUILTIN_WORKFLOWS = ("memagent", "rememr1", "full_context", "memact", "infmem", "mem1", "fold", "summarize",
                     "sliding_window")


def _is_spec(obj: Any) -> bool:
    return isinstance(obj, WorkflowSpec)


def _load_spec(path: str, where: str) -> WorkflowSpec:
    return load_object(path, where, "a WorkflowSpec", _is_spec,
                       "name a memrl.workflows.WorkflowSpec instance, e.g. mypkg.myworkflow:SPEC")


def get_workflow(name: str, where: str = "workflow.name") -> WorkflowSpec:
    """The WorkflowSpec `name` stands for: a registered name, or an import path "package.module:ATTR".

    The spec returned is known by the name it was asked for (its `name`, as logs and eval records show
    it), so a saved config names it again; the import path of a registered one
    (memrl.workflows.memagent:SPEC) gives the registered name. An unknown name is a KeyError; a bad
    import path a ConfigError naming `where`.
    """
    if name in _REGISTRY:
        ref = _REGISTRY[name]
        spec, canonical = (_load_spec(ref, where) if isinstance(ref, str) else ref()), name
    elif is_import_path(name):
        spec = _load_spec(name, where)
        canonical = next((n for n, r in _REGISTRY.items() if r == name), name)
    else:
        hint = "; an import path is written module:ATTR" if "." in name else ""
        raise KeyError(f"unknown workflow {name!r}; known: {', '.join(sorted(_REGISTRY))}{hint}")
    if spec.name != canonical:
        spec = dataclasses.replace(spec, name=canonical)
    _SEEN.setdefault(spec.name, spec)
    return spec


def workflow_names() -> list[str]:
    return sorted(_REGISTRY)


def workflow_ref(name: str) -> WorkflowRef:
    """What `name` was registered as (register_workflow): its import path, or the function giving its spec;
    a KeyError for a name not registered."""
    return _REGISTRY[name]


def parse_workflow(
    section: Mapping[str, Any], defaults: Mapping[str, Any] | None = None, where: str = "workflow",
    stage: str | None = None,
) -> tuple[WorkflowSpec, Any]:
    """(spec, typed config) from a `workflow` section {name, <field>: value, ...}.

    Fields the section leaves out are filled from `defaults` (only those the workflow's config has), then
    from the spec's own defaults for `stage` ("train": spec.train_defaults, "eval": spec.eval_defaults).
    A `reward` field holding an import path is resolved first (memrl.rewards.verifiers.resolve_verifier).
    Errors name `where.<key>`."""
    values = dict(section)
    name = values.pop("name", None)
    if not name:
        raise ConfigError(f"{where}.name is required (one of {', '.join(workflow_names())}, or module:ATTR)")
    try:
        spec = get_workflow(str(name), f"{where}.name")
    except KeyError as e:
        raise ConfigError(f"{where}.name: {e.args[0]}") from e
    fields = spec.config_fields()
    if "options" in values and "options" not in fields:
        raise ConfigError(f"{where}.options.<field> is now spelled {where}.<field> (e.g. {where}.chunk_tokens=...)")
    renamed = getattr(spec.config_cls, "RENAMED", {})  # old spellings of moved fields: say the new one
    for k in values:
        if k in renamed and k not in fields:
            raise ConfigError(f"{where}.{k} is now spelled {where}.{renamed[k]}")
    if "reward" in fields and is_import_path(values.get("reward")):
        resolve_verifier(values["reward"], f"{where}.reward")  # one line naming the field, before the config
    for k, v in (defaults or {}).items():
        if k in fields:
            values.setdefault(k, v)
    if stage is not None:
        for k, v in spec.defaults(stage).items():
            values.setdefault(k, v)
    check_template_files(values, fields, where)
    return spec, section_from_dict(spec.config_cls, values, where)


def check_template_files(values: Mapping[str, Any], fields: set[str], where: str = "workflow") -> None:
    """Before the config is built (its templates are read then, or per task): a template given twice, inline
    (`X_template`, which presets set) and as a file (`X_template_file`), is refused rather than one silently
    ignored; and each template file must be a readable text file (templates.read_template_file)."""
    for key in sorted(k for k in fields if k.endswith("template_file")):
        inline = key.removesuffix("_file")
        path = values.get(key)
        if path is None:
            continue
        if inline in fields and values.get(inline) is not None:
            raise ConfigError(f"{where}.{key}={path} and {where}.{inline} are both set (a preset may set the inline "
                              f"one): keep one; add {where}.{inline}=null to use the file")
        try:
            read_template_file(path)
        except TemplateError as e:
            raise ConfigError(f"{where}.{key}: {e}") from e


def format_keys(specs: Iterable[WorkflowSpec] | None = None) -> tuple[str, ...]:
    """The format-error metric keys of `specs` (first occurrence order); None = every built-in workflow
    and every spec resolved in this process so far."""
    if specs is None:
        specs = [*(get_workflow(n) for n in BUILTIN_WORKFLOWS), *_SEEN.values()]
    return tuple(dict.fromkeys(k for s in specs for k in s.format_keys))


def report_sections(specs: Iterable[WorkflowSpec] | None = None) -> tuple[ReportSection, ...]:
    """The report sections of `specs` (first occurrence order); None = every built-in workflow's and every
    spec's resolved in this process so far."""
    if specs is None:
        specs = [*(get_workflow(n) for n in BUILTIN_WORKFLOWS), *_SEEN.values()]
    return tuple(dict.fromkeys(s.report for s in specs if s.report is not None))


def ask_workflows() -> tuple[str, ...]:
    """The built-in workflows `memrl ask` runs (WorkflowSpec.ask), in registration order."""
    return tuple(n for n in BUILTIN_WORKFLOWS if get_workflow(n).ask)


def format_counts(metrics: list[dict[str, float]], keys: Iterable[str] | None = None) -> dict[str, int]:
    """How many trajectories show each format error at least once (keys some trajectory reports); `keys`
    default to `format_keys()` (give a spec's own, `spec.format_keys`, to count only those)."""
    keys = format_keys() if keys is None else tuple(keys)
    return {k: sum(1 for m in metrics if m.get(k, 0.0) > 0) for k in keys if any(k in m for m in metrics)}


def boxed_em_outcome(task: Task, traj: Trajectory) -> float:
    """Outcome reward shared by the chunked workflows: the verifier named by `traj.info["reward"]` (the
    workflow's `reward` field: a name in memrl.rewards.verifiers or an import path of a @verifier
    function; `boxed_em` when absent) on the final answer text."""
    return get_verifier(traj.info.get("reward", "boxed_em"))(traj.info.get("answer_text", ""), task.answers)
