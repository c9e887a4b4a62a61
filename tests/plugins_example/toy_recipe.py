"""A toy recipe method: MemAgent on the synthetic task, cold-started on the question-aware rule, evaluated
greedy at the training length (docs/guides/recipe_method.md, followed by tests/unit/test_recipe_pipeline.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from memrl.config import MAX_COUNT, MAX_SEED, valid
from memrl.data.synthetic import corpus_text, make_tasks, tasks_by_length
from memrl.demonstrators.stages import mixture_demonstrator, record_demonstrations
from memrl.eval.evaluator import evaluate_rows
from memrl.eval.fields import Field, accuracy, tasks
from memrl.models.tiny import ModelPreset
from memrl.recipes.parts import engine_eval
from memrl.recipes.pipeline import EvalSettings, MethodSettings, Recipe, RecipeRun, SFTSettings
from memrl.recipes.scratch import init_model
from memrl.recipes.tables import RunTable, SweepTable


@dataclass
class ToySFT(SFTSettings):
    num_tasks: int = valid(40, ge=1, le=MAX_COUNT)
    seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the demonstration tasks."""


@dataclass
class ToyConfig:
    sft: ToySFT = field(default_factory=ToySFT)
    eval: EvalSettings = field(default_factory=lambda: EvalSettings(num_tasks=8))
    hidden_size: int = valid(32, ge=2, le=1024)
    seed: int = valid(0, ge=0, le=MAX_SEED)
    train_preset: str = "demo_cpu"


class ToyRecipe(Recipe):
    name = "toy"
    config = ToyConfig
    # the seeds a training seed of --seeds shifts, and those that make training tasks
    settings = MethodSettings(seed_keys=(("seed", "demo"), ("sft.seed", "demo"), ("train.trainer.seed", "train")),
                              task_seeds=("sft.seed",))
    # the fields of its summary over rows (memrl.eval.fields), results.md's table and the seed sweep's table
    fields = (Field("accuracy", accuracy()), Field("num_tasks", tasks()))
    table = RunTable((("accuracy (%)", "{accuracy:.1f}"),), (("SFT", "sft"), ("SFT + RL", "rl")), bucket="length")
    sweep = SweepTable((("accuracy (%)", "accuracy", 1),), bucket="length")

    def init(self, run: RecipeRun) -> None:
        syn, h = run.tcfg.data.synthetic, run.cfg.hidden_size
        run.extra["heldout"] = tasks_by_length(syn, [syn.num_chunks], run.cfg.eval.num_tasks, run.cfg.eval.seed)
        run.facts["lengths"] = list(run.extra["heldout"])  # a run fact: results.json's facts
        shape = ModelPreset(2048, h, 2 * h, 1, 2, 1, max_position_embeddings=1024)
        run.tokenizer, run.model = init_model(run.out, shape, 2048, run.cfg.seed,
                                              lambda extra: corpus_text(seed=run.cfg.seed, extra=extra), chat=False)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Any], dict[str, int]]:
        syn = run.tcfg.data.synthetic
        rule = mixture_demonstrator(run.wf_cfg, seed=run.cfg.seed, p_aware=1.0, fact_sep=syn.fact_sep)
        tasks = make_tasks(syn, run.cfg.sft.num_tasks, seed=run.cfg.sft.seed)
        groups = record_demonstrations(rule, tasks, run.tokenizer, run.wf_cfg)
        rows = [s for g in groups for s in g.segments()]
        return rows, {"tasks": len(groups), "rows": len(rows)}

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: Any) -> list[dict[str, Any]]:
        return engine_eval(greedy_by_length, run, model, model_dir, run.extra["heldout"], policy=policy)


def greedy_by_length(rollout: Any, wf_cfg: Any, by_length: dict[int, list[Any]], temperature: float, seed: int,
                     **labels: Any) -> list[dict[str, Any]]:
    """Each length's greedy rows (the one evaluator, the length their bucket; `labels` name the policy and write
    them to eval_rows/<policy>.jsonl)."""
    return [r for n, ts in by_length.items() for r in evaluate_rows(rollout, wf_cfg, ts, 1, 0.0, seed, bucket=n, **labels)]


RECIPE = ToyRecipe()
