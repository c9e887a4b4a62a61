"""One default per setting (issue 41): a setting that can be given a default in two places has the same
default in both, or is declared here as a genuinely different setting that shares a name.

Two checks:

- sections: every config dataclass a command reads (`memrl train`'s TrainConfig, `memrl eval`'s
  EvalConfig, `memrl train-sft`'s SFTRunConfig, walked through their nested sections) and every config
  dataclass of a component those sections configure (the engines' own configs, the judge, the workflows'
  configs, the algorithms' options): a field name with two different defaults fails, unless the name is
  in SHARED_NAMES with a one-line reason.
- constructors: each constructor or factory a config section reaches (the hf / vllm / openai engines,
  `model_engine` of the demos, the judge client, the registered estimators and losses): a keyword
  default must equal the default of the section field it stands for.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from typing import Any

from memrl.algorithms.base import ADVANTAGES, LOSSES, OPTIONS
from memrl.algorithms.registry import advantage_names, loss_names
from memrl.commands.train_sft import SFTRunConfig
from memrl.engines.config import EngineConfig, HFSection, OpenAISection, VLLMSection
from memrl.engines.openai_http import OpenAIConfig
from memrl.engines.vllm import VLLMConfig
from memrl.eval.runner import EVAL_ENGINE_DEFAULTS, EvalConfig
from memrl.rewards import judge
from memrl.training.config import TrainConfig
from memrl.workflows import BUILTIN_WORKFLOWS, get_workflow

MISSING = object()

SHARED_NAMES: dict[str, str] = {
    # name -> why the sections that hold it may set different defaults
    "name": "each section's own selector (engine kind, data source, estimator, run name)",
    "dtype": "the trained weights' dtype (model.dtype) vs the engine's (None = per kind: policy's / auto)",
    "device": "the trainer's device vs the hf engine's ('' = the policy's)",
    "temperature": "rollout temperature, validation / judge / full-context greedy 0, each its own setting",
    "top_p": "the judge's None = not sent; the samplers' 1.0 = off",
    "timeout_s": "a judge call (30 s) vs a generation request to an engine server (600 s)",
    "api_key_env": "the judge's key variable (none by default) vs the engine server's (OPENAI_API_KEY)",
    "max_concurrency": "judge calls in flight vs engine requests in flight",
    "concurrency": "trajectories in flight in training (1024) vs questions in flight in `memrl eval` (16)",
    "gpu_memory_utilization": "rollout replicas colocated with the trainer (0.4) vs a vLLM engine alone (0.9)",
    "lr": "RL's learning rate vs supervised fine-tuning's",
    "coef": "InfoMem's reward weight (0.5, published) vs the LLDS term's weight (0 = off)",
    "warmup_steps": "RL's warm-up vs supervised fine-tuning's",
    "weight_decay": "RL's AdamW vs supervised fine-tuning's",
    "token_budget": "RL's micro-batch tokens vs supervised fine-tuning's",
    "out_dir": "each command's own output directory",
    "alpha": "ReMemR1's outcome weight vs LoRA's scaling alpha",
    "model": "a model directory vs the judge's / server's served model name",
    "max_final_tokens": "each workflow's own final-answer budget (ReMemR1's published 2048)",
    "max_memory_tokens": "each workflow's own memory budget (ReMemR1's published 2048)",
    "empty_memory": "each workflow's own first-memory rule (ReMemR1's keep_previous)",
    "max_context_tokens": "the full-context baseline's window vs MemAct's working context vs MEM1's cut (0 = none)",
    "truncation": "a chunked workflow's document cut vs an SFT conversation's",
    "max_turn_tokens": "each multi-turn agent's own turn budget (MemAct 2048; MEM1's published 1000)",
    "max_tokens": "a judge verdict's budget: memrl's rubric judges 8 vs LongMemEval's published 10 (memrl eval.judge)",
}

COMMAND_DIFFERENCES: dict[str, str] = {
    f"memrl eval.engine.{k}": "memrl.eval.runner.EVAL_ENGINE_DEFAULTS, the eval command's declared engine defaults"
    for k in EVAL_ENGINE_DEFAULTS}
"""Places where a command's config sets its own default for a shared section, declared in that command's
config module (one visible place)."""

CONSTRUCTOR_PARAMS: dict[tuple[str, str], str] = {
    ("HFEngine", "share_weights"): "whether the given module is served as is (a path cannot be); the section's is "
                                   "the training choice build_engine makes between the module and a copy",
    ("VLLMConfig", "dtype"): "engine.dtype None means auto for vLLM; build_engine passes it resolved",
}
"""(constructor, keyword) pairs that are a different setting from the section field of the same name."""

# ----------------------------------------------------------------------------------------------- walk


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return MISSING


def _fields(obj_or_cls: Any, where: str) -> list[tuple[str, str, Any]]:
    """[(dotted place, field name, default)] of a config dataclass and the sections nested in it (their
    default instances, so a command's own section defaults count)."""
    obj = obj_or_cls
    if isinstance(obj_or_cls, type):
        try:
            obj = obj_or_cls()
        except (TypeError, ValueError):  # a required field (VLLMConfig.model): the declared defaults
            pass
    out = []
    for f in dataclasses.fields(obj):
        value = _default(f) if isinstance(obj, type) else getattr(obj, f.name)
        place = f"{where}.{f.name}"
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            out += _fields(value, place)
        elif value is not MISSING:
            out.append((place, f.name, value))
    return out


def _component_configs() -> list[tuple[str, type]]:
    """The config dataclasses of the components the command sections configure."""
    advantage_names(), loss_names()  # the built-in estimators and losses register
    comps: list[tuple[str, type]] = [("VLLMConfig", VLLMConfig), ("OpenAIConfig", OpenAIConfig)]
    comps.append(("JudgeSettings", judge.JudgeSettings))
    comps += [(f"{opts.__name__} ({kind} {name})", opts) for (kind, name), opts in sorted(OPTIONS.items())
              if opts is not None and opts.__module__.startswith("memrl.")]
    comps += [(f"{get_workflow(w).config_cls.__name__} (workflow {w})", get_workflow(w).config_cls)
              for w in BUILTIN_WORKFLOWS]
    return comps


def section_places() -> dict[str, list[tuple[str, Any]]]:
    """{field name: [(place, default)]} over the command configs and the component configs."""
    places: dict[str, list[tuple[str, Any]]] = {}
    roots = [("memrl train", TrainConfig), ("memrl eval", EvalConfig), ("memrl train-sft", SFTRunConfig)]
    for where, cls in [*roots, *_component_configs()]:
        for place, name, value in _fields(cls, where):
            places.setdefault(name, []).append((place, value))
    return places


def section_conflicts(allowed: dict[str, str] = SHARED_NAMES) -> list[str]:
    out = []
    for name, where in sorted(section_places().items()):
        where = [(p, v) for p, v in where if p not in COMMAND_DIFFERENCES]
        if name not in allowed and len({repr(v) for _, v in where}) > 1:
            out.append(f"{name}: " + ", ".join(f"{p}={v!r}" for p, v in where))
    return out


# ---------------------------------------------------------------------------------- constructors


def _keyword_defaults(fn: Callable[..., Any]) -> dict[str, Any]:
    if dataclasses.is_dataclass(fn):
        return {name: value for p, name, value in _fields(fn, "") if "." not in p.lstrip(".")}
    target = fn.__init__ if isinstance(fn, type) and not dataclasses.is_dataclass(fn) else fn
    return {p.name: p.default for p in inspect.signature(target).parameters.values()
            if p.default is not inspect.Parameter.empty}


def _section_defaults(*sections: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in sections:
        out.update({name: value for _, name, value in _fields(s, "") if "." not in _.lstrip(".")})
    return out


def _hf_engine() -> Callable[..., Any]:
    from memrl.engines.hf import HFEngine

    return HFEngine


def constructor_places() -> list[tuple[str, dict[str, Any], dict[str, Any], dict[str, str]]]:
    """[(constructor, its keyword defaults, the section defaults it stands for, renames param -> field)]."""
    advantage_names(), loss_names()
    out = [
        ("HFEngine", _keyword_defaults(_hf_engine()), _section_defaults(EngineConfig, HFSection), {}),
        ("VLLMConfig", _keyword_defaults(VLLMConfig), _section_defaults(EngineConfig, VLLMSection),
         {"max_num_seqs": "max_batch_size"}),
        ("OpenAIConfig", _keyword_defaults(OpenAIConfig), _section_defaults(EngineConfig, OpenAISection),
         {"max_concurrency": "max_batch_size", "model": "served_model"}),
    ]
    out.append(("JudgeClient", _keyword_defaults(judge.JudgeClient), _section_defaults(judge.JudgeSettings), {}))
    from memrl.tools.search import build_retriever
    from memrl.workflows.memact import MemActConfig

    out.append(("build_retriever", _keyword_defaults(build_retriever), _section_defaults(MemActConfig),
                {"kind": "retriever_kind", "corpus": "retriever_corpus", "url": "retriever_url"}))
    for kind, table in (("advantage estimator", ADVANTAGES), ("policy loss", LOSSES)):
        for name, fn in sorted(table.items()):
            opts = OPTIONS[(kind, name)]
            if opts is not None and fn.__module__.startswith("memrl."):
                out.append((f"{fn.__qualname__} ({kind} {name})", _keyword_defaults(fn), _section_defaults(opts), {}))
    return out


def constructor_conflicts() -> list[str]:
    out = []
    for what, kw, section, rename in constructor_places():
        for param, value in sorted(kw.items()):
            if (what, param) in CONSTRUCTOR_PARAMS:
                continue
            field_name = rename.get(param, param)
            if field_name in section and repr(section[field_name]) != repr(value):
                out.append(f"{what}: {param}={value!r}, but the section's {field_name}={section[field_name]!r}")
    return out


# ---------------------------------------------------------------------------------------------- tests


def test_no_two_sections_set_one_setting_to_different_defaults():
    assert section_conflicts() == []


def test_no_constructor_repeats_a_section_default_with_another_value():
    assert constructor_conflicts() == []


def test_each_allowed_shared_name_is_really_shared_and_differs():
    """The allow-list holds only names that two walked sections set to different defaults (no stale entry)."""
    places = section_places()
    stale = [n for n in SHARED_NAMES if len({repr(v) for _, v in places.get(n, [])}) < 2]
    assert stale == []


def test_the_walk_reaches_every_component():
    places = section_places()
    seen = {p.split(".")[0].split(" (")[0] for where in places.values() for p, _ in where}
    assert {"memrl train", "memrl eval", "memrl train-sft", "VLLMConfig", "OpenAIConfig", "JudgeSettings",
            "GRPOOptions", "ReMemR1Options", "PPOOptions", "MemActConfig"} <= seen
    whats = [w for w, *_ in constructor_places()]
    assert {"HFEngine", "VLLMConfig", "OpenAIConfig", "JudgeClient", "build_retriever"} <= set(whats)
    assert any("grpo_estimator" in w for w in whats) and any("ppo" in w for w in whats)


def test_model_engine_takes_the_callers_engine_section():
    """The demos' evaluation engine is the engine section they pass (no batch size of model_engine's own)."""
    from memrl.eval.evaluator import model_engine

    assert inspect.signature(model_engine.__wrapped__).parameters["engine_cfg"].default is inspect.Parameter.empty


def test_the_eval_command_declares_its_engine_differences():
    e, t = EvalConfig().engine, TrainConfig().engine
    assert (e.max_batch_size, e.hf.deterministic) == (16, False) and (t.max_batch_size, t.hf.deterministic) == (64, True)
    assert dataclasses.replace(e, max_batch_size=t.max_batch_size, hf=t.hf) == t


def test_the_judge_has_one_config():
    """workflow.judge (JudgeSettings) is what the client takes: no second dataclass repeating its fields."""
    assert not hasattr(judge, "JudgeConfig")
    params = inspect.signature(judge.JudgeClient.__init__).parameters
    assert list(params) == ["self", "config"] and params["config"].annotation in ("JudgeSettings", judge.JudgeSettings)


def test_a_disagreement_is_reported():
    @dataclasses.dataclass
    class A:
        max_batch_size: int = 64

    @dataclasses.dataclass
    class B:
        max_batch_size: int = 16

    rows: dict[str, list[tuple[str, Any]]] = {}
    for where, cls in (("a", A), ("b", B)):
        for place, name, value in _fields(cls, where):
            rows.setdefault(name, []).append((place, value))
    assert len({repr(v) for _, v in rows["max_batch_size"]}) == 2


def test_build_engine_gives_vllm_the_engine_sections_values(monkeypatch):
    """The vLLM config build_engine makes is the engine section's (no vllm needed: the engine is faked)."""
    import memrl.engines.kinds as engines
    from memrl.engines import build_engine

    seen = []
    monkeypatch.setattr(engines, "VLLMEngine", lambda config: seen.append(config) or config)
    build_engine(EngineConfig(name="vllm", model="/nonexistent/model"))
    build_engine(EngineConfig(name="vllm", model="/nonexistent/model", max_batch_size=8, seed=3,
                              vllm=VLLMSection(gpu_memory_utilization=0.5)), lora_rank=16)
    assert seen[0] == VLLMConfig(model="/nonexistent/model")
    assert (seen[0].max_num_seqs, seen[0].seed, seen[0].dtype, seen[0].max_lora_rank) == (64, 0, "auto", 0)
    assert (seen[1].max_num_seqs, seen[1].seed, seen[1].gpu_memory_utilization, seen[1].max_lora_rank) == (8, 3, 0.5, 16)
