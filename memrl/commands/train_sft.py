"""Supervised cold start on workflow traces (same Segment rows and loss masks as RL).

  memrl train-sft --preset sft_demo_cpu model.path=runs/demo/init out_dir=runs/sft
  memrl train-sft model.path=... workflow.chunk_tokens=16 demonstrator.skip_prob=0.1 sft.epochs=2
  memrl train-sft model.path=... data.name=file data.path=cold_start.parquet [conversations.max_length=18000]

Demonstrations come from running the workflow with a scripted demonstrator engine; the built-in one is
`memrl.demonstrators.MixtureDemonstrator` over synthetic tasks: per memory step the optimal QuestionAwareDemonstrator with
probability demonstrator.p_aware, else the question-blind RecentFactsDemonstrator (keep the newest facts).
With `data.name=file`, `data.path` is a conversation file instead (rows of `messages` + `tools`, MemAct's
cold-start layout; detected from its first row): each chat is one row, masked by MemAct's prune rule
(memrl.data.conversations). With `data.name=file` and a task file (HotpotQA / 2Wiki built by `memrl data
build`), `demonstrator.name=evidence` plays `memrl.demonstrators.evidence.EvidenceDemonstrator` over its tasks
(memory: the supporting-fact sentences a section shows; final reply: the boxed gold answer), its facts read
from `demonstrator.source`, the original HotpotQA / 2Wiki file; `demonstrator.name=needle` plays the same reader over
a RULER task file, keeping the needle sentences. `model.compute_dtype=bfloat16` runs the
forwards in bfloat16 over float32 weights. The result is a HuggingFace directory in out_dir.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from memrl.config import MAX_COUNT, MAX_TOKENS, ConfigError, load_config, to_yaml, valid
from memrl.data.conversations import conversation_segments, is_conversation_file, load_conversations
from memrl.data.io import load_tasks
from memrl.data.synthetic import make_tasks
from memrl.demonstrators import MixtureDemonstrator, play_scripted
from memrl.demonstrators.evidence import EvidenceDemonstrator
from memrl.errors import model_dir
from memrl.locks import locked_dir
from memrl.model_open import open_model
from memrl.precision import resolve_compute_dtype, torch_dtype
from memrl.training.assemble import check_writable
from memrl.training.config import DataSection, ModelSection
from memrl.training.sft import SFTConfig, sft_train_logged
from memrl.training.update import lora
from memrl.types import Group, Segment
from memrl.workflows import parse_workflow


@dataclass
class DemonstratorSection:
    """The rule that writes the demonstrations."""

    name: str = valid("synthetic", choices=("synthetic", "evidence", "needle"))
    """synthetic: the built-in rule over synthetic tasks (the fields below); evidence: the supporting-fact
    reader over a HotpotQA / 2Wiki task file (data.name=file, demonstrator.source); needle: the same reader over
    a RULER task file (data.name=file), keeping the sentences that hold a gold value (the needle, the links of
    a variable chain) and boxing the gold values (memrl.demonstrators.evidence.needle_evidence)."""
    source: str = ""
    """demonstrator.name=evidence: the original HotpotQA / 2Wiki file (with supporting_facts) the task file in
    data.path was built from."""
    num_tasks: int = valid(800, ge=1, le=MAX_COUNT)
    budget: int = valid(1, ge=1, le=MAX_COUNT)
    """Facts a demonstrated memory keeps."""
    skip_prob: float = valid(0.25, ge=0, le=1)
    """Chance the rule ignores a section's facts (a question-blind coin flip)."""
    p_aware: float = valid(0.0, ge=0, le=1)
    """Per memory step, the chance of playing the optimal `QuestionAwareDemonstrator` instead (`MixtureDemonstrator`; 0 =
    the question-blind `RecentFactsDemonstrator` exactly)."""


