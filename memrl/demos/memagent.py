"""The MemAgent demo recipe: configs, model init, cold-start SFT, RL, and the held-out evaluations.

`memrl demo` (memrl/commands/demo.py) is a thin driver over `run_demo`. Steps: init a ~0.8M-parameter
Qwen2 whose tokenizer is trained on the synthetic task's text -> cold-start SFT on a mixture
demonstrator (per memory step the optimal `QuestionAwareRule` with probability `sft.p_aware`, the
question-blind `RecentFactsRule` otherwise) -> multi-conversation GRPO on the MemAgent workflow -> the
demonstrator, the cold start and SFT+RL evaluated with one protocol (held-out tasks at 1x, 4x, 16x the
training length; greedy and sampled) -> a results dict that `memrl.eval.demo_report` renders
(`write_memagent_outputs`: results.md, results.json, the plots).
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from memrl.config import valid
from memrl.demos import split_overrides
from memrl.eval.evaluator import EngineRollout, EvalProtocol, evaluate_policy, model_engine, results_to_json
from memrl.quiet import encode_document, hf_progress_off

log = logging.getLogger(__name__)


@dataclass
class DemoSFT:
    """Cold start: demonstrations from a mixture of the optimal and the question-blind rule."""

    p_aware: float = valid(0.9, ge=0, le=1)
    """Per memory step, the chance the demonstrator plays the optimal `QuestionAwareRule` (keep the fact
    whose key is the question's) instead of the question-blind `RecentFactsRule` (keep the newest fact,
    or skip it with `skip_prob`). 0 = question-blind cold start (the negative result of docs/demo.md),
    1 = the optimal policy (benchmarks/demo_ceiling.py)."""
    keep_distractors: bool = False
    """The optimal rule's choice when nothing is about the question's key yet: an empty memory (False) or
    the newest fact (True, the recipe before 2026-11-23 evening). With distractors kept, the sampled model
    confused a held distractor with the fact it had to capture (capture 70% after RL, docs/demo.md); with an
    empty memory there is nothing to confuse. `QuestionAwareRule.keep_distractors`."""
    num_tasks: int = valid(3000, ge=1)
    """Training tasks to record demonstrations on (each gives num_chunks + 1 rows)."""
    budget: int = valid(1, ge=1)
    """Facts the demonstrated memory keeps."""
    skip_prob: float = valid(0.4, ge=0, le=1)
    """Chance the question-blind rule ignores a section's fact (a coin flip; < 0.5 so its majority action
    is "keep the newest fact", while sampling still explores keeping)."""
    unanswerable_text: str | None = None
    """What the demonstrated final answer boxes when the memory holds no fact about the question's key,
    e.g. "unknown" (null = guess the memory fact's value). Off: with "unknown" the micro model's cold start
    learned that shortcut before copying facts (0-19% held-out after SFT, docs/demo.md)."""
    restate_key: bool = False
    """Demonstrated memories open with the question's key ("- Linka : Kalo is red")."""
    restate_sep: str | None = ":"
    """Word between the restated key and the fact (null = none: "- Linka Kalo is red")."""
    reading_tasks: int = valid(0, ge=0)
    """Extra rows that answer the question from the whole (short) document, in the final-answer format:
    reading comprehension, never which facts a memory should keep. 0 = off."""
    epochs: int = valid(4, ge=1)
    """~2250 steps on 2-8-chunk documents: with a mixture demonstrator the question-aware skill appears
    only after ~1100-2200 supervised steps (docs/demo.md)."""
    lr: float = valid(1e-3, gt=0)
    """3e-3 stalls near loss 0.2 before the copy skill is exact (docs/demo.md, the ceiling runs)."""
    batch_rows: int = valid(32, ge=1)
    warmup_steps: int = valid(20, ge=0)


@dataclass
class DemoEval:
    """Held-out evaluation, the same for every row: seeds never used in training."""

    num_tasks: int = valid(128, ge=1)
    """Tasks per length."""
    multipliers: list[int] = valid(default_factory=lambda: [1, 4, 16], ge=1)
    """Lengths evaluated, as multiples of the training length (the longest training document, in chunks)."""
    seed: int = valid(987654, ge=0)
    """Seed of the held-out task stream and of the sampled evaluation (training uses data.seed and sft_seed)."""
    greedy: bool = True
    """Greedy decoding (one trajectory per task)."""
    samples: int = valid(4, ge=0, note="0 = no sampled evaluation")
    """Sampled trajectories per task (0 = no sampled evaluation): the policy RL optimizes."""
    temperature: float = valid(1.0, gt=0)
    """Temperature of the sampled evaluation."""
    demonstrator: bool = True
    """Also evaluate the scripted demonstrator (sampled) through the same workflow."""


@dataclass
class DemoConfig:
    """`memrl demo` settings; the RL settings are the `demo_cpu` training preset (+ train.* overrides)."""

    model_preset: str = "micro"
    """"micro" (the shape below, ~0.8M parameters: learns to copy facts within the CPU budget) or a
    memrl.models.tiny preset ("tiny" ~3M, "small" ~24M)."""
    hidden_size: int = valid(128, ge=1)
    num_layers: int = valid(4, ge=1)
    num_heads: int = valid(4, ge=1)
    num_kv_heads: int = valid(2, ge=1, le="num_heads")
    vocab_size: int = valid(2048, ge=1)
    """BPE target; the trained vocabulary stops earlier when the corpus runs out of merges."""
    seed: int = valid(0, ge=0)
    sft_seed: int = valid(500, ge=0)
    """Seed of the SFT demonstration tasks."""
    sft: DemoSFT = field(default_factory=DemoSFT)
    eval: DemoEval = field(default_factory=DemoEval)
    train_preset: str = "demo_cpu"
    threads: int = valid(0, ge=0, note="0 = torch's default")
    """torch threads (0 = torch's default)."""


def load_demo_configs(overrides: list[str], out_dir: str | Path) -> tuple[DemoConfig, Any, Path, tuple[Any, Any]]:
    """(demo config, validated RL config, writable output dir, parsed workflow (spec, config)) from
    `key=value` / `train.key=value` overrides; sets torch's thread count when `threads` is given. Fails
    before any work on a bad value."""
    import torch

    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.trainer import check_writable, validate

    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(DemoConfig, demo_ov)  # every field against its declared range
    out = check_writable(out_dir, "--out")
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", *train_ov],
                       preset=cfg.train_preset)
    workflow = validate(tcfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return cfg, tcfg, out, workflow


def eval_lengths(cfg: DemoConfig, tcfg: Any) -> list[int]:
    """Evaluated lengths in chunks: the training length (longest training document) x each multiplier."""
    return [tcfg.data.synthetic.num_chunks * m for m in cfg.eval.multipliers]


def eval_synthetic(syn: Any, num_chunks: int) -> Any:
    """The evaluation's task shape at `num_chunks`: the training config's pieces and facts, every document
    exactly that long, the asked fact anywhere (training-only curricula such as `answer_span` off)."""
    return replace(syn, num_chunks=num_chunks, min_chunks=0, answer_span=1.0)


def heldout_tasks(cfg: DemoConfig, tcfg: Any) -> dict[int, list[Any]]:
    """{length: the held-out tasks of that length}, the same for every evaluated policy."""
    from memrl.data.synthetic import make_tasks

    return {n: make_tasks(eval_synthetic(tcfg.data.synthetic, n), cfg.eval.num_tasks, seed=cfg.eval.seed)
            for n in eval_lengths(cfg, tcfg)}


def protocol(cfg: DemoConfig) -> EvalProtocol:
    return EvalProtocol(greedy=cfg.eval.greedy, samples=cfg.eval.samples, temperature=cfg.eval.temperature,
                        seed=cfg.eval.seed)


def demonstrator(cfg: DemoConfig, tcfg: Any, wf_cfg: Any, seed: int, p_aware: float | None = None) -> Any:
    """The cold start's scripted demonstrator (a `MixtureRule`; p_aware 0 plays `RecentFactsRule` exactly)."""
    from memrl.demonstrators import MixtureRule

    mem_tpl, fin_tpl = wf_cfg.templates()
    return MixtureRule(mem_tpl.text, fin_tpl.text, budget=cfg.sft.budget, skip_prob=cfg.sft.skip_prob,
                       no_memory_text=wf_cfg.no_memory_text, seed=seed,
                       unanswerable_text=cfg.sft.unanswerable_text or None, fact_sep=tcfg.data.synthetic.fact_sep,
                       restate_key=cfg.sft.restate_key, restate_sep=cfg.sft.restate_sep,
                       p_aware=cfg.sft.p_aware if p_aware is None else p_aware,
                       keep_distractors=cfg.sft.keep_distractors)


def evaluate_demonstrator(cfg: DemoConfig, tcfg: Any, spec: Any, wf_cfg: Any, tokenizer: Any,
                          tasks_by_length: dict[int, list[Any]]) -> dict[int, dict[str, Any]]:
    """The demonstrator's own accuracy: the scripted mixture through the same workflow and tasks, sampled
    (`eval.samples` per task; a fresh rule seeded with eval.seed, not the one that recorded the SFT data)."""
    from memrl.demonstrators import ScriptedEngine

    rule = demonstrator(cfg, tcfg, wf_cfg, seed=cfg.eval.seed)
    proto = replace(protocol(cfg), greedy=False)
    out = {}
    for n, tasks in tasks_by_length.items():  # a fresh engine per length: it records every call
        rollout = EngineRollout(ScriptedEngine(rule, tokenizer=tokenizer), spec)
        out.update(evaluate_policy(rollout, wf_cfg, {n: tasks}, proto, log=print))
    return out


def init_model(cfg: DemoConfig, tcfg: Any, out: Path, wf_cfg: Any) -> tuple[Any, Any]:
    """(tokenizer, model): a fresh model whose tokenizer is trained on the task's own text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.synthetic import corpus_text, make_task
    from memrl.models.tiny import init_tiny_model

    mem_tpl, fin_tpl = wf_cfg.templates()
    syn = tcfg.data.synthetic
    sample = make_task(syn, seed=0, index=0)
    question = sample.question
    filled = [mem_tpl.render(problem=question, memory=wf_cfg.no_memory_text, chunk=" the"),
              fin_tpl.render(problem=question, memory="Kalo is red")]
    if cfg.sft.restate_key:
        from memrl.data.synthetic import memory_text

        filled.append(memory_text([("Kalo", "red")], topic="Linka", topic_sep=cfg.sft.restate_sep))
    if cfg.sft.unanswerable_text:
        filled.append(f"\\boxed{{ {cfg.sft.unanswerable_text}}}")
    corpus = out / "tokenizer_corpus.txt"
    corpus.write_text(corpus_text(seed=cfg.seed, extra=tuple(filled * 50)), encoding="utf-8")
    init_dir = out / "init"
    if cfg.model_preset == "micro":
        import torch
        from transformers import Qwen2ForCausalLM

        from memrl.models.tiny import ModelPreset, qwen2_config, train_tokenizer

        tok = train_tokenizer([corpus], cfg.vocab_size, cfg.seed)
        tok.save_pretrained(init_dir)
        shape = ModelPreset(cfg.vocab_size, cfg.hidden_size, 2 * cfg.hidden_size, cfg.num_layers, cfg.num_heads,
                            cfg.num_kv_heads, max_position_embeddings=4096)
        torch.manual_seed(cfg.seed)
        with hf_progress_off():
            Qwen2ForCausalLM(qwen2_config(shape, len(tok), tok.eos_token_id, tok.pad_token_id)).save_pretrained(init_dir)
    else:
        init_tiny_model(init_dir, preset=cfg.model_preset, corpus=[corpus], seed=cfg.seed,
                        vocab_size=cfg.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    with hf_progress_off():
        model = AutoModelForCausalLM.from_pretrained(init_dir)
    # Chunks must line up with the task's pieces: every word one token.
    n_tok = len(encode_document(tokenizer, sample.context))
    want = sample.meta["num_chunks"] * syn.chunk_words
    if n_tok != want:
        log.warning("synthetic pieces are %d tokens, expected %d: chunks will not align with facts", n_tok, want)
    if wf_cfg.chunk_tokens != syn.chunk_words:
        log.warning("workflow chunk_tokens=%d but synthetic chunk_words=%d", wf_cfg.chunk_tokens, syn.chunk_words)
    return tokenizer, model


def cold_start(cfg: DemoConfig, tcfg: Any, model: Any, tokenizer: Any, wf_cfg: Any, out: Path) -> list[float]:
    """SFT on the demonstrator's traces (recorded through the workflow, so SFT rows are RL's rows); saves
    the model to out/sft and returns the per-step losses."""
    from memrl.data.synthetic import make_tasks
    from memrl.demonstrators import ScriptedEngine
    from memrl.training.sft import SFTConfig, sft_train_logged
    from memrl.workflows import get_workflow
    from memrl.workflows.runner import rollout_sync

    _, fin_tpl = wf_cfg.templates()
    rule = demonstrator(cfg, tcfg, wf_cfg, seed=cfg.seed)
    tasks = make_tasks(tcfg.data.synthetic, cfg.sft.num_tasks, seed=cfg.sft_seed)
    groups = rollout_sync(tasks, get_workflow("memagent"), ScriptedEngine(rule, tokenizer=tokenizer), wf_cfg, n=1)
    segments = [s for g in groups for s in g.segments()]
    rule_acc = sum(g.rewards[0] for g in groups) / len(groups)
    share = rule.aware_steps / max(1, rule.memory_steps)
    print(f"SFT: {len(segments)} rows from {len(groups)} demonstrations (p_aware {cfg.sft.p_aware}: "
          f"{100 * share:.1f}% of {rule.memory_steps} memory steps question-aware; the demonstrator's own "
          f"accuracy {100 * rule_acc:.1f}%)")
    if cfg.sft.reading_tasks:
        reading = reading_segments(make_tasks(tcfg.data.synthetic, cfg.sft.reading_tasks, seed=cfg.sft_seed + 1),
                                   tokenizer, fin_tpl)
        segments += reading
        print(f"SFT: + {len(reading)} reading-comprehension rows (answer from the whole document)")
    scfg = SFTConfig(epochs=cfg.sft.epochs, batch_rows=cfg.sft.batch_rows, lr=cfg.sft.lr,
                     warmup_steps=cfg.sft.warmup_steps, seed=cfg.seed)
    losses = sft_train_logged(model, tokenizer, segments, scfg, out / "sft", progress=tcfg.trainer.progress,
                              tensorboard=tcfg.trainer.tensorboard, save_dir=out / "sft")
    return losses


def reading_segments(tasks: list[Any], tokenizer: Any, final_template: Any) -> list[Any]:
    """One row per task: the final-answer prompt with the WHOLE document as the memory, answered with the
    boxed gold answer (reading comprehension; no memory decision is shown)."""
    from memrl.types import Segment
    from memrl.workflows.templates import chat_prompt

    out = []
    for t in tasks:
        _, prompt_ids = chat_prompt(tokenizer, final_template.render(problem=t.question, memory=t.context.strip()))
        resp = list(tokenizer.encode(f"\\boxed{{ {t.answers[0]}}}", add_special_tokens=False))
        resp.append(tokenizer.eos_token_id)
        out.append(Segment(prompt_ids=prompt_ids, response_ids=resp, response_logprobs=[0.0] * len(resp),
                           step=0, info={"kind": "reading"}, task_id=t.task_id))
    return out


def evaluate_model(cfg: DemoConfig, tcfg: Any, spec: Any, wf_cfg: Any, model: Any, tokenizer: Any,
                   tasks_by_length: dict[int, list[Any]], model_dir: str | Path) -> dict[int, dict[str, Any]]:
    """Greedy and sampled held-out evaluation of `model` through the RL config's engine."""
    with model_engine(model, tokenizer, tcfg.engine, model_dir) as engine:
        return evaluate_policy(EngineRollout(engine, spec), wf_cfg, tasks_by_length, protocol(cfg), log=print)


