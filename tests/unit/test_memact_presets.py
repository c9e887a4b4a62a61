"""The MemAct DCPO presets load, validate and hold the published recipe (REFERENCE.md section 4)."""

from __future__ import annotations

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.config import TrainConfig
from memrl.training.trainer import rollout_n, validate, workflow_config


def test_published_memact_dcpo_recipe():
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl"], preset="memact_dcpo")
    a = cfg.algorithm
    assert (a.name, a.actual_n, a.n, a.temperature) == ("dcpo", 8, 12, 0.7)
    assert rollout_n(cfg) == 8
    _, wf = workflow_config(cfg)
    assert (wf.max_assistant_turns, wf.temperature, wf.top_p, wf.no_prune_prob) == (40, 0.7, 0.95, 0.5)
    assert (wf.max_context_tokens, wf.max_turn_tokens, wf.max_tool_response_chars) == (4096 + 20480, 20480, 8192)
    assert (cfg.engine.name, cfg.model.device, cfg.data.name) == ("vllm", "cuda", "file")


def test_cpu_memact_dcpo_preset_validates():
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl"], preset="memact_dcpo_cpu")
    spec, wf = validate(cfg)
    assert spec.name == "memact" and (cfg.algorithm.name, cfg.algorithm.actual_n, cfg.algorithm.n) == ("dcpo", 8, 12)
    assert wf.temperature == cfg.algorithm.temperature == 1.0 and wf.no_prune_prob == 0.0
    assert wf.retriever_scope == "task" and wf.retriever_corpus is None  # every task searches its own facts
    assert wf.answer_instruction and (cfg.engine.name, cfg.model.device) == ("hf", "cpu")


def test_preset_bad_override_names_the_field():
    with pytest.raises(ConfigError, match="algorithm.actual_n"):
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t", "algorithm.actual_n=1"],
                             preset="memact_dcpo_cpu"))
    with pytest.raises(ConfigError, match="algorithm.n"):
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t", "algorithm.n=0"], preset="memact_dcpo"))
