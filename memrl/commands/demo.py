"""The CPU demo: a tiny model learns, with RL, which facts a MemAgent memory must keep.

  memrl demo --out runs/demo                  # ~15 minutes on 2 CPU cores
  memrl demo --out runs/demo sft.epochs=2 train.trainer.steps=40 eval.num_tasks=200

Steps: init a ~2.5M-parameter Qwen2 (tokenizer trained on the synthetic task's text) -> cold-start SFT
on traces of a question-blind rule (keep the most recent fact) -> multi-conversation GRPO on the
MemAgent workflow -> greedy evaluation on held-out synthetic tasks (new seeds) at the training length,
4x and 16x -> results.md (printed), results.json, accuracy_vs_length.png, rl_reward.png.
Overrides: `key=value` for the demo config (DemoConfig below), `train.<key>=value` for the RL
config (preset demo_cpu); `engine.*` and `workflow.*` are spelled as in `memrl train` and `memrl eval`
(they set the RL config's sections, which the demo's evaluations use too).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class DemoSFT:
    """Cold start: demonstrations from `RecentFactsRule` (question-blind: keep the newest fact)."""

    num_tasks: int = 3000
    """Training tasks to record demonstrations on (each gives num_chunks + 1 rows)."""
    budget: int = 1
    """Facts the demonstrated memory keeps."""
    skip_prob: float = 0.4
    """Chance the demonstrator ignores a section's fact (a question-blind coin flip; < 0.5 so the
    demonstrated majority action is "keep the newest fact", while sampling still explores keeping)."""
    unanswerable_text: str | None = None
    """What the demonstrated final answer boxes when the memory holds no fact about the question's key,
    e.g. "unknown" (null = guess the memory fact's value). Off: with "unknown" the micro model's cold start
    learned that shortcut before copying facts (0-19% held-out after SFT, docs/demo.md)."""
    restate_key: bool = False
    """Demonstrated memories open with the question's key ("- Linka : Kalo is red"): the memory says what
    it is looking for (format; the kept fact stays question-blind)."""
    restate_sep: str | None = ":"
    """Word between the restated key and the fact (null = none: "- Linka Kalo is red")."""
    reading_tasks: int = 0
    """Extra rows that answer the question from the whole (short) document, in the final-answer format
    ("Q: what is Kalo\nM: <document>\nA:" -> "\\boxed{ red}"): reading comprehension, the skill a
    pretrained LLM brings to MemAgent. It shows how to find the fact a question asks for, never which facts
    a memory should keep. 0 = off."""
    epochs: int = 2
    lr: float = 3e-3
    batch_rows: int = 32
    warmup_steps: int = 20


@dataclass
class DemoEval:
    """Held-out evaluation: fixed protocol, greedy decoding, seeds never used in training."""

    num_tasks: int = 256
    """Tasks per length."""
    multipliers: list[int] = field(default_factory=lambda: [1, 4, 16])
    """Lengths evaluated, as multiples of the training length (in chunks)."""
    seed: int = 987654
    """Seed of the held-out task stream (training uses data.seed and the SFT seed)."""


@dataclass
class DemoConfig:
    """`memrl demo` settings; the RL settings are the `demo_cpu` training preset (+ train.* overrides)."""

    model_preset: str = "micro"
    """"micro" (the shape below, ~0.8M parameters: learns to copy facts within the CPU budget) or a
    memrl.models.tiny preset ("tiny" ~3M, "small" ~24M)."""
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    vocab_size: int = 2048
    """BPE target; the trained vocabulary stops earlier when the corpus runs out of merges."""
    seed: int = 0
    sft_seed: int = 500
    """Seed of the SFT demonstration tasks."""
    sft: DemoSFT = field(default_factory=DemoSFT)
    eval: DemoEval = field(default_factory=DemoEval)
    train_preset: str = "demo_cpu"
    threads: int = 0
    """torch threads (0 = torch's default)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help="demo overrides (sft.epochs=2) or RL overrides (train.trainer.steps=40)")
    parser.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def evaluate(model: Any, tokenizer: Any, wf_cfg: Any, syn: Any, lengths: list[int], num_tasks: int,
             seed: int, engine_cfg: Any = None, model_dir: str | Path = "") -> dict[int, dict[str, float]]:
    """Greedy accuracy (boxed exact match) on `num_tasks` held-out tasks per length (in chunks), through
    the engine `engine_cfg` names (default: hf serving `model` itself); an engine that loads weights
    itself loads `model_dir`, which must hold `model`'s weights."""
    import asyncio

    from memrl.engines import EngineConfig, build_engine
    from memrl.workflows import get_workflow

    spec = get_workflow("memagent")
    ecfg = engine_cfg if engine_cfg is not None else EngineConfig(max_batch_size=256)
    if ecfg.name != "hf" and not ecfg.model:
        ecfg = replace(ecfg, model=str(model_dir))
    engine = build_engine(ecfg, policy=model, tokenizer=tokenizer)
    try:
        return _evaluate(engine, spec, replace(wf_cfg, temperature=0.0), syn, lengths, num_tasks, seed)
    finally:
        asyncio.run(engine.close())


def _evaluate(engine: Any, spec: Any, greedy: Any, syn: Any, lengths: list[int], num_tasks: int,
              seed: int) -> dict[int, dict[str, float]]:
    from memrl.data.synthetic import make_tasks
    from memrl.workflows.runner import rollout_sync

    out: dict[int, dict[str, float]] = {}
    for n_chunks in lengths:
        t0 = time.perf_counter()
        tasks = make_tasks(replace(syn, num_chunks=n_chunks, min_chunks=0), num_tasks, seed=seed)
        groups = rollout_sync(tasks, spec, engine, greedy, n=1, concurrency=4096, seed=seed)
        rewards = [g.rewards[0] for g in groups]
        trajs = [g.trajectories[0] for g in groups]
        out[n_chunks] = {
            "accuracy": 100.0 * sum(rewards) / len(rewards),
            "tokens": _metric_mean(trajs, "context_tokens"),
            "no_box": 100.0 * _metric_mean(trajs, "no_box"),
            # retention: the memory held the answer at some call / still held it at the end
            "answer_seen": 100.0 * _metric_mean(trajs, "answer_seen"),
            "answer_kept": 100.0 * _metric_mean(trajs, "answer_kept"),
            "seconds": time.perf_counter() - t0,
        }
    return out


def _metric_mean(trajs: list[Any], name: str) -> float:
    return sum(t.metrics.get(name, 0.0) for t in trajs) / len(trajs)


def _split(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(demo overrides, RL overrides): `train.<key>` and the shared sections (`engine`, `workflow`, spelled
    as in `memrl train` / `memrl eval`) go to the RL config."""
    demo, train = [], []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        if ov.startswith("train."):
            train.append(ov.removeprefix("train."))
        elif key.split(".", 1)[0] in SHARED_SECTIONS:
            train.append(ov)
        else:
            demo.append(ov)
    return demo, train


SHARED_SECTIONS = ("engine", "workflow")


def load_demo_configs(overrides: list[str], out_dir: str | Path) -> tuple[DemoConfig, Any, Path, tuple[Any, Any]]:
    """(demo config, validated RL config, writable output dir, parsed workflow (spec, config)) from
    `key=value` / `train.key=value` overrides; sets torch's thread count when `threads` is given. Fails
    before any work on a bad value."""
    import torch

    from memrl.config import load_config
    from memrl.training.config import TrainConfig
    from memrl.training.trainer import check_writable, validate

    demo_ov, train_ov = _split(list(overrides))
    cfg = load_config(DemoConfig, demo_ov)
    out = check_writable(out_dir, "--out")
    tcfg = load_config(TrainConfig, [f"model.path={out / 'sft'}", f"out_dir={out / 'rl'}", *train_ov],
                       preset=cfg.train_preset)
    workflow = validate(tcfg)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    return cfg, tcfg, out, workflow


def run(args: argparse.Namespace) -> int:
    from memrl.config import to_yaml

    t_start = time.perf_counter()
    cfg, tcfg, out, workflow = load_demo_configs(args.overrides, args.out)
    wf_cfg = workflow[1]
    (out / "demo_config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    timings: dict[str, float] = {}

    # 1. tiny model with a tokenizer trained on the task's own text
    t0 = time.perf_counter()
    tokenizer, model = _init_model(cfg, tcfg, out, wf_cfg)
    timings["init_s"] = time.perf_counter() - t0

    # 2. cold-start SFT on the question-blind rule's traces
    t0 = time.perf_counter()
    sft_losses = _sft(cfg, tcfg, model, tokenizer, wf_cfg, out)
    timings["sft_s"] = time.perf_counter() - t0
    syn = tcfg.data.synthetic
    lengths = [syn.num_chunks * m for m in cfg.eval.multipliers]
    t0 = time.perf_counter()
    sft_eval = evaluate(model, tokenizer, wf_cfg, syn, lengths, cfg.eval.num_tasks, cfg.eval.seed,
                        tcfg.engine, out / "sft")
    timings["eval_sft_s"] = time.perf_counter() - t0
    _print_eval("SFT", sft_eval)

    # 3. RL: multi-conversation GRPO on MemAgent
    from memrl.training.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    t0 = time.perf_counter()
    trainer = Trainer(tcfg, workflow=workflow)
    history = trainer.fit()
    timings["rl_s"] = time.perf_counter() - t0

    # 4. held-out evaluation of the RL policy, same protocol
    t0 = time.perf_counter()
    rl_eval = evaluate(trainer.model, tokenizer, wf_cfg, syn, lengths, cfg.eval.num_tasks, cfg.eval.seed,
                       tcfg.engine, latest_checkpoint(trainer.ckpt_root) or "")
    timings["eval_rl_s"] = time.perf_counter() - t0
    _print_eval("SFT+RL", rl_eval)
    timings["total_s"] = time.perf_counter() - t_start

    table = results_markdown(sft_eval, rl_eval, syn.num_chunks, syn.chunk_words, cfg.eval.num_tasks, timings)
    print(table)
    (out / "results.md").write_text(table, encoding="utf-8")
    (out / "results.json").write_text(json.dumps({
        "sft": {str(k): v for k, v in sft_eval.items()}, "rl": {str(k): v for k, v in rl_eval.items()},
        "timings": timings, "sft_losses": sft_losses,
        "rl_reward": [h.get("reward/mean", 0.0) for h in history],
    }, indent=2) + "\n", encoding="utf-8")
    _plots(out, sft_eval, rl_eval, history, syn.chunk_words)
    print(f"wrote {out / 'results.md'}, {out / 'accuracy_vs_length.png'}, {out / 'rl_reward.png'} "
          f"({timings['total_s'] / 60:.1f} min)")
    return 0


def _init_model(cfg: DemoConfig, tcfg: Any, out: Path, wf_cfg: Any) -> tuple[Any, Any]:
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
        Qwen2ForCausalLM(qwen2_config(shape, len(tok), tok.eos_token_id, tok.pad_token_id)).save_pretrained(init_dir)
    else:
        init_tiny_model(init_dir, preset=cfg.model_preset, corpus=[corpus], seed=cfg.seed,
                        vocab_size=cfg.vocab_size)
    tokenizer = AutoTokenizer.from_pretrained(init_dir)
    model = AutoModelForCausalLM.from_pretrained(init_dir)
    # Chunks must line up with the task's pieces: every word one token.
    n_tok = len(tokenizer.encode(sample.context, add_special_tokens=False))
    want = sample.meta["num_chunks"] * syn.chunk_words
    if n_tok != want:
        log.warning("synthetic pieces are %d tokens, expected %d: chunks will not align with facts", n_tok, want)
    if wf_cfg.chunk_tokens != syn.chunk_words:
        log.warning("workflow chunk_tokens=%d but synthetic chunk_words=%d", wf_cfg.chunk_tokens, syn.chunk_words)
    return tokenizer, model


def _sft(cfg: DemoConfig, tcfg: Any, model: Any, tokenizer: Any, wf_cfg: Any, out: Path,
         question_aware: bool = False) -> list[float]:
    """Cold start on the question-blind rule's traces (`question_aware`: on the optimal policy's
    instead, which only benchmarks/demo_ceiling.py uses, to measure what the model can represent)."""
    from memrl.data.synthetic import make_tasks
    from memrl.demonstrators import QuestionAwareRule, RecentFactsRule, ScriptedEngine
    from memrl.training.logging import MetricsLogger
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.workflows import get_workflow
    from memrl.workflows.runner import rollout_sync

    mem_tpl, fin_tpl = wf_cfg.templates()
    rule_cls = QuestionAwareRule if question_aware else RecentFactsRule
    rule = rule_cls(mem_tpl.text, fin_tpl.text, budget=cfg.sft.budget, skip_prob=cfg.sft.skip_prob,
                    no_memory_text=wf_cfg.no_memory_text, seed=cfg.seed,
                    unanswerable_text=cfg.sft.unanswerable_text or None, fact_sep=tcfg.data.synthetic.fact_sep,
                    restate_key=cfg.sft.restate_key, restate_sep=cfg.sft.restate_sep)
    tasks = make_tasks(tcfg.data.synthetic, cfg.sft.num_tasks, seed=cfg.sft_seed)
    groups = rollout_sync(tasks, get_workflow("memagent"), ScriptedEngine(rule, tokenizer=tokenizer), wf_cfg, n=1)
    segments = [s for g in groups for s in g.segments()]
    rule_acc = sum(g.rewards[0] for g in groups) / len(groups)
    print(f"SFT: {len(segments)} rows from {len(groups)} demonstrations (the rule's own accuracy {100 * rule_acc:.1f}%)")
    if cfg.sft.reading_tasks:
        reading = reading_segments(make_tasks(tcfg.data.synthetic, cfg.sft.reading_tasks, seed=cfg.sft_seed + 1),
                                   tokenizer, fin_tpl)
        segments += reading
        print(f"SFT: + {len(reading)} reading-comprehension rows (answer from the whole document)")
    scfg = SFTConfig(epochs=cfg.sft.epochs, batch_rows=cfg.sft.batch_rows, lr=cfg.sft.lr,
                     warmup_steps=cfg.sft.warmup_steps, seed=cfg.seed)
    steps = cfg.sft.epochs * ((len(segments) + scfg.batch_rows - 1) // scfg.batch_rows)
    logger = MetricsLogger(out / "sft", tensorboard=tcfg.trainer.tensorboard, progress_total=steps,
                           progress=tcfg.trainer.progress, desc="sft")
    try:
        losses = sft_train(model, segments, scfg, pad_id=tokenizer.pad_token_id or 0,
                           on_step=lambda s, n, m: logger.log(s, m))
    finally:
        logger.close()
    model.save_pretrained(out / "sft", safe_serialization=True)
    tokenizer.save_pretrained(out / "sft")
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


def _print_eval(name: str, res: dict[int, dict[str, float]]) -> None:
    parts = ", ".join(f"{k} chunks {v['accuracy']:.1f}%" for k, v in res.items())
    print(f"{name} held-out accuracy: {parts}")


def results_markdown(sft: dict[int, dict[str, float]], rl: dict[int, dict[str, float]], train_chunks: int,
                     chunk_words: int, num_tasks: int, timings: dict[str, float]) -> str:
    """The demo's results table: SFT vs SFT+RL accuracy per evaluated length."""
    lines = [
        "| length (chunks) | context tokens | x training length | SFT accuracy | SFT+RL accuracy | gain (points) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sft:
        s, r = sft[n]["accuracy"], rl[n]["accuracy"]
        lines.append(f"| {n} | {n * chunk_words} | {n // train_chunks}x | {s:.1f}% | {r:.1f}% | {r - s:+.1f} |")
    lines += [
        "",
        "Memory retention (held-out, % of tasks): the answer was in some memory (seen) / in the last one (kept).",
        "",
        "| length (chunks) | SFT seen | SFT kept | SFT+RL seen | SFT+RL kept |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in sft:
        lines.append(f"| {n} | {sft[n]['answer_seen']:.1f}% | {sft[n]['answer_kept']:.1f}% | "
                     f"{rl[n]['answer_seen']:.1f}% | {rl[n]['answer_kept']:.1f}% |")
    t = timings
    lines += [
        "",
        f"Held-out synthetic tasks ({num_tasks} per length, new seed), greedy decoding, boxed exact match.",
        f"Time: init {t.get('init_s', 0):.0f}s, SFT {t.get('sft_s', 0):.0f}s, SFT eval {t.get('eval_sft_s', 0):.0f}s, "
        f"RL {t.get('rl_s', 0):.0f}s, RL eval {t.get('eval_rl_s', 0):.0f}s, total {t.get('total_s', 0) / 60:.1f} min.",
    ]
    return "\n".join(lines) + "\n"


def _plots(out: Path, sft: dict[int, dict[str, float]], rl: dict[int, dict[str, float]],
           history: list[dict[str, float]], chunk_words: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs = [n * chunk_words for n in sft]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(xs, [sft[n]["accuracy"] for n in sft], "o-", label="SFT (cold start)")
    ax.plot(xs, [rl[n]["accuracy"] for n in rl], "s-", label="SFT + RL (GRPO)")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("document length (tokens, log scale)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "accuracy_vs_length.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(range(1, len(history) + 1), [h.get("reward/mean", 0.0) for h in history], "-")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward (sampled, T=1)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "rl_reward.png", dpi=120)
    plt.close(fig)
