"""The MemAgent demo recipe: its configs, and `MemAgentRecipe`, its method of the recipe pipeline
(memrl.recipes.pipeline).

`memrl demo` (memrl/commands/demo.py) runs it through `run_recipe`. Stages: init a ~0.8M-parameter
Qwen2 whose tokenizer is trained on the synthetic task's text (memrl.recipes.scratch.init_model) -> cold-start
SFT on a mixture demonstrator (memrl.demonstrators.stages.mixture_demonstrator: per memory step the optimal
`QuestionAwareDemonstrator` with probability `sft.p_aware`, the question-blind `RecentFactsDemonstrator` otherwise;
memrl.recipes.pipeline.cold_start) -> multi-conversation GRPO on the MemAgent workflow (memrl.training.trainer)
-> the demonstrator, the cold start and SFT+RL evaluated with one protocol (held-out tasks at 1x, 4x, 16x
the training length; greedy and sampled; memrl.eval.evaluator through memrl.recipes.parts.engine_eval) -> results.json
(memrl.recipes.pipeline's one layout: its summary rows reduced by `FIELDS`, facts["lengths"]) that
`memrl.recipes.report` renders (`memagent_markdown`, `plot_memagent`: results.md and the plots).
Between the configs and the recipe: what only MemAgent's stages need (`evaluate_lengths`, `heldout_tasks`, `demonstrator`,
`tokenizer_strings`, `preset_model`, `evaluate_demonstrator`, `sweep_rows`); benchmarks/ and tests call them beside
the pipeline's own (`pipeline.load_recipe`, `RECIPE.init`, memrl.recipes.pipeline.cold_start, parts.engine_eval).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

from transformers import AutoModelForCausalLM, AutoTokenizer

from memrl.config import (
    MAX_COUNT,
    MAX_LR,
    MAX_SEED,
    MAX_TOKENS,
    MAX_VOCAB,
    ConfigError,
    valid,
)
from memrl.data.synthetic import corpus_text, make_task, make_tasks, memory_text, tasks_by_length
from memrl.demonstrators.engine import ScriptedEngine
from memrl.demonstrators.stages import mixture_demonstrator, reading_segments, record_demonstrations
from memrl.eval import fields
from memrl.eval.evaluator import PERCENT, EngineRollout, eval_record, evaluate_rows
from memrl.eval.fields import Field
from memrl.eval.stats import cell
from memrl.models.tiny import PRESETS, ModelPreset, init_tiny_model
from memrl.quiet import hf_progress_off
from memrl.recipes.parts import engine_eval, policy_labels
from memrl.recipes.pipeline import (
    EvalSettings,
    MethodSettings,
    ModelShape,
    Recipe,
    RecipeConfig,
    RecipeRun,
    SFTSettings,
    run_recipe,
)
from memrl.recipes.report import memagent_markdown, plot_memagent
from memrl.recipes.scratch import check_pieces, init_model
from memrl.recipes.tables import CustomTable, Sweep, cell_of
from memrl.types import Segment

log = logging.getLogger(__name__)

__all__ = ["RECIPE", "DemoConfig", "DemoEval", "DemoSFT", "demonstrator", "evaluate_demonstrator", "evaluate_lengths",
           "heldout_tasks", "reading_segments", "run_memagent_demo", "tokenizer_strings"]


@dataclass
class DemoSFT(SFTSettings):
    """Cold start: demonstrations from a mixture of the optimal and the question-blind rule."""

    p_aware: float = valid(0.9, ge=0, le=1)
    """Per memory step, the chance the demonstrator plays the optimal `QuestionAwareDemonstrator` (keep the fact
    whose key is the question's) instead of the question-blind `RecentFactsDemonstrator` (keep the newest fact,
    or skip it with `skip_prob`). 0 = question-blind cold start (the negative result of docs/results/demo.md),
    1 = the optimal policy (benchmarks/demo_ceiling.py)."""
    keep_distractors: bool = False
    """The optimal rule's choice when nothing is about the question's key yet: an empty memory (False) or
    the newest fact (True, the recipe before 2026-11-23 evening). With distractors kept, the sampled model
    confused a held distractor with the fact it had to capture (capture 70% after RL, docs/results/demo.md); with an
    empty memory there is nothing to confuse. `QuestionAwareDemonstrator.keep_distractors`."""
    num_tasks: int = valid(3000, ge=1, le=MAX_COUNT)
    """Training tasks to record demonstrations on (each gives num_chunks + 1 rows)."""
    budget: int = valid(1, ge=1, le=MAX_COUNT)
    """Facts the demonstrated memory keeps."""
    skip_prob: float = valid(0.4, ge=0, le=1)
    """Chance the question-blind rule ignores a section's fact (a coin flip; < 0.5 so its majority action
    is "keep the newest fact", while sampling still explores keeping)."""
    unanswerable_text: str | None = None
    """What the demonstrated final answer boxes when the memory holds no fact about the question's key,
    e.g. "unknown" (null = guess the memory fact's value). Off: with "unknown" the micro model's cold start
    learned that shortcut before copying facts (0-19% held-out after SFT, docs/results/demo.md)."""
    restate_key: bool = False
    """Demonstrated memories open with the question's key ("- Linka : Kalo is red")."""
    restate_sep: str | None = ":"
    """Word between the restated key and the fact (null = none: "- Linka Kalo is red")."""
    reading_tasks: int = valid(0, ge=0, le=MAX_COUNT)
    """Extra rows that answer the question from the whole (short) document, in the final-answer format:
    reading comprehension, never which facts a memory should keep. 0 = off."""
    epochs: int = valid(4, ge=1, le=MAX_COUNT)
    """~2250 steps on 2-8-chunk documents: with a mixture demonstrator the question-aware skill appears
    only after ~1100-2200 supervised steps (docs/results/demo.md)."""
    lr: float = valid(1e-3, gt=0, le=MAX_LR)
    """3e-3 stalls near loss 0.2 before the copy skill is exact (docs/results/demo.md, the ceiling runs)."""
    batch_rows: int = valid(32, ge=1, le=MAX_COUNT)


@dataclass
class DemoEval(EvalSettings):
    """Held-out evaluation, the same for every row: seeds never used in training (the sampled evaluation's
    seed is eval.seed too)."""

    num_tasks: int = valid(128, ge=1, le=MAX_COUNT)
    """Tasks per length."""
    multipliers: list[int] = valid(default_factory=lambda: [1, 4, 16], ge=1, le=MAX_COUNT)
    """Lengths evaluated, as multiples of the training length (the longest training document, in chunks)."""
    greedy: bool = True
    """Greedy decoding (one trajectory per task)."""
    samples: int = valid(4, ge=0, le=MAX_COUNT, note="0 = no sampled evaluation")
    """Sampled trajectories per task (0 = no sampled evaluation): the policy RL optimizes."""
    demonstrator: bool = True
    """Also evaluate the scripted demonstrator (sampled) through the same workflow."""


@dataclass
class DemoConfig(RecipeConfig, ModelShape):
    """`memrl demo` settings; the RL settings are the `demo_cpu` training preset (+ train.* overrides). The
    "micro" shape's fields (ModelShape) sit at the top level here (`hidden_size=...`)."""

    shape_key: ClassVar[str] = ""
    model_preset: str = "micro"
    """"micro" (the shape below, ~0.8M parameters: learns to copy facts within the CPU budget) or a
    memrl.models.tiny preset ("tiny" ~3M, "small" ~24M)."""
    vocab_size: int = valid(2048, ge=1, le=MAX_VOCAB)
    """BPE target; the trained vocabulary stops earlier when the corpus runs out of merges."""
    max_positions: int = valid(4096, ge=1, le=MAX_TOKENS)
    """The "micro" shape's position embeddings."""
    sft_seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the SFT demonstration tasks."""
    sft: DemoSFT = field(default_factory=DemoSFT)
    eval: DemoEval = field(default_factory=DemoEval)
    train_preset: str = "demo_cpu"

    def policy_shape(self) -> ModelPreset | None:
        """The model the first stage builds (memrl.recipes.policy): the "micro" shape or the preset `model_preset`."""
        return self.preset() if self.model_preset == "micro" else PRESETS.get(self.model_preset)


def evaluate_lengths(rollout: Any, wf_cfg: Any, tasks_by_length: dict[int, list[Any]], ev: DemoEval,
                     modes: tuple[str, ...] = ("greedy", "sampled"), log: Any = None, rows: list[Any] | None = None,
                     **labels: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """The held-out protocol every policy is evaluated under: {length (str): {"greedy": record, "sampled":
    record}} (memrl.eval.evaluator.eval_record) for the modes `ev` enables and `modes` asks for; at each length
    greedy (`ev.greedy`, one trajectory per task) then `ev.samples` per task at `ev.temperature` (0 = none), both
    seeded with `ev.seed`, the length the rows' bucket. The evaluation rows are appended to `rows` where given
    (the recipe's: results.json's summary reduces them by `FIELDS`, the same numbers as the records). `labels`:
    memrl.eval.evaluator.evaluate_rows' policy, heldout_sha256 and rows_to."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for length, tasks in tasks_by_length.items():
        row = {}
        for mode, n, temp in (("greedy", 1, 0.0), ("sampled", ev.samples, ev.temperature)):
            if mode in modes and (ev.greedy if mode == "greedy" else n > 0):
                t0 = time.perf_counter()
                got = evaluate_rows(rollout, wf_cfg, tasks, n, temp, ev.seed, bucket=length, **labels)
                row[mode] = eval_record(got, n, temp, time.perf_counter() - t0)
                if rows is not None:
                    rows += got
        out[str(length)] = row
        if log is not None:
            log(f"  {length}: " + ", ".join(f"{m} {r['accuracy']:.1f} ± {r['se']:.1f}% ({r['seconds']:.0f}s)"
                                            for m, r in row.items()))
    return out


# ------------------------------------------------------------------ stage helpers (benchmarks/ and tests call them)


def heldout_tasks(cfg: DemoConfig, tcfg: Any) -> dict[int, list[Any]]:
    """{length: the held-out tasks of that length}, the same for every evaluated policy; the lengths (in chunks)
    are the training length (the longest training document) x each of `eval.multipliers`."""
    lengths = [tcfg.data.synthetic.num_chunks * m for m in cfg.eval.multipliers]
    return tasks_by_length(tcfg.data.synthetic, lengths, cfg.eval.num_tasks, cfg.eval.seed)


def demonstrator(cfg: DemoConfig, tcfg: Any, wf_cfg: Any, seed: int, p_aware: float | None = None) -> Any:
    """The cold start's scripted demonstrator (memrl.demonstrators.stages.mixture_demonstrator with `sft.*`)."""
    s = cfg.sft
    return mixture_demonstrator(wf_cfg, seed=seed, p_aware=s.p_aware if p_aware is None else p_aware, budget=s.budget,
                        skip_prob=s.skip_prob, unanswerable_text=s.unanswerable_text,
                        fact_sep=tcfg.data.synthetic.fact_sep, restate_key=s.restate_key, restate_sep=s.restate_sep,
                        keep_distractors=s.keep_distractors)


def tokenizer_strings(cfg: DemoConfig, tcfg: Any, wf_cfg: Any) -> list[str]:
    """What the tokenizer learns beside the task's text: the workflow's filled templates, and the restated-key
    memory / unanswerable answer the cold start demonstrates, when on."""
    sample, mem_tpl, fin_tpl = make_task(tcfg.data.synthetic, seed=0, index=0), *wf_cfg.templates()
    filled = [mem_tpl.render(problem=sample.question, memory=wf_cfg.no_memory_text, chunk=" the"),
              fin_tpl.render(problem=sample.question, memory="Kalo is red")]
    if cfg.sft.restate_key:
        filled.append(memory_text([("Kalo", "red")], topic="Linka", topic_sep=cfg.sft.restate_sep))
    if cfg.sft.unanswerable_text:
        filled.append(f"\\boxed{{ {cfg.sft.unanswerable_text}}}")
    return filled


def preset_model(out: Path, cfg: DemoConfig, corpus: str) -> tuple[Any, Any]:
    """(tokenizer, model) of the memrl.models.tiny preset `model_preset` (init_tiny_model: its arch and generation
    config), its BPE trained on `corpus` (written to out/tokenizer_corpus.txt), saved to out/init."""
    path = out / "tokenizer_corpus.txt"
    path.write_text(corpus, encoding="utf-8")
    init_tiny_model(out / "init", preset=cfg.model_preset, corpus=[path], seed=cfg.seed, vocab_size=cfg.vocab_size)
    with hf_progress_off():
        return AutoTokenizer.from_pretrained(out / "init"), AutoModelForCausalLM.from_pretrained(out / "init")


def evaluate_demonstrator(run: RecipeRun, tasks_by_length: dict[int, list[Any]],
                          rows: list[Any] | None = None) -> dict[str, dict[str, Any]]:
    """The demonstrator's own accuracy through the run's workflow (run.tokenizer) on `tasks_by_length`, sampled
    (`evaluate_lengths`, `eval.samples` per task, its rows appended to `rows` where given; a fresh rule seeded
    with eval.seed, not the one that recorded the SFT data), a fresh ScriptedEngine per length (it records every
    call); the rule's own random state runs on across the lengths."""
    cfg, out = run.cfg, {}
    rule, labels = demonstrator(cfg, run.tcfg, run.wf_cfg, seed=cfg.eval.seed), policy_labels(run, "demonstrator",
                                                                                              tasks_by_length)
    for n, tasks in tasks_by_length.items():
        rollout = EngineRollout(ScriptedEngine(rule, tokenizer=run.tokenizer), run.spec)
        out.update(evaluate_lengths(rollout, run.wf_cfg, {n: tasks}, cfg.eval, ("sampled",), print, rows, **labels))
    return out


def sweep_rows(e: dict[str, Any]) -> list[str]:
    """The seed sweep's table (its `sweep`): a row per length, the demonstrator's, the cold start's and
    SFT+RL's accuracy and the gain, sampled and greedy."""
    lines = ["| length (chunks) | x | demonstrator sampled | SFT sampled | SFT+RL sampled | gain sampled | "
             "SFT greedy | SFT+RL greedy | gain greedy |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n in e["buckets"]:
        x = int(n) // e["train_chunks"] if e["train_chunks"] else 0
        demo = cell_of(e, "sampled", n, "demonstrator_accuracy")
        cells = [cell(cell_of(e, m, n, f"{s}_accuracy"), sign=s == "gain", spread="sd")
                 for m in ("sampled", "greedy") for s in ("sft", "rl", "gain")]
        lines.append(f"| {n} | {x}x | {cell(demo, spread='sd')} | " + " | ".join(cells) + " |")
    return lines


# ---------------------------------------------------------------------------------------------- the recipe


FIELDS = (Field("accuracy", fields.accuracy()), Field("se", fields.accuracy_se()), Field("num_tasks", fields.tasks()),
          Field("samples", fields.samples()), Field("context_tokens", fields.mean("context_tokens")),
          *(Field(m, fields.mean(m, 100.0)) for m in PERCENT), Field("per_task", fields.per_task_means()))
"""The MemAgent demo's summary of one evaluation (policy, decoding, length): what
memrl.eval.evaluator.eval_record computes, flat: accuracy ± SE over tasks (%), tasks, samples per task, the mean
context and the 0/1 metrics in % (no_box, answer_seen, answer_kept), and each task's mean reward (the paired
gain's input)."""


class MemAgentRecipe(Recipe):
    """The MemAgent demo as a recipe method (module docstring)."""

    name = "memagent"
    config = DemoConfig
    settings = MethodSettings(
        seed_keys=(("seed", "demo"), ("sft_seed", "demo"), ("train.data.seed", "train"), ("train.trainer.seed", "train")),
        task_seeds=("sft_seed", "train.data.seed"),
        outputs=("results.md", "results.json", "accuracy_vs_length.png", "rl_reward.png"),
        train_keys=("workflow", "algorithm.name", "data.synthetic.num_chunks", "data.synthetic.min_chunks",
                    "data.synthetic.chunk_words", "trainer.steps"),
        sweep_extras={"train_chunks": ("first", "train.data.synthetic.num_chunks")},
        sft_tensorboard=True)  # the cold start logs to TensorBoard where trainer.tensorboard is on
    fields = FIELDS
    table = CustomTable(memagent_markdown)  # a row per length (memrl.recipes.report)
    sweep = Sweep(("accuracy",), sweep_rows, (("demonstrator", "demonstrator"),))
    plot = staticmethod(plot_memagent)

    def init(self, run: RecipeRun) -> None:
        """Held-out tasks; BPE on the task's text and 50 copies of `tokenizer_strings` (init_model repeats them
        10 times), a model of the "micro" shape (scratch.init_model) or of the preset `model_preset`."""
        cfg, syn, wf = run.cfg, run.tcfg.data.synthetic, run.wf_cfg
        run.extra["tasks"] = heldout_tasks(cfg, run.tcfg)
        run.facts["lengths"] = list(run.extra["tasks"])
        extra, text = tokenizer_strings(cfg, run.tcfg, wf), lambda e: corpus_text(seed=cfg.seed, extra=e)
        run.tokenizer, run.model = (preset_model(run.out, cfg, text(tuple(extra * 50))) if cfg.model_preset != "micro"
                                    else init_model(run.out, cfg.preset(), cfg.vocab_size, cfg.seed, text, extra * 5,
                                                    chat=False, fit_length=False))
        check_pieces(run.tokenizer, make_task(syn, seed=0, index=0), syn.chunk_words)
        if wf.chunk_tokens != syn.chunk_words:
            log.warning("workflow chunk_tokens=%d but synthetic chunk_words=%d", wf.chunk_tokens, syn.chunk_words)

    def scripted(self, run: RecipeRun) -> list[dict[str, Any]]:
        cfg, rows = run.cfg, []
        if cfg.eval.demonstrator and cfg.eval.samples:
            print(f"demonstrator (p_aware {cfg.sft.p_aware}), held-out:")
            evaluate_demonstrator(run, run.extra["tasks"], rows)
        return rows

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], None]:
        """The mixture demonstrator's traces through the memagent workflow (plus `sft.reading_tasks`
        reading-comprehension rows)."""
        cfg, syn, s = run.cfg, run.tcfg.data.synthetic, run.cfg.sft
        rule = demonstrator(cfg, run.tcfg, run.wf_cfg, seed=cfg.seed)
        groups = record_demonstrations(rule, make_tasks(syn, s.num_tasks, seed=cfg.sft_seed), run.tokenizer, run.wf_cfg)
        rows, share = [r for g in groups for r in g.segments()], rule.aware_steps / max(1, rule.memory_steps)
        print(f"SFT: {len(rows)} rows from {len(groups)} demonstrations (p_aware {rule.p_aware}: "
              f"{100 * share:.1f}% of {rule.memory_steps} memory steps question-aware; the demonstrator's own "
              f"accuracy {100 * (sum(g.rewards[0] for g in groups) / len(groups)):.1f}%)")
        if s.reading_tasks:
            rows += (reading := reading_segments(make_tasks(syn, s.reading_tasks, seed=cfg.sft_seed + 1),
                                                 run.tokenizer, run.wf_cfg.templates()[1]))
            print(f"SFT: + {len(reading)} reading-comprehension rows (answer from the whole document)")
        return rows, None

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> list[dict[str, Any]]:
        print("SFT, held-out:" if policy == "sft" else "SFT+RL, held-out:")
        rows: list[dict[str, Any]] = []
        engine_eval(evaluate_lengths, run, model, model_dir, run.extra["tasks"], run.cfg.eval, log=print, rows=rows,
                    policy=policy)
        return rows

    def check_sweep(self, cfg: Any) -> None:
        if cfg.eval.samples == 0 or not cfg.eval.greedy:  # the table aggregates both decodings at every length
            what = "eval.samples=0 leaves no sampled" if cfg.eval.samples == 0 else "eval.greedy=false leaves no greedy"
            raise ConfigError(f"--seeds: {what} accuracy, and the sweep's table aggregates sampled and greedy "
                              "accuracy of every run; drop the override")


RECIPE = MemAgentRecipe()
run_memagent_demo = partial(run_recipe, RECIPE)
"""Run the whole demo (module docstring): (out_dir, overrides) -> what results.json holds."""
