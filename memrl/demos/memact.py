"""The MemAct CPU demo: a tiny model learns, with DCPO, when to prune its working context.

  memrl demo --agent memact --out runs/memact_demo
  memrl demo --agent memact --out runs/m sft.epochs=2 train.trainer.steps=10 eval.num_tasks=100

Steps: write the task (memrl.data.synthetic_memact: SFT / RL / held-out tasks, each with its own fact
sheet that the agent searches with BM25) -> init a ~0.6M-parameter Qwen2 whose tokenizer is trained on the task's
text -> cold-start SFT on the scripted agent's trajectories (memrl.demonstrators.memact: prunes late with
probability `sft.late_prob`), played through the real memact workflow, so the SFT rows are the workflow's
segments -> DCPO (preset memact_dcpo_cpu) -> the same held-out evaluation of the SFT and the SFT+DCPO
policy: greedy and sampled (one sample per task, temperature `eval.temperature`), accuracy (all
sub-questions right) with its standard error, mean and peak working-context tokens, prunes per task,
overflow rate (memrl.eval.evaluator.evaluate_memact) -> results.md (printed), results.json,
memact_results.png (memrl.eval.demo_report).

Overrides: `key=value` for the demo config (MemActDemoConfig below), `train.<key>=value` for the DCPO
config (preset memact_dcpo_cpu); `engine.*` and `workflow.*` are spelled as in `memrl train` (they set
the DCPO config's sections, which the demo's cold start and evaluations use too).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from memrl.config import valid
from memrl.data.synthetic_memact import MemActTaskConfig
from memrl.demos import split_overrides
from memrl.quiet import hf_progress_off

log = logging.getLogger(__name__)

@dataclass
class MemActDemoModel:
    """The tiny Qwen2 trained from scratch (tied embeddings; the vocabulary is what BPE learns)."""

    hidden_size: int = valid(128, ge=1)
    num_layers: int = valid(4, ge=1)
    num_heads: int = valid(4, ge=1)
    num_kv_heads: int = valid(2, ge=1, le="num_heads")
    vocab_size: int = valid(2048, ge=1)
    """BPE target; the task's text runs out of merges well before (about 900 tokens)."""
    max_positions: int = valid(1024, ge=1)


@dataclass
class MemActDemoSFT:
    """Cold start on the scripted agent's trajectories (memrl.demonstrators.memact.MemActDemonstrator)."""

    num_tasks: int = valid(4000, ge=1)
    """Demonstration tasks; each gives one segment per prune plus the final one."""
    late_prob: float = valid(0.6, ge=0, le=1)
    """The scripted agent's flaw: the probability it searches on instead of pruning, overflowing the budget."""
    seed: int = valid(500, ge=0)
    """Seed of the demonstration tasks."""
    search_topk: int = valid(1, ge=1)
    """Passages the scripted agent's searches ask for (1: the asked fact alone; 2: also a distractor fact of
    the same name). The working-context budget is calibrated with it."""
    copy_warmup_steps: int = valid(1500, ge=0, note="0 = off")
    """Steps (of `batch_rows` x 4 rows) of copy warm-up before the cold start: random token sequences, each
    followed by itself (memrl.training.sft.copy_warmup_segments). A model trained from scratch has no
    induction heads, and without them it never learned to copy a name into a query or a value into an
    answer (at chance after 2,400 SFT steps); the warm-up forms them at ~700 steps (docs/memact.md). 0 = off."""
    epochs: int = valid(4, ge=1)
    """~2,400 steps: with 2 epochs the cold start copied only some values (sampled sub-question accuracy 42%
    vs 47% at 4 epochs, 3-question tasks 6.5% vs 41.8%; docs/memact.md)."""
    lr: float = valid(1e-3, gt=0)
    """(3e-3 and 6e-3 learned more slowly in the runs that chose this recipe; 3e-3 also stops the copy
    warm-up from forming induction.)"""
    batch_rows: int = valid(8, ge=1)
    """Small batches: the model needs many steps (~1000) before it copies names and values at all."""
    warmup_steps: int = valid(20, ge=0)