def run_demo(cfg: DemoConfig, tcfg: Any, out: Path, workflow: tuple[Any, Any]) -> dict[str, Any]:
    """The whole recipe; returns the results dict (JSON-ready) that `memrl.eval.demo_report` renders."""
    from memrl.training.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    t_start = time.perf_counter()
    spec, wf_cfg = workflow
    timings: dict[str, float] = {}
    syn = tcfg.data.synthetic
    tasks = heldout_tasks(cfg, tcfg)

    t0 = time.perf_counter()
    tokenizer, model = init_model(cfg, tcfg, out, wf_cfg)
    timings["init_s"] = time.perf_counter() - t0

    demo_eval = {}
    if cfg.eval.demonstrator and cfg.eval.samples:
        t0 = time.perf_counter()
        print(f"demonstrator (p_aware {cfg.sft.p_aware}), held-out:")
        demo_eval = evaluate_demonstrator(cfg, tcfg, spec, wf_cfg, tokenizer, tasks)
        timings["eval_demonstrator_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sft_losses = cold_start(cfg, tcfg, model, tokenizer, wf_cfg, out)
    timings["sft_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    print("SFT, held-out:")
    sft_eval = evaluate_model(cfg, tcfg, spec, wf_cfg, model, tokenizer, tasks, out / "sft")
    timings["eval_sft_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    trainer = Trainer(tcfg, workflow=workflow)
    history = trainer.fit()
    timings["rl_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    print("SFT+RL, held-out:")
    rl_eval = evaluate_model(cfg, tcfg, spec, wf_cfg, trainer.model, tokenizer, tasks,
                             latest_checkpoint(trainer.ckpt_root) or "")
    timings["eval_rl_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start

    return {
        "recipe": {"p_aware": cfg.sft.p_aware, "train_chunks": syn.num_chunks, "min_chunks": syn.min_chunks,
                   "chunk_words": syn.chunk_words, "sft": asdict(cfg.sft), "rl_steps": tcfg.trainer.steps,
                   "eval": asdict(cfg.eval)},
        "lengths": list(tasks),
        "stages": {"demonstrator": results_to_json(demo_eval), "sft": results_to_json(sft_eval),
                   "rl": results_to_json(rl_eval)},
        "timings": timings,
        "sft_losses": sft_losses,
        "rl_reward": [h.get("reward/mean", 0.0) for h in history],
    }