@dataclass
class ConversationSection:
    """data.name=file with a conversation file: how its chats become rows (memrl.data.conversations)."""

    max_length: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = no limit")
    """Tokens per chat; a longer one is truncated by `truncation`. 0 = no limit (memrl); MemAct's cold-start
    scripts use 18000 with left truncation."""
    truncation: str = valid("left", choices=("left", "right", "error"))
    """left (keep the end, MemAct's scripts), right (keep the start) or error (refuse the file)."""
    skip_bad: bool = False
    """Skip (and count) malformed rows instead of failing."""

    def __post_init__(self) -> None:
        if self.max_length < 0:
            raise ValueError(f"conversations.max_length must be >= 0, got {self.max_length}")
        if self.truncation not in ("left", "right", "error"):
            raise ValueError(f"conversations.truncation must be left, right or error, got {self.truncation!r}")


@dataclass
class SFTRunConfig:
    """Everything `memrl train-sft` needs."""

    model: ModelSection = field(default_factory=ModelSection)
    workflow: dict[str, Any] = field(default_factory=lambda: {"name": "memagent"})
    """The workflow (`name`) and its config fields (workflow.chunk_tokens=16), as in `memrl train`."""
    data: DataSection = field(default_factory=DataSection)
    demonstrator: DemonstratorSection = field(default_factory=DemonstratorSection)
    conversations: ConversationSection = field(default_factory=ConversationSection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    out_dir: str = "runs/sft"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.add_argument("--preset", default=None, help="preset name or YAML path (e.g. sft_demo_cpu)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    cfg = load_config(SFTRunConfig, args.overrides, preset=args.preset)
    model_dir(cfg.model.path, "model.path")
    cfg.model.compute_dtype = resolve_compute_dtype(cfg.model.compute_dtype, cfg.model.device, "model.compute_dtype")
    if cfg.data.name not in ("file", "synthetic"):
        raise ConfigError(f"data.name: train-sft takes synthetic (the built-in demonstrator) or file (a "
                          f"conversation file, or a task file with demonstrator.name=evidence), got {cfg.data.name!r}")
    evidence = cfg.demonstrator.name in ("evidence", "needle")
    if evidence and cfg.data.name != "file":
        kind = "HotpotQA / 2Wiki" if cfg.demonstrator.name == "evidence" else "RULER"
        raise ConfigError(f"demonstrator.name={cfg.demonstrator.name} reads a {kind} task file: set data.name=file and "
                          "data.path")
    if cfg.demonstrator.name == "evidence" and not Path(cfg.demonstrator.source).is_file():
        raise ConfigError(f"demonstrator.source: {cfg.demonstrator.source!r} is not a file (demonstrator.name=evidence "
                          "needs the original HotpotQA / 2Wiki file, with its supporting_facts)")
    with locked_dir(check_writable(cfg.out_dir), "out_dir"):  # one process per out_dir, as memrl train
        if cfg.data.name == "synthetic":
            return _run_demonstrator(cfg)
        return _run_evidence(cfg) if evidence else _run_conversations(cfg)


def _run_demonstrator(cfg: SFTRunConfig) -> int:
    """SFT on the built-in demonstrator's replies to synthetic tasks."""
    spec, wf = parse_workflow(cfg.workflow, stage="train")
    mem, fin = wf.templates()
    rule = MixtureDemonstrator(mem.text, fin.text, cfg.demonstrator.budget, cfg.demonstrator.skip_prob,
                       wf.no_memory_text, cfg.data.seed, p_aware=cfg.demonstrator.p_aware)
    tasks = make_tasks(cfg.data.synthetic, cfg.demonstrator.num_tasks, seed=cfg.data.seed)
    segments, losses, out = _sft(cfg, lambda tok: _rows(play_scripted(rule, tasks, tok, spec, wf)))
    print(f"SFT on {len(segments)} rows: loss {losses[0]:.3f} -> {losses[-1]:.3f}; model in {out}")
    return 0


def _run_evidence(cfg: SFTRunConfig) -> int:
    """SFT on the evidence reader's trajectories over a HotpotQA / 2Wiki task file, or over a RULER task file
    with demonstrator.name=needle (memrl.demonstrators.evidence)."""
    spec, wf = parse_workflow(cfg.workflow, stage="train")
    name = cfg.demonstrator.name
    if spec.name != "memagent":
        raise ConfigError(f"demonstrator.name={name} plays the memagent workflow, got workflow.name={spec.name!r}")
    path = cfg.data.path
    if not path or not Path(path).is_file():
        raise ConfigError(f"data.path: {path!r} is not a file (demonstrator.name={name} reads a task file)")
    tasks = load_tasks(path)
    if name == "needle":
        reader, tasks = EvidenceDemonstrator.for_needles(wf, tasks)
        if not tasks:
            raise ConfigError(f"data.path {path}: no task holds a gold value in its context (demonstrator.name=needle "
                              "reads RULER task files)")
    else:
        try:
            reader = EvidenceDemonstrator.for_tasks(wf, tasks, load_tasks(cfg.demonstrator.source))
        except ValueError as e:
            raise ConfigError(f"demonstrator.source {cfg.demonstrator.source}: {e}") from None
    segments, losses, out = _sft(cfg, lambda tok: _rows(play_scripted(reader, tasks, tok, spec, wf)))
    trained = sum(s.num_trained_tokens for s in segments)
    print(f"SFT on {len(segments)} rows of {len(tasks)} tasks, {trained} trained tokens: loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}; model in {out}")
    return 0


def _run_conversations(cfg: SFTRunConfig) -> int:
    """SFT on a conversation file's chats (memrl.data.conversations)."""
    path = cfg.data.path
    if not path or not Path(path).is_file():
        raise ConfigError(f"data.path: {path!r} is not a file (train-sft with data.name=file reads a conversation file)")
    if not is_conversation_file(path):
        raise ConfigError(f"data.path: {path} is not a conversation file: its first row has no 'messages' list "
                          "(train-sft reads rows of messages + tools; a HotpotQA / 2Wiki task file needs "
                          "demonstrator.name=evidence)")
    convs, skipped = load_conversations(path, skip_bad=cfg.conversations.skip_bad)
    c = cfg.conversations
    segments, losses, out = _sft(cfg, lambda tok: conversation_segments(tok, convs, c.max_length, c.truncation))
    note = f" ({skipped} malformed rows skipped)" if skipped else ""
    trained = sum(s.num_trained_tokens for s in segments)
    print(f"SFT on {len(segments)} chats{note}, {trained} trained tokens: loss {losses[0]:.3f} -> "
          f"{losses[-1]:.3f}; model in {out}")
    return 0


def _sft(cfg: SFTRunConfig, rows: Callable[[Any], list[Segment]]) -> tuple[list[Segment], list[float], Path]:
    """The one SFT pipeline of every source: config.yaml in out_dir, the model's tokenizer, the rows
    `rows(tokenizer)` makes, the model (with LoRA adapters under model.lora), SFT (memrl.training.sft,
    checkpoints in out_dir), the merged model when asked; returns (the rows, the losses, out_dir)."""
    out = check_writable(cfg.out_dir)
    (out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    segments = rows(tok)
    model = _lora(open_model(cfg.model.path, "model.path").to(cfg.model.device), cfg)
    losses = sft_train_logged(model, tok, segments, cfg.sft, out, save_dir=out,
                              compute=torch_dtype(cfg.model.compute_dtype))
    _save_merged(model, tok, out, cfg)
    return segments, losses, out


def _rows(groups: list[Group]) -> list[Segment]:
    return [s for g in groups for s in g.segments()]


def _lora(model: Any, cfg: SFTRunConfig) -> Any:
    """model.lora.rank > 0: the model with PEFT LoRA adapters (only they train; memrl.training.update.lora)."""
    return lora.wrap(model, cfg.model.lora, cfg.sft.seed) if lora.enabled(cfg.model) else model


def _save_merged(model: Any, tok: Any, out: Any, cfg: SFTRunConfig) -> None:
    """With LoRA, out_dir holds PEFT's adapter; model.lora.save_merged adds the merged model in out_dir/merged."""
    if lora.is_peft(model) and cfg.model.lora.save_merged:
        lora.save_merged_dir(model, tok, out / lora.MERGED_DIR)