@dataclass
class MemActDemoEval:
    """Held-out evaluation, fixed before any run: new fact sheets (another task seed), same protocol for both
    policies (greedy, then one sample per task at `temperature`)."""

    num_tasks: int = valid(300, ge=1)
    seed: int = valid(987654, ge=0)
    """Seed of the held-out tasks (SFT uses sft.seed, DCPO rl_task_seed)."""
    temperature: float = valid(1.0, gt=0)
    """The sampled evaluation's temperature (the DCPO rollouts' own)."""


@dataclass
class MemActDemoConfig:
    """`memrl demo --agent memact` settings; the DCPO settings are the `memact_dcpo_cpu` preset (+ train.*)."""

    model: MemActDemoModel = field(default_factory=MemActDemoModel)
    task: MemActTaskConfig = field(default_factory=MemActTaskConfig)
    sft: MemActDemoSFT = field(default_factory=MemActDemoSFT)
    eval: MemActDemoEval = field(default_factory=MemActDemoEval)
    rl_tasks: int = valid(5000, ge=1)
    """Training tasks written for DCPO (read in shuffled epochs)."""
    rl_task_seed: int = valid(100, ge=0)
    context_budget: int = valid(0, ge=0, note="0 = calibrated")
    """The working-context budget (workflow.max_context_tokens of the cold start, DCPO and evaluation).
    0 = calibrated with the demo's tokenizer: the largest prompt the scripted agent without its flaw
    reaches on the SFT tasks (the task prompt and two search results); the demo checks that no
    prompt holding three search results fits."""
    seed: int = valid(0, ge=0)
    """Seed of the tokenizer and the model's initial weights."""
    train_preset: str = "memact_dcpo_cpu"
    threads: int = valid(0, ge=0, note="0 = torch's default")
    """torch threads (0 = torch's default)."""


def load_configs(overrides: list[str], out_dir: str | Path) -> tuple[MemActDemoConfig, Any, Path, tuple[Any, Any]]:
    """(demo config, validated DCPO config, writable output dir, parsed workflow (spec, config)); fails on a
    bad value before any work."""
    import torch

    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.trainer import check_writable, validate

    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(MemActDemoConfig, demo_ov)
    out = check_writable(out_dir, "--out")
    data = out / "data"
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", "data.name=file",
                                     f"data.path={data / 'train_tasks.jsonl'}", *train_ov],
                       preset=cfg.train_preset)
    workflow = validate(tcfg)
    if workflow[0].name != "memact":
        from memrl.config import ConfigError

        raise ConfigError(f"workflow.name must be memact for the MemAct demo, got {workflow[0].name!r}")
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return cfg, tcfg, out, workflow


# ---------------------------------------------------------------------------------------------- data


@dataclass
class DemoData:
    """The tasks the demo made (each carries its own fact sheet in meta["documents"])."""

    sft_tasks: list[Any]
    eval_tasks: list[Any]


def write_data(cfg: MemActDemoConfig, data_dir: Path) -> DemoData:
    """SFT tasks (kept in memory), DCPO tasks (data/train_tasks.jsonl), held-out tasks
    (data/heldout_tasks.jsonl); three seeds, so no fact sheet is shared."""
    from memrl.data.synthetic_memact import make_tasks
    from memrl.data.tasks_jsonl import write_tasks

    t = cfg.task
    sft_tasks = make_tasks(t, cfg.sft.num_tasks, cfg.sft.seed, prefix="sft")
    write_tasks(data_dir / "train_tasks.jsonl", make_tasks(t, cfg.rl_tasks, cfg.rl_task_seed, "rl"))
    eval_tasks = make_tasks(t, cfg.eval.num_tasks, cfg.eval.seed, prefix="heldout")
    write_tasks(data_dir / "heldout_tasks.jsonl", eval_tasks)
    return DemoData(sft_tasks, eval_tasks)


# ---------------------------------------------------------------------------------------------- model


