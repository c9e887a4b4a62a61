"""Engine kinds by name, registered like workflows: `engine.name` is a registered kind (`hf`, `vllm`,
`vllm-cpu`, `openai`, or one given to `register_engine`) or an import path `package.module:ATTR` naming an
EngineKind, so an engine living outside memrl needs no edit here.

An EngineKind builds its engine from the `engine` section (the fields every kind reads plus its own
sub-section) and declares what the trainer, the evaluator and the placement ask about it: whether it can
serve the trained module in process, whether it loads weights from `engine.model`, how an in-process
weight sync reaches it, whether it runs as a Ray replica, its LoRA adapter sync, and what it refuses.
Code outside memrl.engines asks these, never the kind's name. The built-ins are registered by import
path (memrl.engines.kinds), so this module imports none of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memrl.plugins import is_import_path, load_object


@dataclass(frozen=True)
class EngineKind:
    """An engine kind: how to build it and what it can do (every field but `name` and `build` optional).

    `build(cfg, policy, tokenizer, lora_rank)` returns the engine the EngineConfig `cfg` describes; `policy`
    is the trainer's loaded module (None outside training), `lora_rank` > 0 asks for LoRA adapter support.
    The hooks take the EngineConfig and return None when the kind has nothing to say."""

    name: str
    build: Callable[..., Any]
    section: str | None = None
    """The sub-section of `engine` holding the kind's own settings (engine.<section>.*), if any."""
    serves_policy: bool = False
    """Can serve the trained module (the policy passed to build) in process; engine.model may then be empty."""
    reads_weights: bool = True
    """Loads weights from engine.model (False: engine.model is only a tokenizer directory, e.g. a server)."""
    weights_by_directory: bool = False
    """An in-process weight sync saves a HuggingFace directory (engine.<section>.sync_dir) that the engine
    reloads, instead of handing it a state dict."""
    replica: str | None = None
    """The kind a Ray replica of it runs as (rollout.engine; vllm-cpu runs as vllm); None = not a replica."""
    replica_transfer: bool = False
    """Under rollout.weight_sync=auto its Ray replicas take weights by broadcast (on GPUs of their own) or
    from a directory, not through Ray's object store."""
    replica_sleeps: bool = False
    """Ray replicas colocated with the trainer ranks on GPUs sleep (free their memory) between rollouts."""
    adapters: bool = False
    """Has engine.<section>.lora_sync: with LoRA it can be handed the adapter instead of merged weights."""
    shares_policy: Callable[[Any], bool] | None = None
    """cfg -> True when it serves the very module being trained (a weight sync is then a no-op)."""
    for_policy: Callable[[Any, str | None], Any] | None = None
    """(cfg, the policy's model.compute_dtype) -> the cfg the trainer builds it from."""
    async_problem: Callable[[Any, int], str | None] | None = None
    """(cfg, rollout.max_staleness) -> why it cannot sample in process while the trainer updates."""
    train_problem: Callable[[Any], str | None] | None = None
    """cfg -> why its settings cannot train (they may still evaluate)."""
    routing_problem: Callable[[Any], str | None] | None = None
    """cfg -> why an engine that serves the policy in process cannot record a mixture-of-experts model's
    routing as it samples (algorithm.routing_replay=r3); None = it can."""
    adapter_problem: Callable[[Any, str, int], str | None] | None = None
    """(cfg, the lora_sync field, model.lora.rank) -> why it cannot take adapters of that rank."""
    describe: Callable[[Any], str] | None = None
    """cfg -> how messages name it (default: "<name> (in process)")."""

    def sync_dir(self, cfg: Any) -> str:
        """engine.<section>.sync_dir of a kind synced by directory ("" = the caller's default)."""
        return str(getattr(getattr(cfg, self.section), "sync_dir", "")) if self.weights_by_directory else ""

    def lora_sync(self, cfg: Any) -> tuple[str, str] | None:
        """(the lora_sync field that applies, its value); None for a kind without adapters."""
        if not self.adapters or self.section is None:
            return None
        return f"engine.{self.section}.lora_sync", str(getattr(cfg, self.section).lora_sync)

    def describe_config(self, cfg: Any) -> str:
        return self.describe(cfg) if self.describe is not None else f"{self.name} (in process)"


EngineRef = EngineKind | str

_REGISTRY: dict[str, EngineRef] = {}


def register_engine(name: str, ref: EngineRef) -> None:
    """Make `engine.name=name` mean `ref`: an EngineKind or the import path "package.module:ATTR" of one
    (resolved when first named)."""
    _REGISTRY[name] = ref


# The built-ins, by the same mechanism a plugin uses (memrl.engines.kinds defines them).
register_engine("hf", "memrl.engines.kinds:HF")
register_engine("vllm", "memrl.engines.kinds:VLLM")
register_engine("vllm-cpu", "memrl.engines.kinds:VLLM_CPU")
register_engine("openai", "memrl.engines.kinds:OPENAI")
BUILTIN_ENGINES = ("hf", "vllm", "vllm-cpu", "openai")


def engine_names() -> tuple[str, ...]:
    """The registered kinds, built-ins first."""
    return tuple(_REGISTRY)


def _is_kind(obj: Any) -> bool:
    return isinstance(obj, EngineKind)


def engine_kind(name: str) -> EngineKind:
    """The EngineKind `name` means (registered, or an import path); ValueError naming the known kinds."""
    ref = _REGISTRY.get(name)
    if ref is None and is_import_path(name):
        ref = name
    if ref is None:
        raise ValueError(f"unknown engine kind {name!r}; known: {', '.join(_REGISTRY)} "
                         "(or an import path package.module:attr of an EngineKind)")
    if isinstance(ref, str):
        ref = load_object(ref, "engine.name", "an EngineKind", _is_kind,
                          "define one with memrl.engines.registry.EngineKind(name, build, ...)")
        if name in _REGISTRY:
            _REGISTRY[name] = ref
    return ref


def replica_names() -> tuple[str, ...]:
    """The kinds that can run as Ray replicas (rollout.engine's values besides "")."""
    return tuple(n for n in _REGISTRY if engine_kind(n).replica is not None)
