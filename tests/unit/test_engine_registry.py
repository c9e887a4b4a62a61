"""Engines registered like workflows: the built-in kinds and what they declare, a kind from an import path
built by the one factory, and no engine name compared outside memrl/engines (memrl.engines.registry)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import memrl
from memrl.config import ConfigError, load_config
from memrl.engines import EngineConfig, build_engine, engine_kind, engine_names
from memrl.engines.base import PLAIN, Capabilities, capabilities
from memrl.engines.registry import replica_names
from memrl.training.config import TrainConfig

ENGINE_NAMES = {"hf", "vllm", "vllm-cpu", "openai"}
ALLOWED = {
    # `memrl data convert --to hf`: the HuggingFace record layout of a data file, not an engine
    ("commands/data.py", "args.to in ('hf', 'original')"),
    ("commands/data.py", "args.to == 'hf'"),
}


def _names_in(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & ENGINE_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(e) for e in node.elts))
    return set()


def engine_name_compares(source: str) -> list[str]:
    """The comparisons (==, !=, in, not in, ...) in `source` with an engine name among their operands."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and set().union(*(_names_in(n) for n in [node.left, *node.comparators])):
            found.append(ast.unparse(node))
    return found


def test_the_scan_finds_name_switches():
    src = 'if cfg.engine.name == "hf":\n    pass\nok = kind in ("vllm", "vllm-cpu")\nfine = x == "hfx"\n'
    assert engine_name_compares(src) == ["cfg.engine.name == 'hf'", "kind in ('vllm', 'vllm-cpu')"]


def test_no_engine_name_is_compared_outside_engines():
    root = Path(memrl.__file__).parent
    found = set()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith("engines/"):
            continue
        found |= {(rel, c) for c in engine_name_compares(path.read_text(encoding="utf-8"))}
    assert found - ALLOWED == set(), "ask the engine's EngineKind (memrl.engines.registry), not its name"
    assert ALLOWED <= found  # the allowed ones still exist (else drop them here)


def test_builtin_kinds_declare_what_they_can_do():
    assert engine_names() == ("hf", "vllm", "vllm-cpu", "openai")
    assert replica_names() == ("hf", "vllm", "vllm-cpu")
    hf, vllm, cpu, openai = (engine_kind(n) for n in engine_names())
    assert (hf.serves_policy, vllm.serves_policy, openai.serves_policy) == (True, False, False)
    assert (hf.reads_weights, vllm.reads_weights, openai.reads_weights) == (True, True, False)
    assert (hf.replica, vllm.replica, cpu.replica, openai.replica) == ("hf", "vllm", "vllm", None)
    assert (hf.replica_sleeps, vllm.replica_sleeps, hf.replica_transfer, vllm.replica_transfer) == (
        False, True, False, True)
    cfg = EngineConfig(name="openai", model="m")
    cfg.openai.sync_dir = "/srv/w"
    assert (openai.weights_by_directory, openai.sync_dir(cfg), hf.sync_dir(cfg)) == (True, "/srv/w", "")
    assert (hf.lora_sync(cfg), vllm.lora_sync(cfg), openai.lora_sync(cfg)) == (
        None, ("engine.vllm.lora_sync", "merged"), ("engine.openai.lora_sync", "merged"))
    assert hf.describe_config(EngineConfig()) == "hf (in process, engine.hf.share_weights=true)"
    assert vllm.describe_config(EngineConfig(name="vllm")) == "vllm (in process)"
    assert openai.describe_config(cfg) == "openai (http://127.0.0.1:8000)"
    with pytest.raises(ValueError, match="unknown engine kind 'nope'; known: hf, vllm, vllm-cpu, openai"):
        engine_kind("nope")


def test_declared_refusals_reach_the_train_config():
    def check(*overrides: str) -> str:
        with pytest.raises(ConfigError) as e:
            load_config(TrainConfig, ["model.path=x", *overrides]).check()
        return str(e.value)

    assert check("engine=openai", "engine.openai.api=chat").startswith("engine.openai.api=chat cannot train: ")
    assert check("engine=vllm-cpu", "rollout.max_staleness=1") == (
        "rollout.max_staleness=1 with the in-process vllm-cpu engine: put vLLM in Ray replicas (rollout.num_engines "
        ">= 1, rollout.engine=vllm), where it samples while the trainer updates")
    assert check("rollout.max_staleness=2").startswith("rollout.max_staleness=2 needs engine.hf.share_weights=false")
    assert check("engine=openai", "engine.openai.lora_sync=adapter", "model.lora.rank=4",
                 "engine.openai.server=sglang") == (
        "engine.openai.lora_sync=adapter needs engine.openai.server=vllm (its /v1/load_lora_adapter), got 'sglang'")
    assert check("engine=vllm", "engine.vllm.lora_sync=adapter", "model.lora.rank=1024") == (
        "engine.vllm.lora_sync=adapter: model.lora.rank=1024 is above vLLM's largest max_lora_rank 512")
    with pytest.raises(ConfigError, match="rollout.engine='openai' is not allowed"):
        load_config(TrainConfig, ["rollout.engine=openai"])