def init_model(cfg: MemActDemoConfig, wf_cfg: Any, sample_tasks: list[Any], out: Path) -> tuple[Any, Any]:
    """(tokenizer, model): BPE trained on the task's text (compact-tools ChatML), a seeded Qwen2 from scratch."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2ForCausalLM

    from memrl.data.synthetic_memact import tokenizer_text
    from memrl.demonstrators.memact import answer_reply, prune_reply, search_reply
    from memrl.models.tiny import CHAT_TEMPLATE_COMPACT_TOOLS, ModelPreset, qwen2_config, train_tokenizer
    from memrl.workflows.memact import answer_format

    sys_tpl, user_tpl = wf_cfg.templates(True)
    extra = [sys_tpl.render(), "tools: search prune_context",
             "Removed r1, r2, r3. Your memory note stays in your prune_context call above."]
    for task in sample_tasks[:40]:
        names, attrs = task.meta["entities"], task.meta["attributes"]
        instruction = wf_cfg.answer_instruction if wf_cfg.answer_instruction is not None else answer_format(task)
        extra.append(user_tpl.render(question=task.question, answer_format=instruction))
        extra += [search_reply(a, n, cfg.sft.search_topk) for a, n in zip(attrs, names, strict=True)]
        extra.append(prune_reply([(n, a, v) for n, a, v in zip(names, attrs, task.answers, strict=True)],
                                 ["r1", "r2"]))
        extra.append(answer_reply(task.answers))
    # Two passes: a first tokenizer plays the scripted agent on a few tasks, whose whole working contexts
    # (chat markers, tool results, the workflow's own messages) join the text the final tokenizer learns.
    m = cfg.model
    corpus = out / "tokenizer_corpus.txt"
    corpus.write_text(tokenizer_text(cfg.task, tuple(extra * 10)), encoding="utf-8")
    tok = train_tokenizer([corpus], m.vocab_size, cfg.seed)
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    big = replace(wf_cfg, max_context_tokens=10**9)
    seen = [tok.decode(s.prompt_ids + s.response_ids) for g in demonstrations(sample_tasks[:60], tok, big, 0.5, 0, cfg.sft.search_topk)
            for s in g.trajectories[0].segments]
    corpus.write_text(tokenizer_text(cfg.task, tuple(extra * 10 + seen * 10)), encoding="utf-8")
    tok = train_tokenizer([corpus], m.vocab_size, cfg.seed)
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    tok.model_max_length = m.max_positions
    init_dir = out / "init"
    tok.save_pretrained(init_dir)
    shape = ModelPreset(m.vocab_size, m.hidden_size, 2 * m.hidden_size, m.num_layers, m.num_heads,
                        m.num_kv_heads, max_position_embeddings=m.max_positions)
    torch.manual_seed(cfg.seed)
    with hf_progress_off():
        Qwen2ForCausalLM(qwen2_config(shape, len(tok), tok.eos_token_id, tok.pad_token_id)).save_pretrained(init_dir)
        return AutoTokenizer.from_pretrained(init_dir), AutoModelForCausalLM.from_pretrained(init_dir)


# ---------------------------------------------------------------------------------------------- budget


def calibrate_budget(tasks: list[Any], tokenizer: Any, wf_cfg: Any, topk: int = 2) -> int:
    """The largest prompt of the flawless scripted agent (late_prob 0) on `tasks`; raises ValueError when a
    prompt holding three search results (late_prob 1) would fit in it too, so pruning would not be needed."""
    big = replace(wf_cfg, max_context_tokens=10**9)
    two = [g.trajectories[0] for g in demonstrations(tasks, tokenizer, big, 0.0, 0, topk)]
    budget = int(max(t.metrics["peak_context_tokens"] for t in two))
    three = [g.trajectories[0] for g in demonstrations(tasks, tokenizer, big, 1.0, 0, topk)]
    over = [t.metrics["peak_context_tokens"] for t in three if t.metrics["searches"] >= 3]
    if not over or min(over) <= budget:
        raise ValueError(f"context budget {budget}: a prompt with three search results has "
                         f"{min(over, default=0):.0f} tokens and fits; the task would not need pruning")
    return budget


# ---------------------------------------------------------------------------------------------- cold start


def demonstrations(tasks: list[Any], tokenizer: Any, wf_cfg: Any, late_prob: float, seed: int,
                   topk: int = 2) -> list[Any]:
    """The scripted agent's trajectories (one Group per task), played through the memact workflow by
    ScriptedEngine: their segments are the SFT rows, built exactly as RL builds its rows."""
    from memrl.demonstrators import ScriptedEngine
    from memrl.demonstrators.memact import MemActDemonstrator
    from memrl.workflows import get_workflow
    from memrl.workflows.runner import rollout_sync

    script = MemActDemonstrator(late_prob=late_prob, seed=seed, topk=topk)
    wf = replace(wf_cfg, no_prune_prob=0.0, prune_tool=True)
    return rollout_sync(tasks, get_workflow("memact"), ScriptedEngine(script, tokenizer=tokenizer), wf, n=1,
                        concurrency=256, seed=seed)


def copy_warmup(cfg: MemActDemoConfig, tcfg: Any, model: Any, tokenizer: Any, out: Path) -> list[float]:
    """Train `model` to copy by content on repeated random sequences over its whole vocabulary (special tokens
    aside); returns the losses."""
    from memrl.training.sft import SFTConfig, copy_warmup_segments, sft_train_logged

    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    batch = 4 * cfg.sft.batch_rows
    rows = copy_warmup_segments(ids, cfg.sft.copy_warmup_steps * batch, block=batch, seed=cfg.seed)
    scfg = SFTConfig(epochs=1, batch_rows=batch, lr=cfg.sft.lr, warmup_steps=20, lr_floor=1.0, shuffle=False,
                     seed=cfg.seed)
    losses = sft_train_logged(model, tokenizer, rows, scfg, out / "copy_warmup", desc="copy warm-up",
                              progress=tcfg.trainer.progress, tensorboard=False)
    print(f"copy warm-up: {len(losses)} steps over {len(ids)} tokens, loss {losses[0]:.2f} -> "
          f"{sum(losses[-20:]) / len(losses[-20:]):.3f} (mean of the last 20; chance {math.log(len(ids)):.2f})")
    return losses


def cold_start(cfg: MemActDemoConfig, tcfg: Any, model: Any, tokenizer: Any, wf_cfg: Any, tasks: list[Any],
               out: Path) -> tuple[list[float], dict[str, float]]:
    """SFT on the demonstrations' segments; saves the model to out/sft. Returns (losses, demo statistics)."""
    from memrl.training.sft import SFTConfig, sft_train_logged

    groups = demonstrations(tasks, tokenizer, wf_cfg, cfg.sft.late_prob, cfg.sft.seed, cfg.sft.search_topk)
    segments = [s for g in groups for s in g.trajectories[0].segments]
    stats = summarize_groups(groups)
    print(f"cold start: {len(segments)} rows from {len(groups)} scripted trajectories (its accuracy "
          f"{stats['accuracy']:.1f}%, prunes/task {stats['prunes_per_task']:.2f}, overflow {stats['overflow']:.1f}%)")
    scfg = SFTConfig(epochs=cfg.sft.epochs, batch_rows=cfg.sft.batch_rows, lr=cfg.sft.lr,
                     warmup_steps=cfg.sft.warmup_steps, seed=cfg.seed)
    losses = sft_train_logged(model, tokenizer, segments, scfg, out / "sft", progress=tcfg.trainer.progress,
                              tensorboard=False, save_dir=out / "sft")
    return losses, stats


