"""Supervised cold start on workflow traces (same Segment rows and loss masks as RL).

  memrl train-sft --preset sft_demo_cpu model.path=runs/demo/init out_dir=runs/sft
  memrl train-sft model.path=... workflow.chunk_tokens=16 demonstrator.skip_prob=0.1 sft.epochs=2

Demonstrations come from running the workflow with a scripted demonstrator engine; the built-in one is
`memrl.demonstrators.MixtureRule` over synthetic tasks: per memory step the optimal QuestionAwareRule with
probability demonstrator.p_aware, else the question-blind RecentFactsRule (keep the newest facts).
The result is a HuggingFace directory in out_dir.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from memrl.config import valid
from memrl.training.config import WORKFLOW_DEFAULTS, DataSection, ModelSection
from memrl.training.sft import SFTConfig


@dataclass
class DemonstratorSection:
    """The rule that writes the demonstrations."""

    num_tasks: int = valid(800, ge=1)
    budget: int = valid(1, ge=1)
    """Facts a demonstrated memory keeps."""
    skip_prob: float = valid(0.25, ge=0, le=1)
    """Chance the rule ignores a section's facts (a question-blind coin flip)."""
    p_aware: float = valid(0.0, ge=0, le=1)
    """Per memory step, the chance of playing the optimal `QuestionAwareRule` instead (`MixtureRule`; 0 =
    the question-blind `RecentFactsRule` exactly)."""


@dataclass
class SFTRunConfig:
    """Everything `memrl train-sft` needs."""

    model: ModelSection = field(default_factory=ModelSection)
    workflow: dict[str, Any] = field(default_factory=lambda: {"name": "memagent"})
    """The workflow (`name`) and its config fields (workflow.chunk_tokens=16), as in `memrl train`."""
    data: DataSection = field(default_factory=DataSection)
    demonstrator: DemonstratorSection = field(default_factory=DemonstratorSection)
    sft: SFTConfig = field(default_factory=SFTConfig)
    out_dir: str = "runs/sft"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="dotted config overrides")
    parser.add_argument("--preset", default=None, help="preset name or YAML path (e.g. sft_demo_cpu)")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")


def run(args: argparse.Namespace) -> int:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.config import ConfigError, load_config, to_yaml
    from memrl.data.synthetic import make_tasks
    from memrl.demonstrators import MixtureRule, ScriptedEngine
    from memrl.errors import model_dir
    from memrl.training.sft import sft_train_logged
    from memrl.training.trainer import check_writable
    from memrl.workflows import parse_workflow
    from memrl.workflows.runner import rollout_sync

    cfg = load_config(SFTRunConfig, args.overrides, preset=args.preset)
    model_dir(cfg.model.path, "model.path")
    if cfg.data.name != "synthetic":
        raise ConfigError("data.name: train-sft's built-in demonstrator needs synthetic tasks")
    spec, wf = parse_workflow(cfg.workflow, defaults=WORKFLOW_DEFAULTS)
    out = check_writable(cfg.out_dir)
    (out / "config.yaml").write_text(to_yaml(cfg), encoding="utf-8")
    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    model = AutoModelForCausalLM.from_pretrained(cfg.model.path).to(cfg.model.device)
    mem, fin = wf.templates()
    rule = MixtureRule(mem.text, fin.text, cfg.demonstrator.budget, cfg.demonstrator.skip_prob,
                       wf.no_memory_text, cfg.data.seed, p_aware=cfg.demonstrator.p_aware)
    tasks = make_tasks(cfg.data.synthetic, cfg.demonstrator.num_tasks, seed=cfg.data.seed)
    groups = rollout_sync(tasks, spec, ScriptedEngine(rule, tokenizer=tok), wf, n=1)
    segments = [s for g in groups for s in g.segments()]
    losses = sft_train_logged(model, tok, segments, cfg.sft, out, save_dir=out)
    print(f"SFT on {len(segments)} rows: loss {losses[0]:.3f} -> {losses[-1]:.3f}; model in {out}")
    return 0
