"""One recipe pipeline for every demo: init -> [copy warm-up] -> cold start -> evaluate -> RL -> evaluate -> write.

A recipe method (`Recipe`) declares only what differs between the demos: its configs and their checks
(`load`), its tasks, tokenizer and model (`init`), its scripted policy's held-out numbers (`scripted`), the
cold start's rows (`demonstrations`), its held-out evaluation (`evaluate`), and as data what results.json
holds (`results_json`) and its tables (`table`, `sweep`: memrl.recipes.tables). `run_recipe` runs the stages
in that order for every method and times each one; the copy warm-up, the cold-start SFT, RL and writing the
results are the same code for all.

Methods are registered like workflows: a built-in name (`memagent`, `memact`, `context`, `mem1`, `infmem`,
`lookback`) or an import path `package.module:ATTR` naming a Recipe instance, so a method living outside
memrl needs no edit here (docs/guides/recipe_method.md).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any, ClassVar

from memrl.config import (
    MAX_COUNT,
    MAX_LR,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TEMPERATURE,
    MAX_TOKENS,
    MAX_VOCAB,
    ConfigError,
    load_config,
    redact_secrets,
    to_yaml,
    valid,
)
from memrl.errors import UserError
from memrl.eval.evaluator import evaluation_rows
from memrl.eval.stats import stat
from memrl.locks import locked_dir
from memrl.models.tiny import ModelPreset
from memrl.plugins import is_import_path, load_object
from memrl.recipes import split_overrides
from memrl.recipes.cold_start import copy_warmup
from memrl.recipes.policy import check_policy, demo_shape_problem
from memrl.recipes.tables import RunTable, SweepTable, by_decoding
from memrl.threads import ThreadsSection, set_torch_threads, warn_oversubscribed
from memrl.training.assemble import assemble, check_writable, validate
from memrl.training.checkpoints.checkpoint import latest_checkpoint
from memrl.training.config import TrainConfig
from memrl.training.sft import SFTConfig, sft_train_logged
from memrl.training.trainer import Trainer
from memrl.types import Segment

# ---------------------------------------------------------------------------------------------- settings


@dataclass
class SFTSettings:
    """The cold start's optimiser settings, shared by every method (each method's SFT section extends it and
    may change the defaults)."""

    epochs: int = valid(2, ge=1, le=MAX_COUNT)
    lr: float = valid(1e-3, gt=0, le=MAX_LR)
    """Peak learning rate (linear warm-up, then the SFT schedule)."""
    batch_rows: int = valid(8, ge=1, le=MAX_COUNT)
    """Rows per SFT step."""
    warmup_steps: int = valid(20, ge=0, le=MAX_COUNT)

    def sft_config(self, seed: int) -> SFTConfig:
        """The SFTConfig of the cold start (shuffled with `seed`, the run's seed)."""
        return SFTConfig(epochs=self.epochs, batch_rows=self.batch_rows, lr=self.lr, warmup_steps=self.warmup_steps,
                         seed=seed)


@dataclass
class WarmupSFTSettings(SFTSettings):
    """SFTSettings plus the copy warm-up before the cold start (memrl.recipes.cold_start.copy_warmup)."""

    copy_warmup_steps: int = valid(0, ge=0, le=MAX_COUNT, note="0 = off")
    """Copy warm-up steps before the cold start: the induction heads a model trained from scratch needs to
    copy names and values. 0 = off."""
    copy_warmup_rows: int = valid(0, ge=0, le=MAX_COUNT, note="0 = 4 x batch_rows")
    """Rows per copy warm-up step; 0 = 4 x `batch_rows`."""

    def warmup_rows(self) -> int:
        return self.copy_warmup_rows or 4 * self.batch_rows


@dataclass
class TaskSFTSettings(WarmupSFTSettings):
    """WarmupSFTSettings plus the scripted policy's training tasks: how many and their seed."""

    num_tasks: int = valid(1000, ge=1, le=MAX_COUNT)
    seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the demonstration tasks."""


@dataclass
class EvalSettings:
    """The held-out evaluation every method shares: how many tasks, their seed (used by no training split)
    and the sampled decoding's temperature."""

    num_tasks: int = valid(100, ge=1, le=MAX_COUNT)
    """Held-out tasks (per length or count where the method evaluates several)."""
    seed: int = valid(987654, ge=0, le=MAX_SEED)
    """Seed of the held-out tasks and of the sampled evaluation (no training split uses it)."""
    temperature: float = valid(1.0, gt=0, le=MAX_TEMPERATURE)
    """The sampled evaluation's temperature (the RL rollouts' own)."""


@dataclass
class ModelShape:
    """The tiny Qwen2 a method trains from scratch (tied embeddings; the vocabulary is what BPE learns)."""

    hidden_size: int = valid(128, ge=1, le=65536)
    num_layers: int = valid(4, ge=1, le=1024)
    num_heads: int = valid(4, ge=1, le=1024)
    num_kv_heads: int = valid(2, ge=1, le="num_heads")
    vocab_size: int = valid(2048, ge=1, le=MAX_VOCAB)
    """BPE target; the trained vocabulary stops earlier when the task's text runs out of merges."""
    max_positions: int = valid(1024, ge=1, le=MAX_TOKENS)
    shape_key: ClassVar[str] = "model."  # where a config holds these fields, as its errors name them

    def __post_init__(self) -> None:
        problem = demo_shape_problem(self.hidden_size, self.num_heads, self.num_kv_heads, self.shape_key)
        if problem:
            raise ValueError(problem)

    def preset(self) -> ModelPreset:
        """The shape as a memrl.models.tiny ModelPreset (intermediate size 2 x hidden)."""
        return ModelPreset(self.vocab_size, self.hidden_size, 2 * self.hidden_size, self.num_layers, self.num_heads,
                           self.num_kv_heads, max_position_embeddings=self.max_positions)


@dataclass
class RecipeConfig:
    """The settings every method's demo config shares (it extends this class and declares only its own fields
    and the defaults it changes): the training seed, the RL preset and torch's threads."""

    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the tokenizer, the model's initial weights, the copy warm-up and the SFT order."""
    train_preset: str = ""
    threads: int = valid(0, ge=0, le=MAX_PARALLEL, note="0 = torch's default")
    """torch's threads for the whole run (0 = torch's default)."""


# ---------------------------------------------------------------------------------------------- a run


@dataclass
class RecipeRun:
    """The state the stages share: configs, parts, and what each stage produced."""

    cfg: Any
    """The method's demo config."""
    tcfg: Any
    """The RL config (memrl.training.config.TrainConfig)."""
    out: Path
    spec: Any = None
    wf_cfg: Any = None
    tokenizer: Any = None
    model: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    """The method's own state (tasks, budget, a reused cold start ...)."""
    reused: bool = False
    """The cold start (warm-up, SFT and its evaluation) comes from another run: `init` filled them in."""
    timings: dict[str, float] = field(default_factory=dict)
    warmup_losses: list[float] = field(default_factory=list)
    sft_losses: list[float] = field(default_factory=list)
    demo: Any = None
    """The cold start's statistics (`Recipe.demonstrations`' second value)."""
    evals: dict[str, Any] = field(default_factory=dict)
    """policy ("sft", "rl") -> what `Recipe.evaluate` returned."""
    history: list[dict[str, float]] = field(default_factory=list)
    """RL's per-step metrics."""


@contextmanager
def stage(run: RecipeRun, key: str) -> Iterator[None]:
    """Time the block into run.timings[key]."""
    t0 = time.perf_counter()
    yield
    run.timings[key] = time.perf_counter() - t0


def load_run(config: type, overrides: list[str], out_dir: str | Path, train: list[str] = ()) -> RecipeRun:
    """The run's configs: the demo config `config` from the demo overrides, the RL config from its
    `train_preset` with model.path = out/sft, out_dir = out/rl, `train` and then the training overrides;
    the RL config validated. Fails on a bad value before any work."""
    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(config, demo_ov)
    return load_train(cfg, train_ov, out_dir, train)


def load_train(cfg: Any, train_ov: list[str], out_dir: str | Path, train: list[str] = ()) -> RecipeRun:
    """`load_run` for a demo config already loaded."""
    out = check_writable(out_dir, "--out")
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", *train, *train_ov],
                       preset=cfg.train_preset)
    spec, wf_cfg = validate(tcfg)
    if tcfg.threads != ThreadsSection():
        raise ConfigError("train.threads.* is not read by memrl demo: its threads=N sets torch's threads for the "
                          "whole demo")
    return RecipeRun(cfg, tcfg, out, spec, wf_cfg)


