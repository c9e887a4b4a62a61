"""One engine config: build_engine for every kind, hf's shared-weights mode, and the same keys from
`memrl train`, `memrl eval` and `memrl demo`; greedy MemAgent trajectories unchanged by the refactor."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

from memrl.config import ConfigError, load_config
from memrl.engines import EngineConfig, HFSection, build_engine
from memrl.engines.base import SamplingParams
from memrl.engines.hf import HFEngine
from memrl.engines.openai_http import OpenAIEngine
from memrl.models.tiny import cached_tiny_model
from memrl.recipes.pipeline import load_recipe

GOLDEN = Path(__file__).parents[1] / "data" / "memagent_greedy_hf.json"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models"))


def test_every_engine_field_has_the_same_key_in_train_eval_and_demo():
    from memrl.eval.runner import EvalConfig
    from memrl.recipes.memagent import RECIPE
    from memrl.training.config import TrainConfig

    ov = ["engine=openai", "engine.max_batch_size=7", "engine.openai.timeout_s=12.5", "engine.hf.device=cpu",
          "engine.vllm.gpu_memory_utilization=0.3", "engine.openai.base_url=http://h:1", "engine.seed=3",
          "engine.hf.deterministic=true"]
    train = load_config(TrainConfig, ov).engine
    ev = load_config(EvalConfig, ov).engine
    assert train == ev
    assert (train.name, train.max_batch_size, train.openai.timeout_s, train.vllm.gpu_memory_utilization,
            train.openai.base_url, train.seed) == ("openai", 7, 12.5, 0.3, "http://h:1", 3)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        tcfg = load_recipe(RECIPE, ov, d).tcfg
    assert tcfg.engine == train


def test_workflow_settings_have_one_spelling_in_train_eval_and_demo(tmp_path):
    from memrl.eval.runner import EvalConfig
    from memrl.eval.runner import workflow_config as eval_workflow
    from memrl.recipes.memagent import RECIPE
    from memrl.training.assemble import workflow_config as train_workflow
    from memrl.training.config import TrainConfig

    ov = ["workflow=rememr1", "workflow.chunk_tokens=12", "workflow.max_memory_tokens=5"]
    _, tr = train_workflow(load_config(TrainConfig, ["model.path=x", *ov]))
    _, ev = eval_workflow(load_config(EvalConfig, ov))
    run = load_recipe(RECIPE, ov[1:], tmp_path)  # the demo preset's workflow is memagent
    spec, demo = run.spec, run.wf_cfg
    assert spec.name == "memagent" and type(tr).__name__ == "ReMemR1Config"
    assert (tr.chunk_tokens, tr.max_memory_tokens, tr.temperature) == (12, 5, 1.0)
    assert (ev.chunk_tokens, ev.max_memory_tokens, ev.temperature) == (12, 5, 0.0)  # eval decodes greedily
    assert (demo.chunk_tokens, demo.max_memory_tokens) == (12, 5)


def test_removed_and_unknown_engine_names_fail_by_key():
    from memrl.training.config import TrainConfig

    with pytest.raises(ConfigError, match="'local' was removed: use hf"):
        load_config(TrainConfig, ["engine.name=local"])
    with pytest.raises(ConfigError, match="engine.name 'nope' is not one of hf, vllm, vllm-cpu, openai"):
        load_config(TrainConfig, ["engine=nope"])
    with pytest.raises(ValueError, match="engine.model is empty"):
        build_engine(EngineConfig(name="hf"))


def test_shared_hf_engine_serves_the_live_module_and_sync_is_free(model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    eng = build_engine(EngineConfig(max_batch_size=4), policy=model, tokenizer=tok)
    assert isinstance(eng, HFEngine) and eng.model is model and eng.share_weights
    greedy = SamplingParams(temperature=0, max_tokens=5)
    prompt = tok.encode("Who founded the town?", add_special_tokens=False)
    before = asyncio.run(eng.generate(prompt, greedy))
    eng.update_weights(model.state_dict())
    assert eng.stats.weight_updates == 0  # the same storage: nothing copied
    with torch.no_grad():  # a change to the live module is what the engine serves next: logits x 2
        model.model.norm.weight.mul_(2.0)
    after = asyncio.run(eng.generate(prompt, greedy))
    assert after.token_ids[0] == before.token_ids[0]  # argmax is unchanged by scaling the logits ...
    assert after.logprobs[0] > before.logprobs[0] + 1e-3  # ... the argmax's probability grows
    copy = build_engine(EngineConfig(max_batch_size=4, hf=HFSection(share_weights=False)), policy=model, tokenizer=tok)
    assert copy.model is not model
    copy.update_weights(model.state_dict())
    assert copy.stats.weight_updates == 1
    asyncio.run(eng.close())
    asyncio.run(copy.close())


def test_openai_kind_gets_every_setting(model_dir):
    cfg = load_config(EngineConfig, ["name=openai", f"model={model_dir}", "max_batch_size=5",
                                     "openai.base_url=http://127.0.0.1:9/v1", "openai.timeout_s=3",
                                     "openai.served_model=m", "openai.max_retries=0"])
    eng = build_engine(cfg)
    assert isinstance(eng, OpenAIEngine)
    c = eng.config
    assert (c.tokenizer, c.max_concurrency, c.base_url, c.timeout_s, c.model, c.max_retries) == (
        model_dir, 5, "http://127.0.0.1:9/v1", 3.0, "m", 0)
    assert eng.tokenizer is not None


def test_greedy_memagent_trajectories_unchanged(model_dir):
    """Recorded with HFEngine before the engine layer was unified (tests/data/memagent_greedy_hf.json)."""
    from memrl.runtime import rollout_once
    from memrl.types import Task
    from memrl.workflows import get_workflow

    golden = json.loads(GOLDEN.read_text())
    tasks = [Task(t["task_id"], t["question"], t["context"], ["Kalomi"]) for t in golden["tasks"]]
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=64, max_memory_tokens=12, max_final_tokens=8, temperature=0.0)
    for share in (False, True):
        if share:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            eng = build_engine(EngineConfig(max_batch_size=16), AutoModelForCausalLM.from_pretrained(model_dir),
                               AutoTokenizer.from_pretrained(model_dir))
        else:
            eng = build_engine(EngineConfig(model=model_dir, max_batch_size=16))
        groups = rollout_once(tasks, spec, eng, cfg, n=1, concurrency=6, seed=0)
        asyncio.run(eng.close())
        got = {g.task_id: [s.response_ids for s in g.trajectories[0].segments] for g in groups}
        assert got == golden["responses"], f"share_weights={share}"


def test_deterministic_hf_engine_repeats_sampled_rollouts_bitwise(model_dir):
    """Waves, not time windows, decide the batches: two runs give identical tokens and logprobs."""
    from memrl.runtime import rollout_once
    from memrl.types import Task
    from memrl.workflows import get_workflow

    golden = json.loads(GOLDEN.read_text())
    tasks = [Task(t["task_id"], t["question"], t["context"], ["Kalomi"]) for t in golden["tasks"]]
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=64, max_memory_tokens=12, max_final_tokens=8, temperature=1.0)
    runs = []
    for _ in range(2):
        eng = build_engine(EngineConfig(model=model_dir, max_batch_size=5))
        assert eng.deterministic
        groups = rollout_once(tasks, spec, eng, cfg, n=3, concurrency=64, seed=7)
        asyncio.run(eng.close())
        runs.append([(s.response_ids, s.response_logprobs) for g in groups for s in g.segments()])
    assert runs[0] == runs[1] and len(runs[0]) == 3 * sum(len(r) for r in golden["responses"].values())


def test_engine_sections_mirror_the_engines_own_configs():
    """Every vLLM / OpenAI engine setting is reachable from engine.*, with the engine's own default."""
    import dataclasses

    from memrl.engines.config import OpenAISection, VLLMSection
    from memrl.engines.openai_http import OpenAIConfig
    from memrl.engines.vllm import VLLMConfig

    def defaults(cls, rename=None):
        out = {}
        for f in dataclasses.fields(cls):
            d = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[(rename or {}).get(f.name, f.name)] = d
        return out

    # engine.model / dtype / seed / max_batch_size; max_lora_rank comes from model.lora.rank (lora_sync=adapter)
    # (VLLMConfig is a VLLMSection: it inherits lora_sync, which only the trainer reads)
    common = {"model", "dtype", "seed", "max_num_seqs", "max_lora_rank", "lora_sync"}
    vllm = {k: v for k, v in defaults(VLLMConfig).items() if k not in common}
    section = defaults(VLLMSection)
    assert section.pop("lora_sync") == "merged" and section == vllm  # lora_sync: the trainer's
    openai = {k: v for k, v in defaults(OpenAIConfig, {"model": "served_model"}).items()
              if k not in ("tokenizer", "max_concurrency")}  # engine.model / engine.max_batch_size
    section = defaults(OpenAISection)
    assert section.pop("sync_dir") == "" and section.pop("lora_sync") == "merged" and section == openai
