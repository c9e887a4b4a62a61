"""One recipe pipeline for every demo: init -> [copy warm-up] -> cold start -> evaluate -> RL -> evaluate -> write.

A recipe method (`Recipe`) declares only what differs between the demos: its configs and their checks
(`check`, `check_run` ...: `load_recipe`), its tasks, tokenizer and model (`init`), its scripted policy's held-out rows (`scripted`), the
cold start's rows (`demonstrations`), its held-out evaluation's rows (`evaluate`), the `fields` its summary
reduces those rows to (memrl.eval.fields) and its tables (`table`, `sweep`: memrl.recipes.tables). Its own run
facts (a budget, lengths, streams ...) go into run.facts. `run_recipe` runs the stages in that order for every
method and times each one; the copy warm-up, the cold-start SFT, RL and results.json (one layout for every
method: `results`) are the same code for all: module functions here, not hooks.

Methods are registered like workflows: a built-in name (`memagent`, `memact`, `context`, `mem1`, `infmem`,
`lookback`) or an import path `package.module:ATTR` naming a Recipe instance, so a method living outside
memrl needs no edit here (docs/guides/recipe_method.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping
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
from memrl.eval.evaluator import evaluation_rows
from memrl.eval.fields import POOLED, Field, summary_rows
from memrl.locks import locked_dir
from memrl.models.tiny import ModelPreset
from memrl.plugins import is_import_path, load_object
from memrl.recipes import split_overrides
from memrl.recipes.cold_start import copy_warmup
from memrl.recipes.policy import check_policy, demo_shape_problem
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
    """The method's own working state (tasks, a reused cold start ...): never written."""
    facts: dict[str, Any] = field(default_factory=dict)
    """The method's own run facts (budget, streams, lengths, calibrations ...): results.json's "facts"."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Every evaluation row of the run (memrl.eval.evaluator.evaluation_rows), in the order made: results.json's
    "summary" is their group-by (memrl.eval.fields.summary_rows)."""
    reused: bool = False
    """The cold start (warm-up, SFT and its evaluation) comes from another run: `init` filled them in."""
    timings: dict[str, float] = field(default_factory=dict)
    warmup_losses: list[float] = field(default_factory=list)
    sft_losses: list[float] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)
    """RL's per-step metrics."""
    num_parameters: int = 0
    """The trained model's parameter count (set once RL has run)."""


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