def set_threads(cfg: Any) -> None:
    """torch's thread count from the demo config's `threads` (0 = torch's default), through memrl.threads
    as `memrl train`'s threads.intra_op."""
    if getattr(cfg, "threads", 0):
        warn_oversubscribed(cfg.threads, "threads")  # more threads than CPUs: said, as memrl train says it
        set_torch_threads(cfg.threads)


# ---------------------------------------------------------------------------------------------- methods


class Recipe:
    """A recipe method: what one demo declares. Subclass it and override the hooks; `run_recipe` calls them."""

    name: ClassVar[str] = ""
    config: ClassVar[type] = object
    """The demo config dataclass (`memrl demo --agent NAME key=value` sets its fields)."""
    seed_keys: ClassVar[tuple[tuple[str, str], ...]] = ()
    """The overrides a training seed of `--seeds` shifts: (override key, "demo" or "train": where its base
    value is read)."""
    task_seeds: ClassVar[tuple[str, ...]] = ()
    """The seed keys that generate training tasks (never equal to a held-out task seed)."""
    heldout_per: ClassVar[str] = ""
    """The eval field listing the held-out sets, set n drawn at eval.seed + n ("" = one set at eval.seed)."""
    heldout_files: ClassVar[str] = "data/heldout_tasks.jsonl"
    """The held-out file(s) `fingerprint` hashes; with "{}", one per entry of results.json's "lengths"."""
    outputs: ClassVar[tuple[str, ...]] = ("results.md", "results.json")
    """The files `write` makes in the output directory (printed when the run ends)."""
    summary_fields: ClassVar[tuple[str, ...]] = ("accuracy",)
    """The summary fields the seed sweep aggregates (memrl.recipes.seeds; `sweep`'s fields when it is set)."""
    optional_fields: ClassVar[tuple[str, ...]] = ()
    """Summary fields a run may lack (e.g. no task with that question count): skipped, not an error."""
    # ------------------------------------------------------------------ results, declared
    results_json: ClassVar[dict[str, Any]] = {}
    """What results.json holds, in order: key -> a dotted path over the RecipeRun ("cfg.eval.seed", "extra.budget",
    "evals.sft"; a dataclass is written as its dict), a dict of such declarations, or a callable of the run; a
    key ending in "?" is left out when its path is missing (`resolve`)."""
    policies: ClassVar[tuple[tuple[str, str], ...]] = (("sft", "sft"), ("rl", "rl"))
    """The results schema's policies: (policy, its key in results.json); sft and rl required, others where a
    run has them."""
    results_root: ClassVar[str] = ""
    """The results.json entry the policies' keys are under ("" = the top level)."""
    nesting: ClassVar[str] = "decoding"
    """How a policy's evaluation nests in results.json (memrl.recipes.tables.NESTINGS)."""
    table: ClassVar[RunTable | None] = None
    """results.md's table (`markdown`)."""
    sweep: ClassVar[SweepTable | None] = None
    """The seed sweep's table (`sweep_table`); its fields are the `summary_fields`."""
    sweep_extras: ClassVar[dict[str, tuple[str, str]]] = {}
    """Entries of the sweep's aggregate beside the cells: name -> ("mean", a dotted path in results.json: mean
    +- sd over the runs) or ("first", a path: the first run's value)."""
    json_indent: ClassVar[int] = 1
    json_newline: ClassVar[bool] = False
    """results.json's layout: its indent, and whether it ends in a newline."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("sweep") is not None and "summary_fields" not in cls.__dict__:
            cls.summary_fields = cls.sweep.fields  # type: ignore[union-attr]

    def load(self, overrides: list[str], out_dir: str | Path) -> RecipeRun:
        """Configs and their checks (fails before any work): `configs`, then what the method keeps beside them."""
        return self.configs(overrides, out_dir)

    def configs(self, overrides: list[str], out_dir: str | Path) -> RecipeRun:
        """The demo config from the demo overrides (after `expand`), checked by `check`; the RL config
        (`load_train` with `train_overrides`), checked by `check_run`; torch's threads set. Fails on a bad value
        before any work."""
        demo_ov, train_ov = split_overrides(self.expand(list(overrides)))
        cfg = load_config(self.config, demo_ov)
        self.check(cfg, train_ov)
        self.check_task_seeds(cfg)
        run = load_train(cfg, train_ov, out_dir, self.train_overrides(cfg, out_dir))
        self.check_run(run)
        check_policy(run.cfg, run.tcfg, run.wf_cfg)  # the RL stage's model checks, before any stage (recipes.policy)
        set_threads(run.cfg)
        return run

    def expand(self, overrides: list[str]) -> list[str]:
        """The overrides a command line's stand for (e.g. a named variant's, put first)."""
        return overrides

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        """Refuse a demo config (or a training override) the method cannot run, before the RL config loads."""

    def training_task_seeds(self, cfg: Any) -> dict[str, int]:
        """The training task seeds `check_task_seeds` refuses when held-out (its name in the message -> value)."""
        return {}

    def check_task_seeds(self, cfg: Any) -> None:
        """Refuse a training task seed (`training_task_seeds`) that is a held-out one (after `check`)."""
        held = self.heldout_seeds(cfg)
        for what, seed in self.training_task_seeds(cfg).items():
            needs(seed not in held, f"{what} {seed} is a held-out task seed ({', '.join(map(str, sorted(held)))}): "
                  "the training tasks would be held-out ones")

    def train_overrides(self, cfg: Any, out_dir: str | Path) -> list[str]:
        """The RL config's overrides the method sets (before the command line's, which win)."""
        return []

    def check_run(self, run: RecipeRun) -> None:
        """Refuse an RL config the method cannot run (may also set what the method derives: run.tcfg, run.spec,
        run.wf_cfg)."""

    @staticmethod
    def need_workflow(run: RecipeRun, name: str, why: str = "") -> None:
        """Refuse an RL config whose workflow is not `name` (`why` follows the name in the message)."""
        needs(run.spec.name == name, f"workflow.name must be {name}{why}, got {run.spec.name!r}")

    @staticmethod
    def overridden(train_overrides: list[str], key: str) -> str:
        """The first training override that sets `key` or a key under it ("" when none): a setting the
        method makes and the command line may not."""
        return next((ov for ov in train_overrides if (k := ov.split("=", 1)[0]) == key or k.startswith(key + ".")),
                    "")

    def init(self, run: RecipeRun) -> None:
        """Tasks, tokenizer and model (run.tokenizer, run.model); run.reused = True when the cold start is
        another run's (then fill run.warmup_losses, run.sft_losses, run.demo, run.evals["sft"])."""
        raise NotImplementedError

    def scripted(self, run: RecipeRun) -> None:
        """Held-out numbers of the scripted policy (optional; kept in run.extra)."""

    save_warmup: ClassVar[bool] = True
    """Whether the copy warm-up's model is saved to out/copy_warmup (a later run may reuse it)."""

    def warmup(self, run: RecipeRun) -> list[float]:
        """The copy warm-up (`sft.copy_warmup_steps` > 0) at `sft.copy_warmup_lr` where the SFT section has one
        (else `sft.lr`); saves the model to out/copy_warmup when `save_warmup`."""
        s = run.cfg.sft
        steps = getattr(s, "copy_warmup_steps", 0)
        if not steps:
            return []
        losses = copy_warmup(run.model, run.tokenizer, steps, s.warmup_rows(), getattr(s, "copy_warmup_lr", s.lr),
                             run.cfg.seed, run.out / "copy_warmup", progress=run.tcfg.trainer.progress)
        if self.save_warmup:
            run.model.save_pretrained(run.out / "copy_warmup")
        return losses

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], Any]:
        """(the cold start's rows, its statistics): the scripted policy played through the workflow (`play`),
        every row of each task's one trajectory as the workflow cuts it; the statistics are {"summary":
        `demo_summary` of the groups' rows, "rows", "rows_per_task", **`demo_extra`}; a line is printed with the
        summary's accuracy and `demo_format` (and the workflow's name where `demo_names_workflow`)."""
        groups = self.play(run)
        trajs, summary = [g.trajectories[0] for g in groups], self.demo_summary(evaluation_rows(groups))
        rows = [s for t in trajs for s in t.segments]
        name = f"{run.spec.name} " if self.demo_names_workflow else ""
        print(f"cold start: {len(rows)} rows from {len(groups)} scripted {name}trajectories (its accuracy "
              f"{summary['accuracy']:.1f}%, {self.demo_format.format(**summary)})")
        return rows, {"summary": summary, "rows": len(rows), "rows_per_task": [len(t.segments) for t in trajs],
                      **self.demo_extra(run, trajs)}

    demo_format: ClassVar[str] = ""
    """The cold start line's numbers after the scripted accuracy (str.format over the summary)."""
    demo_names_workflow: ClassVar[bool] = False

    def play(self, run: RecipeRun) -> list[Any]:
        """The scripted policy over the SFT tasks through the workflow: one Group (one trajectory) per task."""
        raise NotImplementedError

    def demo_summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """The summary of the scripted groups' rows (memrl.eval.evaluator.evaluation_rows; its "accuracy" in %)."""
        raise NotImplementedError

    def demo_extra(self, run: RecipeRun, trajs: list[Any]) -> dict[str, Any]:
        """Statistics of the cold start beside the summary and the row counts."""
        return {}

    def sft_tensorboard(self, run: RecipeRun) -> bool:
        """Whether the cold start also logs to TensorBoard (its metrics.jsonl is always written)."""
        return False

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> Any:
        """Held-out evaluation of `model` (policy "sft" or "rl")."""
        raise NotImplementedError

    def results(self, run: RecipeRun) -> dict[str, Any]:
        """What results.json holds (`results_json`)."""
        out: dict[str, Any] = {}
        for key, spec in self.results_json.items():
            try:
                held = spec is HELDOUT_SHA256  # over the entries declared before it
                out[key.removesuffix("?")] = self.fingerprint(run.out, out) if held else resolve(run, spec)
            except KeyError:
                if not key.endswith("?"):
                    raise
        return out

    def markdown(self, results: dict[str, Any]) -> str:
        """results.md (`table`)."""
        if self.table is None:
            raise NotImplementedError(f"{type(self).__name__}: no table declared")
        return self.table.render(results, self.nesting)

    def plot(self, results: dict[str, Any], out: Path) -> None:
        """The method's plots in `out` (beside results.md; list them in `outputs`)."""

    # ------------------------------------------------------------------ reading results (the seed sweep)

    def evals(self, results: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        """The one results schema: policy ("sft", "rl", a scripted one) -> decoding -> bucket (a length, an
        objective count, "all") -> summary, read from a results.json (a KeyError when it lacks a part): the
        declared `policies` under `results_root`, as `nesting` says they nest."""
        root = results[self.results_root] if self.results_root else results
        return {p: by_decoding(root[key], self.nesting) for p, key in self.policies
                if key in root or p in ("sft", "rl")}

    def heldout_seeds(self, cfg: Any) -> set[int]:
        """The seeds held-out tasks are drawn from (no training task seed may equal one; `heldout_per`)."""
        return {cfg.eval.seed + n for n in getattr(cfg.eval, self.heldout_per)} if self.heldout_per else {cfg.eval.seed}

    def check_sweep(self, cfg: Any) -> None:
        """Refuse settings the sweep's table cannot aggregate (before any run)."""

    def fingerprint(self, out: Path, results: dict[str, Any]) -> str:
        """What must be equal across a sweep's runs for their held-out numbers to be comparable: the SHA-256
        of the held-out task files (`heldout_files`)."""
        each = results["lengths"] if "{}" in self.heldout_files else [""]
        return files_sha256([out / self.heldout_files.format(n) for n in each])

    def sweep_extra(self, done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
        """Entries of the sweep's per-capability aggregate beside the cells (`sweep_extras`)."""
        out: dict[str, Any] = {}
        for name, (how, path) in self.sweep_extras.items():
            if how == "first":
                out[name] = _path(done[0][1], path) if done else None
                continue
            values = []
            for run_dir, res in done:
                try:
                    values.append(float(_path(res, path)))
                except (KeyError, TypeError, AttributeError):
                    raise UserError(f"{run_dir / 'results.json'}: no {path}") from None
            out[name] = stat(values)
        return out

    def sweep_table(self, entry: dict[str, Any]) -> list[str]:
        """The seed sweep's table (markdown lines) of one capability's aggregate (memrl.recipes.seeds; `sweep`)."""
        if self.sweep is None:
            raise NotImplementedError(f"{type(self).__name__}: no sweep table declared")
        return self.sweep.render(entry)

    def write(self, results: dict[str, Any], out: Path) -> str:
        """Write results.json (secrets redacted), results.md and the method's plots; returns the markdown."""
        text = json.dumps(redact_secrets(results), indent=self.json_indent) + ("\n" if self.json_newline else "")
        (out / "results.json").write_text(text, encoding="utf-8")
        md = self.markdown(results)
        (out / "results.md").write_text(md, encoding="utf-8")
        self.plot(results, out)
        return md


class _HeldoutSha256:
    def __repr__(self) -> str:
        return "HELDOUT_SHA256"


HELDOUT_SHA256 = _HeldoutSha256()
"""A results.json declaration: the run's `Recipe.fingerprint` over the entries declared before it (the SHA-256
of its held-out task files, `heldout_files`), the value the seed sweep checks across runs."""


def files_sha256(paths: list[Path]) -> str:
    """The SHA-256 of the files' bytes one after another (a run's held-out task files: `Recipe.fingerprint`)."""
    digest = hashlib.sha256()
    for path in paths:
        if not path.is_file():
            raise UserError(f"{path}: missing; cannot check that the run evaluated the same held-out tasks")
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _path(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def resolve(run: RecipeRun, spec: Any) -> Any:
    """A results.json entry from its declaration (`Recipe.results_json`): a callable of the run, a dict of
    declarations, or a dotted path over the run (dict keys or attributes; a dataclass becomes its dict)."""
    if callable(spec):
        return spec(run)
    if isinstance(spec, dict):
        return {k: resolve(run, v) for k, v in spec.items()}
    value = _path(run, spec)
    return asdict(value) if is_dataclass(value) and not isinstance(value, type) else value


# ---------------------------------------------------------------------------------------------- the pipeline


def cold_start(run: RecipeRun, rows: list[Segment], tensorboard: bool = False) -> list[float]:
    """SFT on the scripted policy's rows; saves the model to out/sft and returns the per-step losses."""
    out = run.out / "sft"
    return sft_train_logged(run.model, run.tokenizer, rows, run.cfg.sft.sft_config(run.cfg.seed), out,
                            progress=run.tcfg.trainer.progress, tensorboard=tensorboard, save_dir=out)


def train_rl(run: RecipeRun) -> Trainer:
    """RL from the cold start (out/sft) with the run's RL config; run.history gets its per-step metrics."""
    trainer = Trainer(assemble(run.tcfg, workflow=(run.spec, run.wf_cfg)))
    run.history = trainer.fit()
    return trainer


def execute(recipe: Recipe, run: RecipeRun) -> dict[str, Any]:
    """The stages on a loaded run; returns what results.json holds (the caller writes it)."""
    t_start = time.perf_counter()
    with stage(run, "init_s"):
        recipe.init(run)
    if not run.reused:
        with stage(run, "eval_scripted_s"):
            recipe.scripted(run)
        with stage(run, "copy_warmup_s"):
            run.warmup_losses = recipe.warmup(run)
        with stage(run, "sft_s"):
            rows, run.demo = recipe.demonstrations(run)
            run.sft_losses = cold_start(run, rows, tensorboard=recipe.sft_tensorboard(run))
        with stage(run, "eval_sft_s"):
            run.evals["sft"] = recipe.evaluate(run, "sft", run.model, run.out / "sft")
    with stage(run, "rl_s"):
        trainer = train_rl(run)
    with stage(run, "eval_rl_s"):
        run.evals["rl"] = recipe.evaluate(run, "rl", trainer.model, latest_checkpoint(trainer.ckpt_root) or "")
    run.timings["total_s"] = time.perf_counter() - t_start
    return recipe.results(run)


def run_recipe(recipe: Recipe | str, out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run one method's demo: load its configs (a bad value fails before any work), then, with the output
    directory locked (memrl.locks), write demo_config.yaml, run the stages and write its outputs."""
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    run = recipe.load(list(overrides), out_dir)
    with locked_dir(run.out, "--out"):  # one demo per directory
        (run.out / "demo_config.yaml").write_text(to_yaml(run.cfg), encoding="utf-8")
        results = execute(recipe, run)
        text = recipe.write(results, run.out)
    print(text, end="" if text.endswith("\n") else "\n")
    print(f"wrote {', '.join(str(run.out / f) for f in recipe.outputs)} ({run.timings['total_s'] / 60:.1f} min)")
    return results


# ---------------------------------------------------------------------------------------------- the registry

BUILTIN: dict[str, str] = {
    "memagent": "memrl.recipes.memagent:RECIPE",
    "memact": "memrl.recipes.memact:RECIPE",
    "context": "memrl.recipes.context:RECIPE",
    "mem1": "memrl.recipes.mem1:RECIPE",
    "infmem": "memrl.recipes.infmem:RECIPE",
    "lookback": "memrl.recipes.lookback:RECIPE",
}
"""The built-in methods, by import path (imported when first named)."""

_REGISTERED: dict[str, Recipe | str] = {}


def register_recipe(name: str, recipe: Recipe | str) -> None:
    """Register a method under `name` (a Recipe instance or the import path of one)."""
    if not name or ":" in name:
        raise ConfigError(f"register_recipe: a method name is a plain word, got {name!r}")
    _REGISTERED[name] = recipe


def recipe_names() -> list[str]:
    """The registered method names, built-ins first."""
    return [*BUILTIN, *(n for n in _REGISTERED if n not in BUILTIN)]


def get_recipe(name: str, where: str = "--agent") -> Recipe:
    """The method `name` names: a registered name or an import path `package.module:ATTR` of a Recipe."""
    ref: Recipe | str | None = _REGISTERED.get(name, BUILTIN.get(name))
    if ref is None and is_import_path(name):
        ref = name
    if ref is None:
        raise ConfigError(f"{where}: unknown recipe method {name!r}; one of {', '.join(recipe_names())} or an "
                          "import path package.module:ATTR naming a memrl.recipes.pipeline.Recipe")
    if isinstance(ref, Recipe):
        return ref
    return load_object(ref, where, "a memrl.recipes.pipeline.Recipe", lambda o: isinstance(o, Recipe),
                       hint="an instance of a Recipe subclass")


def needs(cond: bool, message: str) -> None:
    """A one-line ConfigError with `message` unless `cond`."""
    if not cond:
        raise ConfigError(message)
