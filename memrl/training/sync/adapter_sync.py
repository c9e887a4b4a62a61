"""LoRA weight sync by adapter (`engine.vllm.lora_sync=adapter`, `engine.openai.lora_sync=adapter`).

Instead of the merged weights (memrl.training.update.lora.merged_state), each sync writes the policy's current
adapter in PEFT's format (adapter_config.json + adapter_model.safetensors) to a new directory
`<root>/adapter-<version>` and hands it to the engine:

- in-process vLLM (`VLLMEngine.load_adapter`): built with vLLM's LoRA support (max_lora_rank from
  model.lora.rank); a new LoRARequest per version, carried by every generate call;
- a vLLM OpenAI-compatible server (`OpenAIEngine.load_adapter`): POST /v1/load_lora_adapter, requests
  name the adapter as their model, the previous adapter is unloaded (/v1/unload_lora_adapter).

The previous version's directory is deleted once the new one is served, so `<root>` holds one adapter
(an earlier run's `adapter-*` directories there are deleted at the first sync).
In-process engines (rollout.num_engines=0) only: Ray replicas get merged weights (rollout.weight_sync).
docs/guides/lora.md says which default the measurement picked, and why.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from memrl.config import ConfigError
from memrl.engines.registry import engine_kind
from memrl.quiet import peft_rename_warning_off

ADAPTER_DIR = "engine_adapter"
"""<out_dir>/engine_adapter: where in-process vLLM's adapters are written."""


def _setting(engine: Any) -> tuple[str, str] | None:
    """(the lora_sync field that applies to `engine`, its value); None for a kind without adapters (hf)."""
    return engine_kind(engine.name).lora_sync(engine)


def mode(cfg: Any) -> str:
    """The lora_sync setting that applies to this training config: "merged" or "adapter" (always merged
    without LoRA, for hf engines and for Ray replicas)."""
    setting = _setting(cfg.engine)
    return "merged" if setting is None or cfg.rollout.num_engines > 0 else setting[1]


def check(cfg: Any) -> None:
    """One-line ConfigError for an adapter sync the run cannot do (called by TrainConfig.check)."""
    e, r = cfg.engine, cfg.rollout
    setting = _setting(e)  # hf: serves the PeftModel or a merged copy; the vllm / openai sections are ignored
    if setting is None or setting[1] != "adapter":
        return
    field = setting[0]
    rank = int(cfg.model.lora.rank)
    if rank <= 0:
        raise ConfigError(f"{field}=adapter needs LoRA (model.lora.rank > 0, got {rank})")
    if r.num_engines > 0:
        raise ConfigError(f"{field}=adapter is for an in-process engine (rollout.num_engines=0, got "
                          f"{r.num_engines}): Ray replicas get the merged weights (rollout.weight_sync)")
    kind = engine_kind(e.name)
    problem = kind.adapter_problem(e, field, rank) if kind.adapter_problem is not None else None
    if problem:
        raise ConfigError(problem)


class AdapterSync:
    """Writes the policy's adapter to a new directory per sync and has `engine` serve it."""

    def __init__(self, model: Any, engine: Any, root: str | Path) -> None:
        self.model, self.engine = model, engine
        self.root = Path(root).resolve()
        self.version = 0
        self.current: Path | None = None
        self.last: dict[str, float] = {}

    def __call__(self) -> float:
        """One sync; returns its seconds. `last` holds its parts (write_s, load_s)."""
        t0 = time.perf_counter()
        if self.version == 0 and self.root.is_dir():  # an earlier run's (a resumed run writes from adapter-1)
            for stale in self.root.glob("adapter-*"):
                if stale.is_dir():
                    shutil.rmtree(stale)
        self.version += 1
        d = self.root / f"adapter-{self.version}"
        d.mkdir(parents=True)
        with peft_rename_warning_off():
            self.model.save_pretrained(str(d), safe_serialization=True)
        t1 = time.perf_counter()
        self.engine.load_adapter(str(d))
        t2 = time.perf_counter()
        old, self.current = self.current, d
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        self.last = {"write_s": t1 - t0, "load_s": t2 - t1}
        return time.perf_counter() - t0