@dataclass(frozen=True)
class MethodSettings:
    """The small declarations a method makes beside its hooks (`Recipe.settings`; the defaults suit most)."""

    seed_keys: tuple[tuple[str, str], ...] = ()
    """The overrides a training seed of `--seeds` shifts: (override key, "demo" or "train": where its base
    value is read)."""
    task_seeds: tuple[str, ...] = ()
    """The seed keys that generate training tasks (never equal to a held-out task seed)."""
    heldout_per: str = ""
    """The eval field listing the held-out sets, set n drawn at eval.seed + n ("" = one set at eval.seed)."""
    outputs: tuple[str, ...] = ("results.md", "results.json")
    """The files `write` makes in the output directory (printed when the run ends)."""
    pooled: bool = False
    """Whether the summary also has a pooled "all" bucket per (policy, decoding) (memrl.eval.fields.summary_rows)."""
    train_keys: tuple[str, ...] = ("workflow", "algorithm.name")
    """The RL config's entries results.json's "train" holds (dotted paths, nested there as in the config:
    "trainer.steps" -> {"trainer": {"steps": ...}}; a dataclass as its dict)."""
    sweep_extras: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Entries of the sweep's aggregate beside the cells: name -> ("mean", a dotted path in results.json, e.g.
    "facts.budget.max_context_tokens": mean +- sd over the runs) or ("first", a path: the first run's value)."""
    save_warmup: bool = True
    """Whether the copy warm-up's model is saved to out/copy_warmup (a later run may reuse it)."""
    demo_format: str = ""
    """The cold start line's numbers after the scripted accuracy (str.format over its summary; `play_demonstrations`)."""
    demo_names_workflow: bool = False
    """Whether the cold start line names the workflow."""
    sft_tensorboard: bool = False
    """Whether the cold start also logs to TensorBoard where the RL config's trainer.tensorboard is on (its
    metrics.jsonl is always written)."""


class Recipe:
    """A recipe method: what one demo declares. Subclass it and override the hooks; `run_recipe` calls them.

    The declarations: `name`, `config`, `settings` (MethodSettings), the `fields` of its summary (`fields_for`),
    its tables (`table`, `sweep`). The hooks: the config checks (`expand`, `check`, `training_task_seeds`,
    `train_overrides`, `check_run`, `check_sweep`), `init`, `scripted`, `warmup`, `demonstrations` (or `play`),
    `evaluate` and `plot`. Every evaluation returns rows (memrl.eval.evaluator.evaluate_rows); the method fills
    run.facts with its own run facts. The rest is the pipeline's, the same for every method (module functions:
    `load_recipe`, `results`, `write` ...): results.json has ONE layout for every method."""

    name: ClassVar[str] = ""
    config: ClassVar[type] = object
    """The demo config dataclass (`memrl demo --agent NAME key=value` sets its fields)."""
    settings: ClassVar[MethodSettings] = MethodSettings()
    fields: ClassVar[tuple[Field, ...]] = ()
    """The summary's fields (memrl.eval.fields): each a name and a reducer over one (policy, decoding, bucket)
    group of the run's evaluation rows; results.json's "summary" rows hold them, the tables show them."""
    table: ClassVar[Any] = None
    """results.md's table (memrl.recipes.tables.RunTable, GridTable or CustomTable: `render(results)`)."""
    sweep: ClassVar[Any] = None
    """The seed sweep's table (memrl.recipes.tables.SweepTable, or a Sweep: its `fields`, `policies` and
    `render(entry)`: memrl.recipes.seeds renders one per capability)."""

    def fields_for(self, cfg: Any) -> tuple[Field, ...]:
        """The summary's fields of a run of demo config `cfg`: `fields` (a method whose fields follow its
        config, e.g. one accuracy per question count its tasks draw, adds them here)."""
        return self.fields

    # ------------------------------------------------------------------ config checks (`load_recipe` calls them)

    def expand(self, overrides: list[str]) -> list[str]:
        """The overrides a command line's stand for (e.g. a named variant's, put first)."""
        return overrides

    def check(self, cfg: Any, train_overrides: list[str]) -> None:
        """Refuse a demo config (or a training override) the method cannot run, before the RL config loads."""

    def training_task_seeds(self, cfg: Any) -> dict[str, int]:
        """The training task seeds `check_task_seeds` refuses when held-out (its name in the message -> value)."""
        return {}

    def train_overrides(self, cfg: Any, out_dir: str | Path) -> list[str]:
        """The RL config's overrides the method sets (before the command line's, which win)."""
        return []

    def check_run(self, run: RecipeRun) -> None:
        """Refuse an RL config the method cannot run (may also set what the method derives: run.tcfg, run.spec,
        run.wf_cfg)."""

    def check_sweep(self, cfg: Any) -> None:
        """Refuse settings the sweep's table cannot aggregate (before any run)."""

    # ------------------------------------------------------------------ the stages (`execute` calls them)

    def init(self, run: RecipeRun) -> None:
        """Tasks, tokenizer and model (run.tokenizer, run.model); run.reused = True when the cold start is
        another run's (then fill run.warmup_losses, run.sft_losses, run.facts["cold_start"] and run.rows with
        its SFT evaluation's rows)."""
        raise NotImplementedError

    def scripted(self, run: RecipeRun) -> list[dict[str, Any]]:
        """Held-out evaluation rows of the scripted policy (optional; their policy column names it)."""
        return []

    def warmup(self, run: RecipeRun) -> list[float]:
        """The copy warm-up's per-step losses (`copy_warmup_stage`)."""
        return copy_warmup_stage(self, run)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], Any]:
        """(the cold start's rows, its statistics or None): `play_demonstrations` (the scripted policy played
        through the workflow by `play`)."""
        return play_demonstrations(self, run)

    def play(self, run: RecipeRun) -> list[Any]:
        """The scripted policy over the SFT tasks through the workflow: one Group (one trajectory) per task."""
        raise NotImplementedError

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        """Held-out evaluation rows of `model` (policy "sft" or "rl"; memrl.eval.evaluator.evaluate_rows, labelled
        with memrl.recipes.parts.policy_labels). A method may add rows of other policies it evaluates beside."""
        raise NotImplementedError

    def plot(self, results: dict[str, Any], out: Path) -> None:
        """The method's plots in `out` (beside results.md; list them in `settings.outputs`)."""


# ---------------------------------------------------------------------------------------------- configs and checks