# ---------------------------------------------------------------------------------------------- evaluation


def summarize_groups(groups: list[Any]) -> dict[str, float]:
    """The demo's statistics of one-trajectory groups (memrl.eval.evaluator.memact_summary_of)."""
    from memrl.eval.evaluator import memact_summary_of

    return memact_summary_of(groups)


def evaluate(model: Any, tokenizer: Any, wf_cfg: Any, tasks: list[Any], temperature: float,
             seed: int, engine_cfg: Any = None, model_dir: str | Path = "") -> dict[str, dict[str, float]]:
    """{"greedy": summary, "sampled": summary} of the policy on the held-out tasks (each searching its own
    fact sheet): memrl.eval.evaluator.evaluate_memact through the engine `engine_cfg` names."""
    from memrl.eval.evaluator import EngineRollout, evaluate_memact, model_engine
    from memrl.workflows import get_workflow

    with model_engine(model, tokenizer, engine_cfg, model_dir) as engine:
        return evaluate_memact(EngineRollout(engine, get_workflow("memact")), wf_cfg, tasks, temperature, seed)


# ---------------------------------------------------------------------------------------------- the demo


def run_memact_demo(out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run the whole demo (module docstring); returns what results.json holds."""
    from memrl.config import to_yaml
    from memrl.eval.demo_report import print_memact_eval, write_memact_outputs
    from memrl.training.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    t_start = time.perf_counter()
    cfg, tcfg, out, workflow = load_configs(overrides, out_dir)
    wf_cfg = workflow[1]
    (out / "demo_config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    data = write_data(cfg, out / "data")
    tokenizer, model = init_model(cfg, wf_cfg, data.sft_tasks, out)
    n_params = sum(p.numel() for p in model.parameters())
    budget = cfg.context_budget or calibrate_budget(data.sft_tasks[:200], tokenizer, wf_cfg, cfg.sft.search_topk)
    wf_cfg = replace(wf_cfg, max_context_tokens=budget)
    tcfg.workflow["max_context_tokens"] = budget
    workflow = (workflow[0], wf_cfg)
    print(f"working-context budget: {budget} tokens")
    print(f"model: {n_params / 1e6:.2f}M parameters, vocabulary {len(tokenizer)}")
    timings["init_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    warmup_losses = copy_warmup(cfg, tcfg, model, tokenizer, out) if cfg.sft.copy_warmup_steps else []
    timings["copy_warmup_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    sft_losses, demo_stats = cold_start(cfg, tcfg, model, tokenizer, wf_cfg, data.sft_tasks, out)
    timings["sft_s"] = time.perf_counter() - t0

    def heldout(policy: Any, model_dir: str | Path) -> dict[str, dict[str, float]]:
        return evaluate(policy, tokenizer, wf_cfg, data.eval_tasks, cfg.eval.temperature,
                        cfg.eval.seed, tcfg.engine, model_dir)

    t0 = time.perf_counter()
    sft_eval = heldout(model, out / "sft")
    timings["eval_sft_s"] = time.perf_counter() - t0
    print_memact_eval("SFT", sft_eval)

    t0 = time.perf_counter()
    trainer = Trainer(tcfg, workflow=workflow)
    history = trainer.fit()
    timings["rl_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    rl_eval = heldout(trainer.model, latest_checkpoint(trainer.ckpt_root) or "")
    timings["eval_rl_s"] = time.perf_counter() - t0
    print_memact_eval("SFT+DCPO", rl_eval)
    timings["total_s"] = time.perf_counter() - t_start

    results = {
        "sft": sft_eval, "dcpo": rl_eval, "demonstrator": demo_stats, "timings": timings,
        "num_parameters": n_params, "vocab_size": len(tokenizer), "sft_losses": sft_losses,
        "copy_warmup_losses": warmup_losses,
        "rl": {k: [h.get(k, 0.0) for h in history]
               for k in ("reward/mean", "dcpo/pruned_share", "dcpo/selected", "dcpo/available",
                         "dcpo/segments_per_trajectory", "rollout/segments")},
        "budget": {"max_context_tokens": wf_cfg.max_context_tokens, "eval_tasks": len(data.eval_tasks)},
    }
    print(write_memact_outputs(results, out))
    print(f"wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'memact_results.png'} "
          f"({timings['total_s'] / 60:.1f} min)")
    return results