def test_the_engine_owns_its_compute_dtype_replica_and_routing_rules():
    """HFSection.serving_policy is the one compute-dtype rule of an hf engine serving a policy (in process and
    as a Ray replica); EngineConfig.for_replica sets the replica's sections; the hf kind says why it cannot
    record routing (r3)."""
    hf = EngineConfig().hf
    assert [hf.serving_policy(d) for d in (None, "float32", "bfloat16")] == [None, None, "bfloat16"]
    hf.compute_dtype = "float32"
    assert hf.serving_policy("bfloat16") == "float32"  # engine.hf.compute_dtype, when set, wins
    in_process = engine_kind("hf").for_policy(EngineConfig(), "bfloat16")
    assert (in_process.hf.compute_dtype, in_process.hf.share_weights) == ("bfloat16", False)  # a bfloat16 copy
    assert engine_kind("hf").for_policy(EngineConfig(), "float32").hf == EngineConfig().hf
    r = EngineConfig().for_replica("hf", "/ckpt", "float32", 0, "bfloat16", 0.3, False)
    assert (r.name, r.model, r.dtype, r.hf.device, r.hf.share_weights, r.hf.compute_dtype) == (
        "hf", "/ckpt", "float32", "cpu", False, "bfloat16")
    assert (r.vllm.gpu_memory_utilization, r.vllm.enable_sleep_mode) == (0.3, False)
    v = EngineConfig(name="vllm").for_replica("vllm", "/m", None, 0.5, None, 0.5, True)
    assert (v.hf.device, v.hf.compute_dtype, v.vllm.enable_sleep_mode) == ("cuda", None, True)
    slots = EngineConfig()
    slots.hf.kv_cache = "slots"
    assert engine_kind("hf").routing_problem(slots) == (
        "engine.hf.kv_cache=slots (r3 records the padded cache's forwards; set engine.hf.kv_cache=padded)")
    slots.hf.kv_cache = "padded"
    assert engine_kind("hf").routing_problem(slots) is None and engine_kind("vllm").routing_problem is None


PLUGIN = '''
from memrl.engines.registry import EngineKind


def build(cfg, policy, tokenizer, lora_rank):
    return ("toy engine", cfg.model, cfg.max_batch_size, lora_rank)


TOY = EngineKind("toy", build, describe=lambda cfg: "toy (" + cfg.model + ")")
NOT_A_KIND = {"name": "toy"}
'''


def test_a_kind_by_import_path_is_built_by_the_one_factory(tmp_path, monkeypatch):
    (tmp_path / "memrl_toy_engine.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = EngineConfig(name="memrl_toy_engine:TOY", model="dir", max_batch_size=3)
        assert build_engine(cfg, lora_rank=2) == ("toy engine", "dir", 3, 2)
        assert engine_kind(cfg.name).describe_config(cfg) == "toy (dir)"
        with pytest.raises(ConfigError, match="engine.name='memrl_toy_engine:NOT_A_KIND' is not an EngineKind"):
            EngineConfig(name="memrl_toy_engine:NOT_A_KIND")
    finally:
        sys.modules.pop("memrl_toy_engine", None)


def test_capabilities_are_declared_not_probed():
    from memrl.engines.hf import HFEngine
    from memrl.engines.openai_http import OpenAIEngine
    from memrl.engines.vllm import VLLMEngine
    from memrl.training.step.step_metrics import EngineBusy

    assert HFEngine.capabilities == Capabilities(weight_transfer=True, busy_accounting=True)
    assert VLLMEngine.capabilities == Capabilities(sleep=True, weight_transfer=True, adapters=True)
    assert OpenAIEngine.capabilities == Capabilities(adapters=True)

    class Undeclared:
        def busy_seconds(self) -> tuple[float, int]:
            return 2.5, 1

    class Declared(Undeclared):
        capabilities = Capabilities(busy_accounting=True)

    assert capabilities(Undeclared()) == PLAIN and capabilities(Declared()).busy_accounting
    assert EngineBusy(Undeclared()).busy_of is None  # a method alone is not a declaration
    assert EngineBusy(Declared()).busy_of() == (2.5, 1)