def load_recipe(recipe: Recipe, overrides: list[str], out_dir: str | Path) -> RecipeRun:
    """A method's configs and their checks (fails on a bad value before any work): the demo config from the
    demo overrides (after `expand`), checked by `check` and `check_task_seeds`; the RL config (`load_train` with
    `train_overrides`), checked by `check_run` and memrl.recipes.policy.check_policy; torch's threads set."""
    demo_ov, train_ov = split_overrides(recipe.expand(list(overrides)))
    cfg = load_config(recipe.config, demo_ov)
    recipe.check(cfg, train_ov)
    check_task_seeds(recipe, cfg)
    run = load_train(cfg, train_ov, out_dir, recipe.train_overrides(cfg, out_dir))
    recipe.check_run(run)
    check_policy(run.cfg, run.tcfg, run.wf_cfg)  # the RL stage's model checks, before any stage (recipes.policy)
    set_threads(run.cfg)
    return run


def heldout_seeds(recipe: Recipe, cfg: Any) -> set[int]:
    """The seeds held-out tasks are drawn from (no training task seed may equal one; `settings.heldout_per`)."""
    per = recipe.settings.heldout_per
    return {cfg.eval.seed + n for n in getattr(cfg.eval, per)} if per else {cfg.eval.seed}


def check_task_seeds(recipe: Recipe, cfg: Any) -> None:
    """Refuse a training task seed (`training_task_seeds`) that is a held-out one."""
    held = heldout_seeds(recipe, cfg)
    for what, seed in recipe.training_task_seeds(cfg).items():
        needs(seed not in held, f"{what} {seed} is a held-out task seed ({', '.join(map(str, sorted(held)))}): "
              "the training tasks would be held-out ones")


def need_workflow(run: RecipeRun, name: str, why: str = "") -> None:
    """Refuse an RL config whose workflow is not `name` (`why` follows the name in the message)."""
    needs(run.spec.name == name, f"workflow.name must be {name}{why}, got {run.spec.name!r}")


def overridden(train_overrides: list[str], key: str) -> str:
    """The first training override that sets `key` or a key under it ("" when none): a setting the method makes
    and the command line may not."""
    return next((ov for ov in train_overrides if (k := ov.split("=", 1)[0]) == key or k.startswith(key + ".")), "")


# ---------------------------------------------------------------------------------------------- default stage bodies


def copy_warmup_stage(recipe: Recipe, run: RecipeRun) -> list[float]:
    """The copy warm-up (`sft.copy_warmup_steps` > 0) at `sft.copy_warmup_lr` where the SFT section has one
    (else `sft.lr`); saves the model to out/copy_warmup when `settings.save_warmup`."""
    s = run.cfg.sft
    steps = getattr(s, "copy_warmup_steps", 0)
    if not steps:
        return []
    losses = copy_warmup(run.model, run.tokenizer, steps, s.warmup_rows(), getattr(s, "copy_warmup_lr", s.lr),
                         run.cfg.seed, run.out / "copy_warmup", progress=run.tcfg.trainer.progress)
    if recipe.settings.save_warmup:
        run.model.save_pretrained(run.out / "copy_warmup")
    return losses


def play_demonstrations(recipe: Recipe, run: RecipeRun,
                        extra: Callable[[list[Any]], dict[str, Any]] | None = None) -> tuple[list[Segment], Any]:
    """(the cold start's rows, its statistics): the scripted policy played through the workflow (`play`),
    every row of each task's one trajectory as the workflow cuts it; the statistics (run.facts' "cold_start")
    are {"summary": the `fields` of the played groups' rows (one summary row, policy "cold_start"), "rows",
    "rows_per_task", **`extra`(the trajectories)}; a line is printed with the summary's accuracy and
    `settings.demo_format` (and the workflow's name where `settings.demo_names_workflow`)."""
    groups = recipe.play(run)
    trajs = [g.trajectories[0] for g in groups]
    summary = summary_rows(evaluation_rows(groups, policy="cold_start", bucket=POOLED), recipe.fields_for(run.cfg))[0]
    rows = [s for t in trajs for s in t.segments]
    decl = recipe.settings
    name = f"{run.spec.name} " if decl.demo_names_workflow else ""
    print(f"cold start: {len(rows)} rows from {len(groups)} scripted {name}trajectories (its accuracy "
          f"{summary['accuracy']:.1f}%, {decl.demo_format.format(**summary)})")
    return rows, {"summary": summary, "rows": len(rows), "rows_per_task": [len(t.segments) for t in trajs],
                  **(extra(trajs) if extra else {})}


# ---------------------------------------------------------------------------------------------- the outputs


def results(recipe: Recipe, run: RecipeRun) -> dict[str, Any]:
    """What results.json holds, the one layout of every method:

    {"recipe": the method's name, "method": the config's `method` (the arm) where it has one, else the name,
    "config": the demo config as a dict, "train": the RL config's `settings.train_keys`, "facts": run.facts,
    "timings", "losses": {"sft", "copy_warmup"}, "history": RL's per-step metrics, "num_parameters",
    "vocab_size", "heldout_sha256": the distinct held-out digests the rows carry, "summary": the rows
    grouped by (policy, decoding, bucket) and reduced by `fields` (memrl.eval.fields.summary_rows)}."""
    cfg, tcfg = run.cfg, run.tcfg
    return {
        "recipe": recipe.name, "method": getattr(cfg, "method", recipe.name), "config": _plain(cfg),
        "train": _subset(tcfg, recipe.settings.train_keys), "facts": run.facts,
        "timings": run.timings, "losses": {"sft": run.sft_losses, "copy_warmup": run.warmup_losses},
        "history": run.history, "num_parameters": run.num_parameters,
        "vocab_size": len(run.tokenizer) if run.tokenizer is not None else 0,
        "heldout_sha256": list(dict.fromkeys(r["heldout_sha256"] for r in run.rows if r.get("heldout_sha256"))),
        "summary": summary_rows(run.rows, recipe.fields_for(cfg), recipe.settings.pooled)}


def markdown(recipe: Recipe, results: dict[str, Any]) -> str:
    """results.md: the method's `table` rendered over `results`."""
    if recipe.table is None:
        raise NotImplementedError(f"{type(recipe).__name__}: no table declared")
    return recipe.table.render(results)


def write(recipe: Recipe, results: dict[str, Any], out: Path) -> str:
    """Write results.json (secrets redacted; indent 1, a newline at the end), results.md and the method's
    plots; returns the markdown."""
    (out / "results.json").write_text(json.dumps(redact_secrets(results), indent=1) + "\n", encoding="utf-8")
    md = markdown(recipe, results)
    (out / "results.md").write_text(md, encoding="utf-8")
    recipe.plot(results, out)
    return md


def path_of(obj: Any, dotted: str) -> Any:
    """The entry `dotted` ("facts.budget.max_context_tokens") of nested dicts or attributes."""
    for part in dotted.split("."):
        obj = obj[part] if isinstance(obj, dict) else getattr(obj, part)
    return obj


def _subset(obj: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    """The entries `keys` (dotted paths) of a config, nested as the config nests them ("trainer.steps" ->
    {"trainer": {"steps": ...}})."""
    out: dict[str, Any] = {}
    for key in keys:
        *parents, last = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = _plain(path_of(obj, key))
    return out


def _plain(value: Any) -> Any:
    """A dataclass as its dict, a mapping as a dict (results.json's config and train entries)."""
    if is_dataclass(value) and not isinstance(value, type):
        return asdict(value)
    return dict(value) if isinstance(value, dict) else value


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
            run.rows += recipe.scripted(run)
        with stage(run, "copy_warmup_s"):
            run.warmup_losses = recipe.warmup(run)
        with stage(run, "sft_s"):
            rows, demo = recipe.demonstrations(run)
            if demo is not None:
                run.facts["cold_start"] = demo
            tensorboard = recipe.settings.sft_tensorboard and run.tcfg.trainer.tensorboard
            run.sft_losses = cold_start(run, rows, tensorboard=tensorboard)
        with stage(run, "eval_sft_s"):
            run.rows += recipe.evaluate(run, "sft", run.model, run.out / "sft")
    with stage(run, "rl_s"):
        trainer = train_rl(run)
    with stage(run, "eval_rl_s"):
        run.rows += recipe.evaluate(run, "rl", trainer.model, latest_checkpoint(trainer.ckpt_root) or "")
    run.num_parameters = sum(p.numel() for p in (run.model if run.model is not None else trainer.model).parameters())
    run.timings["total_s"] = time.perf_counter() - t_start
    return results(recipe, run)


def run_recipe(recipe: Recipe | str, out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run one method's demo: load its configs (a bad value fails before any work), then, with the output
    directory locked (memrl.locks), write demo_config.yaml, run the stages and write its outputs."""
    recipe = get_recipe(recipe) if isinstance(recipe, str) else recipe
    run = load_recipe(recipe, list(overrides), out_dir)
    with locked_dir(run.out, "--out"):  # one demo per directory
        (run.out / "demo_config.yaml").write_text(to_yaml(run.cfg), encoding="utf-8")
        res = execute(recipe, run)
        text = write(recipe, res, run.out)
    print(text, end="" if text.endswith("\n") else "\n")
    outputs = ", ".join(str(run.out / f) for f in recipe.settings.outputs)
    print(f"wrote {outputs} ({run.timings['total_s'] / 60:.1f} min)")
    return res


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
