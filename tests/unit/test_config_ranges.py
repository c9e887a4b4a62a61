"""Every config field declares the values it admits; one walker checks them before any work.

The config dataclasses are discovered, not listed: every dataclass in the memrl package whose name ends in
Config or Section or that declares a field's values (estimator and loss options, demo sections, sampling
parameters), and the dataclasses their fields hold. Every numeric field (int, float, their optional and list
forms) must declare a range bounded on both sides or a set of choices (`memrl.config.valid`; a huge value
means nothing anywhere, issue 63), and a value just outside it must fail with one line naming the dotted
field and the value.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import pkgutil
import typing

import pytest

import memrl
from memrl.cli import main
from memrl.config import Allowed, ConfigError, allowed_of, check_config, load_config
from memrl.training.config import TrainConfig

# Classes whose modules this branch does not own (other work edits them in parallel); their fields get
# their declarations when the branches merge, and this set is emptied then.
PENDING_MODULES: tuple[str, ...] = ()


def _all_modules() -> list[str]:
    names = ["memrl"]
    for m in pkgutil.walk_packages(memrl.__path__, "memrl."):
        names.append(m.name)
    return names


def _hints(cls: type) -> dict[str, typing.Any]:
    return typing.get_type_hints(cls)


def _nested(cls: type) -> list[type]:
    """The dataclass types `cls`'s fields hold by default."""
    out = []
    for f in dataclasses.fields(cls):
        if f.default_factory is not dataclasses.MISSING:
            v = f.default_factory()
            if dataclasses.is_dataclass(v):
                out.append(type(v))
        elif dataclasses.is_dataclass(f.default):
            out.append(type(f.default))
    return out


def config_classes() -> list[type]:
    found: dict[str, type] = {}
    for name in _all_modules():
        try:
            mod = importlib.import_module(name)
        except ImportError:  # an optional dependency (vllm, ray, ...) is absent: its module defines no config
            continue
        for obj in vars(mod).values():
            if (isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__.startswith("memrl")
                    and (obj.__name__.endswith(("Config", "Section"))
                         or any(allowed_of(f) is not None for f in dataclasses.fields(obj)))):
                found[f"{obj.__module__}.{obj.__qualname__}"] = obj
    todo = list(found.values())
    while todo:
        for sub in _nested(todo.pop()):
            key = f"{sub.__module__}.{sub.__qualname__}"
            if key not in found:
                found[key] = sub
                todo.append(sub)
    return [found[k] for k in sorted(found)]


def _numeric(hint: typing.Any) -> type | None:
    """int or float when the field holds numbers (directly, optionally, or in a list); else None."""
    if hint is bool:
        return None
    if hint in (int, float):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (list, tuple) and args:
        return _numeric(args[0])
    if len(args) == 1:
        return _numeric(args[0])
    return None


def numeric_fields(cls: type) -> list[tuple[dataclasses.Field, type]]:
    hints = _hints(cls)
    return [(f, t) for f in dataclasses.fields(cls) if (t := _numeric(hints[f.name])) is not None]


def _instance(cls: type):
    """An instance holding the defaults, built without __init__ / __post_init__ (which may demand values,
    e.g. a model directory): the walker alone is under test."""
    obj = object.__new__(cls)
    for f in dataclasses.fields(cls):
        v = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        object.__setattr__(obj, f.name, v)
    return obj


def bad_values(rule: Allowed, kind: type, owner) -> list:
    """Values just outside a declaration: below a lower bound, above an upper one, beside the choices."""
    out = []
    b = rule.bounds(owner)
    if "ge" in b:
        out.append(b["ge"] - 1)
    if "gt" in b:
        out.append(b["gt"])
    if "le" in b:
        out.append(b["le"] + 1)
    if "lt" in b:
        out.append(b["lt"])
    known = rule.known()
    if known is not None and not b:
        out.append(max(known) + 1)
    return [kind(v) for v in out]


CLASSES = config_classes()
OWNED = [c for c in CLASSES if not c.__module__.startswith(PENDING_MODULES)]


def test_discovery_finds_every_command_config():
    names = {c.__name__ for c in CLASSES}
    # the sections of train / eval / demo / train-sft and the engine's, reached without being listed
    for want in ("TrainConfig", "TrainerSection", "OptimSection", "AlgorithmSection", "EvalConfig", "EngineConfig",
                 "HFSection", "VLLMSection", "OpenAISection", "DemoConfig", "DemoSFT", "DemoEval", "SFTRunConfig",
                 "SFTConfig", "DemonstratorSection", "MemActDemoConfig", "MemActDemoSFT", "SyntheticConfig",
                 "GRPOOptions", "PPOOptions", "GSPOOptions", "FoldGRPOOptions", "InfoMemOptions", "ContextDemoSFT",
                 "Mem1DemoEval", "InfMemDemoModel", "SamplingParams"):
        assert want in names, want
    assert len(OWNED) >= 20


@pytest.mark.parametrize("cls", OWNED, ids=lambda c: c.__name__)
def test_every_numeric_field_declares_a_range_bounded_on_both_sides(cls):
    def bounded(rule: Allowed | None) -> bool:
        b = rule.bounds(_instance(cls)) if rule is not None else {}
        return rule is not None and (rule.known() is not None or ({"ge", "gt"} & set(b) and {"le", "lt"} & set(b)))

    missing = [f.name for f, _ in numeric_fields(cls) if not bounded(allowed_of(f))]
    assert not missing, f"{cls.__name__}: numeric fields without a range bounded on both sides: {missing}"


@pytest.mark.parametrize("cls", OWNED, ids=lambda c: c.__name__)
def test_every_numeric_field_rejects_values_outside_its_range(cls):
    checked = 0
    for f, kind in numeric_fields(cls):
        rule = allowed_of(f)
        for bad in bad_values(rule, kind, _instance(cls)):
            obj = _instance(cls)
            is_list = isinstance(getattr(obj, f.name), list)
            object.__setattr__(obj, f.name, [bad] if is_list else bad)
            with pytest.raises(ConfigError) as e:
                check_config(obj, "sec")
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"sec.{f.name}=") and repr(bad) in msg, msg
            assert "must be" in msg
            checked += 1
        # the default itself is admitted
        check_config(_instance(cls), "sec")
    assert checked >= len(numeric_fields(cls))


ROOTS = {"TrainConfig": "memrl.training.config", "EvalConfig": "memrl.eval.runner",
         "DemoConfig": "memrl.recipes.memagent", "MemActDemoConfig": "memrl.recipes.memact",
         "ContextDemoConfig": "memrl.recipes.context", "Mem1DemoConfig": "memrl.recipes.mem1",
         "InfMemDemoConfig": "memrl.recipes.infmem",
         "SFTRunConfig": "memrl.commands.train_sft"}


def _paths(cls: type, prefix: str = ""):
    """(dotted path, field, kind, owner instance) of every numeric field under `cls`, owned classes only."""
    if cls.__module__.startswith(PENDING_MODULES):
        return
    inst = _instance(cls)
    for f in dataclasses.fields(cls):
        v = getattr(inst, f.name)
        path = prefix + f.name
        if dataclasses.is_dataclass(v):
            yield from _paths(type(v), path + ".")
    for f, kind in numeric_fields(cls):
        yield prefix + f.name, f, kind, inst


@pytest.mark.parametrize("root", list(ROOTS))
def test_commands_reject_every_out_of_range_override_by_its_dotted_name(root):
    """End to end through load_config, as `memrl train|eval|demo|train-sft` read their overrides."""
    cls = getattr(importlib.import_module(ROOTS[root]), root)
    seen = 0
    for path, f, kind, owner in _paths(cls):
        for bad in bad_values(allowed_of(f), kind, owner):
            value = f"[{bad}]" if isinstance(getattr(owner, f.name), list) else str(bad)
            with pytest.raises(ConfigError) as e:
                load_config(cls, [f"{path}={value}"])
            assert "\n" not in str(e.value) and path in str(e.value), (path, str(e.value))
            seen += 1
    assert seen >= 5


# ------------------------------------------------------------------------------ regressions (issue 28)


def _fails(argv: list[str], capsys) -> str:
    assert main(argv) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(err) == 1, err
    return err[0]


def test_train_rejects_values_that_corrupt_training(capsys, tmp_path):
    model = str(tmp_path / "no_model")  # never loaded: every check runs before
    for ov, said in [("optim.grad_clip=-1", "optim.grad_clip=-1.0 is not allowed: must be in [0, 1000] (0 = no clipping)"),
                     ("algorithm.ppo.clip_low=-1", "algorithm.ppo.clip_low=-1.0 is not allowed: must be in [0, 1)"),
                     ("algorithm.ppo.clip_low=1", "algorithm.ppo.clip_low=1.0 is not allowed: must be in [0, 1)"),
                     ("trainer.mini_batches=200",
                      "trainer.mini_batches=200 is not allowed: must be in [1, trainer.batch_size (128)]"),
                     ("workflow.top_p=0", "workflow.top_p=0.0 is not allowed: must be in (0, 1] (1 = off)"),
                     ("trainer.mini_batch_split=steps", "trainer.mini_batch_split='steps' is not allowed: "
                                                       "must be one of groups, rows")]:
        line = _fails(["train", f"model.path={model}", f"out_dir={tmp_path / 'out'}", ov], capsys)
        assert line == f"memrl train: error: {said}", line
    line = _fails(["train", f"model.path={model}", "trainer.mini_batches=2", "trainer.mini_batch_rows=8"], capsys)
    assert "trainer.mini_batch_rows=8" in line and "trainer.mini_batches=2" in line


def test_mini_batches_up_to_the_batch_size_are_admitted():
    cfg = load_config(TrainConfig, ["trainer.batch_size=4", "trainer.mini_batches=4"])
    assert cfg.trainer.mini_batches == 4
    with pytest.raises(ConfigError, match=r"trainer.mini_batches=5 is not allowed"):
        load_config(TrainConfig, ["trainer.batch_size=4", "trainer.mini_batches=5"])


def test_eval_rejects_bad_values_before_the_model_loads(capsys, tmp_path):
    data = tmp_path / "eval_50.json"
    data.write_text("[]")
    base = ["eval", "--model", str(tmp_path / "no_model"), "--out", str(tmp_path / "out"), str(data)]
    assert _fails(base + ["limit=-1"], capsys) == \
        "memrl eval: error: limit=-1 is not allowed: must be in [0, 1000000] (0 = all)"
    assert _fails(base + ["workflow.top_p=1.5"], capsys) == \
        "memrl eval: error: workflow.top_p=1.5 is not allowed: must be in (0, 1] (1 = off)"
    assert _fails(base + ["workflow.temperature=-0.5"], capsys) == \
        "memrl eval: error: workflow.temperature=-0.5 is not allowed: must be in [0, 100] (0 = greedy)"


def test_demo_and_sft_reject_bad_values(capsys, tmp_path):
    out = str(tmp_path / "demo")
    assert _fails(["demo", "--out", out, "sft.epochs=-1"], capsys) == \
        "memrl demo: error: sft.epochs=-1 is not allowed: must be in [1, 1000000]"
    assert _fails(["demo", "--agent", "memact", "--out", out, "sft.late_prob=2"], capsys) == \
        "memrl demo: error: sft.late_prob=2.0 is not allowed: must be in [0, 1]"
    assert _fails(["train-sft", f"model.path={tmp_path}", "sft.grad_clip=-1"], capsys) == \
        "memrl train-sft: error: sft.grad_clip=-1.0 is not allowed: must be in [0, 1000] (0 = no clipping)"


def test_a_config_built_in_code_is_checked_too(tmp_path):
    import dataclasses as dc

    from memrl.training.assemble import validate

    cfg = load_config(TrainConfig, ["model.path=x"])
    bad = dc.replace(cfg, optim=dc.replace(cfg.optim, grad_clip=-1.0))
    with pytest.raises(ConfigError, match=r"^optim.grad_clip=-1.0 is not allowed"):
        validate(bad)


def test_clip_norm_never_reverses_or_freezes_an_update():
    from memrl.training.update.policy import clip_norm

    assert clip_norm(1.0) == 1.0 and clip_norm(0.0) == float("inf")  # 0 = no clipping, never max_norm 0
    with pytest.raises(ValueError, match="grad_clip must be >= 0"):
        clip_norm(-1.0)





def _numeric_options():
    """(command, option, action) of every int / float command-line option of every `memrl` command."""
    import argparse

    from memrl.cli import build_parser

    parser, _ = build_parser()
    todo = [("memrl", parser)]
    while todo:
        name, p = todo.pop()
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                todo += [(f"{name} {n}", sub) for n, sub in a.choices.items()]
            elif a.type is not None and getattr(a.type, "__name__", "") in ("int", "float"):
                yield name, a.option_strings[0] if a.option_strings else a.dest, a


def test_every_numeric_command_line_option_declares_a_range():
    """serve / view / data / model options use memrl.config.bounded: a plain int or float type is a miss."""
    opts = list(_numeric_options())
    assert len(opts) >= 10
    plain = [f"{c} {o}" for c, o, a in opts if a.type in (int, float)]
    assert not plain, plain


def test_out_of_range_command_line_options_fail_in_one_line(capsys):
    for argv, said in [(["serve", "retrieval", "--corpus", "c.jsonl", "--port", "70000"],
                        "argument --port: 70000 is not allowed: must be in [1, 65535]"),
                       (["view", "run", "--port", "-1"], "argument --port: -1 is not allowed: must be in [0, 65535]"),
                       (["data", "show", "f.json", "--rows", "0"], "argument --rows: 0 is not allowed: must be in [1, 1000000]")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.endswith(f": error: {said}\n"), argv


# ------------------------------------------------------------------------ choice fields (issue 48 item 8)
# Every string field either declares its choices (`valid(..., choices=...)`, so the one walker refuses a
# wrong value by name with the others, before any work) or is free text, listed here with why.
FREE_TEXT: dict[str, str] = {
    "ConversationSection": "", "SFTRunConfig.out_dir": "a path",
    "DemonstratorSection.source": "a path, checked before any work (demonstrator.name=evidence)", "SyntheticConfig.fact_sep": "text",
    "MemActDemoConfig.variant": "joined variant names, checked by the demo before any work",
    "MemActDemoConfig.train_preset": "a preset name or path", "ContextDemoConfig.train_preset": "a preset name or path",
    "ContextDemoConfig.sft_from": "a run directory, checked before any work",
    "ContextDemoConfig.warmup_from": "a run directory, checked once the initial model exists",
    "Mem1DemoConfig.train_preset": "a preset name or path", "LookbackConfig.train_preset": "a preset name or path",
    "InfMemDemoConfig.train_preset": "a preset name or path", "RecipeConfig.train_preset": "a preset name or path",
    "SplitConfig.train_preset": "a preset name or path",
    "DemoConfig.model_preset": "a model preset name",
    "DemoConfig.train_preset": "a preset name or path", "DemoSFT.unanswerable_text": "text",
    "DemoSFT.restate_sep": "text", "EngineConfig.model": "a path", "HFSection.device": "a torch device string",
    "HFSection.attn_implementation": "transformers' names and hub kernels (kernels-community/...)",
    "OpenAISection.base_url": "a URL", "OpenAISection.served_model": "a server's model name",
    "OpenAISection.api_key": "a secret", "OpenAISection.api_key_env": "an environment variable",
    "OpenAISection.vllm_reload_method": "a server-side method name", "OpenAISection.sync_dir": "a path",
    "VLLMSection.cpu_threads_bind": "a CPU list", "OpenAIConfig.base_url": "a URL", "OpenAIConfig.tokenizer": "a path",
    "OpenAIConfig.model": "a server's model name", "OpenAIConfig.api_key": "a secret",
    "OpenAIConfig.api_key_env": "an environment variable", "OpenAIConfig.vllm_reload_method": "a method name",
    "OpenAIConfig.server": "inherited declaration in OpenAISection", "VLLMConfig.cpu_threads_bind": "a CPU list",
    "VLLMConfig.model": "a path", "EvalConfig.name": "a run name", "EvalConfig.docs_from": "a path",
    "JudgeSettings.url": "a URL", "JudgeSettings.model": "a model name", "JudgeSettings.api_key_env": "a variable",
    "JudgeSettings.rubric_file": "a path", "JudgeSettings.correct_tag": "text", "JudgeSettings.partial_tag": "text",
    "JudgeSettings.incorrect_tag": "text", **{f"TaskJudge.{k}": "inherited declaration in JudgeSettings" for k in (
        "url", "model", "api_key_env", "rubric_file", "correct_tag", "partial_tag", "incorrect_tag")},
    "TaskJudge.prompts_dir": "a path", "DataSection.path": "a path", "DataSection.docs_from": "a path",
    "DataSection.task_key": "a Task.meta key", "GRPOOptions.task_key": "a Task.meta key",
    "InfoMemOptions.answer_template": "text with {answer}, checked by InfoMemOptions",
    "ModelSection.path": "a path", "ModelSection.device": "a torch device string, parsed by ModelSection.check",
    "RaySection.address": "an address", "RaySection.temp_dir": "a path", "RolloutSection.sync_dir": "a path",
    "TrainConfig.out_dir": "a path", "TrainerSection.mlflow_uri": "a URI, checked by memrl.training.monitor.trackers",
    "TrainerSection.save_best": "a metric name, checked against the val metrics",
    "ValSection.files": "paths", "LoraSection.target_modules": "module names of the model",
    "no_memory_text": "text", "no_recall_text": "text", "update_tag": "a tag", "recall_tag": "a tag",
    "thinking_tag": "a tag", "reward": "a registered verifier or an import path, checked by check_verifier",
    "MemAgentConfig.final_step_reward": "format, a registered verifier or an import path, checked by check_verifier",
    "FullContextConfig": "", "memory_template_file": "a path", "final_template_file": "a path",
    "memory_template": "text", "final_template": "text", "retriever_kind": "a registry name or import path",
    "retriever_corpus": "a path", "retriever_url": "a URL", "tool_texts_file": "a path",
    "tool_truncation_marker": "text", "system_template_file": "a path", "system_noprune_template_file": "a path",
    "user_template_file": "a path", "system_template": "text", "system_noprune_template": "text",
    "user_template": "text", "answer_instruction": "text", "row_noprune_system_cut": "text",
    "row_noprune_user_cut": "text", "tool_schemas_file": "a path",
    "InfMemConfig.retrieved_item": "a format string, checked by InfMemConfig",
    "InfMemConfig.no_retrieval_text": "text", "InfMemConfig.tool_name": "a tool name",
    "InfMemConfig.stop_marker": "text", "InfMemConfig.plan_history_header": "a format string, checked",
    "InfMemConfig.memory_history_header": "a format string, checked", "InfMemConfig.history_line": "a format string",
    "plan_template_file": "a path", "plan_template": "text", "prompt_template_file": "a path",
    "InfMemConfig.plan_system_file": "a path", "InfMemConfig.plan_system": "text",
    "prompt_template": "text", "Mem1Config.state_tag": "a tag, checked by Mem1Config",
    "Mem1Config.hint_turns_left": "a format string, checked", "Mem1Config.hint_last_turn": "text",
    "Mem1Config.answer_separator": "text",
    "FoldGRPOOptions.process_rewards": "registered process reward names, checked by FoldGRPOOptions",
    "summary_request": "text", "summary_restart": "text, checked for {summary}",
}


def _str_fields(cls: type) -> list[dataclasses.Field]:
    hints = _hints(cls)
    return [f for f in dataclasses.fields(cls)
            if hints[f.name] in (str, str | None, list[str], list[str] | None)]


def _free(cls: type, name: str) -> bool:
    return any(k in FREE_TEXT for k in (f"{cls.__name__}.{name}", name, cls.__name__))


@pytest.mark.parametrize("cls", OWNED, ids=lambda c: c.__name__)
def test_every_string_field_declares_its_choices_or_is_free_text(cls):
    missing = [f.name for f in _str_fields(cls)
               if not _free(cls, f.name) and (allowed_of(f) is None or allowed_of(f).known() is None)]
    assert not missing, f"{cls.__name__}: string fields with neither declared choices nor a FREE_TEXT entry: {missing}"


@pytest.mark.parametrize("cls", OWNED, ids=lambda c: c.__name__)
def test_every_choice_field_refuses_a_wrong_value_by_name(cls):
    for f in _str_fields(cls):
        rule = allowed_of(f)
        if rule is None or rule.known() is None:
            continue
        obj = _instance(cls)
        object.__setattr__(obj, f.name, "nosuch")
        with pytest.raises(ConfigError) as e:
            check_config(obj, "sec")
        assert str(e.value).startswith(f"sec.{f.name}='nosuch' is not allowed: must be one of "), str(e.value)


def _choice_paths(cls: type, prefix: str = ""):
    inst = _instance(cls)
    for f in dataclasses.fields(cls):
        v = getattr(inst, f.name)
        if dataclasses.is_dataclass(v):
            yield from _choice_paths(type(v), prefix + f.name + ".")
        elif f in _str_fields(cls) and allowed_of(f) is not None and allowed_of(f).known() is not None:
            yield prefix + f.name


@pytest.mark.parametrize("root", list(ROOTS))
def test_commands_refuse_every_wrong_choice_before_any_work(root):
    """`val.extract=nosuch` passed the walker and failed when validation first ran, after training began."""
    cls = getattr(importlib.import_module(ROOTS[root]), root)
    seen = 0
    for path in _choice_paths(cls):
        with pytest.raises(ConfigError) as e:
            load_config(cls, [f"{path}=nosuch"])
        msg = str(e.value)
        assert "\n" not in msg and path.rsplit(".", 1)[-1] in msg and "nosuch" in msg, (path, msg)
        seen += 1
    assert seen >= (3 if root in ("TrainConfig", "EvalConfig") else 0)


@pytest.mark.parametrize("workflow", ["memagent", "rememr1", "memact", "full_context"])
def test_every_workflow_choice_field_is_refused_by_memrl_train_before_any_work(workflow):
    from memrl.training.assemble import validate
    from memrl.workflows import get_workflow

    cls = get_workflow(workflow).config_cls
    for f in _str_fields(cls):
        if allowed_of(f) is None or allowed_of(f).known() is None:
            continue
        cfg = load_config(TrainConfig, ["model.path=x", f"workflow={workflow}", f"workflow.{f.name}=nosuch"])
        with pytest.raises(ConfigError) as e:
            validate(cfg)
        assert "\n" not in str(e.value) and f.name in str(e.value) and "nosuch" in str(e.value), str(e.value)


def test_val_extract_and_metric_rules_refused_before_training(capsys, tmp_path):
    for ov, said in [("val.extract=nosuch", "val.extract='nosuch' is not allowed: must be one of boxed, answer_is, "
                                            "boxed_published, boxed_last300, raw"),
                     ("val.metric_rules=nosuch", "val.metric_rules='nosuch' is not allowed: must be one of memrl, "
                                                 "memagent, vime"),
                     ("engine.dtype=fp64", "engine.dtype='fp64' is not allowed: must be one of auto, float32, "
                                           "bfloat16, float16")]:
        line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}", ov], capsys)
        assert line == f"memrl train: error: {said}", line


# ------------------------------------------- non-finite and huge values (issue 48, "Done means", property)
NON_FINITE = (math.nan, math.inf, -math.inf)
HUGE = 2**70  # past int64: a value nobody means, which torch or numpy would overflow on


@pytest.mark.parametrize("cls", OWNED, ids=lambda c: c.__name__)
def test_every_numeric_field_refuses_nan_inf_and_huge_values_in_one_line(cls):
    """nan, inf and -inf (a float's only: an int field never holds one), 1e30, 1e308 and 2**70 are refused by
    name in every numeric field: `optim.lr=1e30` trained garbage weights and `algorithm.ppo.clip_high=1e308`
    overflowed mid-step (issue 63)."""
    for f, kind in numeric_fields(cls):
        values = ([*NON_FINITE, 1e30, 1e308, -1e308] if kind is float else []) + [kind(HUGE), kind(-HUGE)]
        for bad in values:
            obj = _instance(cls)
            is_list = isinstance(getattr(obj, f.name), list)
            object.__setattr__(obj, f.name, [bad] if is_list else bad)
            with pytest.raises(ConfigError) as e:
                check_config(obj, "sec")
            msg = str(e.value)
            assert "\n" not in msg and msg.startswith(f"sec.{f.name}=") and "is not allowed: must be" in msg, msg


def test_every_numeric_command_line_option_refuses_nan_inf_and_huge_values_in_one_line():
    """Each int / float option's parser (memrl.config.bounded) declares an upper bound and refuses nan, inf
    and a huge value by name (`memrl model init --seed 100000000000000000000000` overflowed, `--vocab-size
    1000000000000` ran out of memory); nothing but argparse's one-line error comes out."""
    import argparse

    checked = 0
    for cmd, opt, action in _numeric_options():
        for text in ("nan", "inf", "-inf", str(HUGE), str(-HUGE), "1000000000000"):
            with pytest.raises(argparse.ArgumentTypeError) as e:
                action.type(text)
            assert "\n" not in str(e.value) and "not" in str(e.value), (cmd, opt, text)
            checked += 1
    assert checked >= 6 * 15


def test_huge_values_from_issue_63_refused_by_name(capsys, tmp_path):
    model = str(tmp_path / "no_model")  # never loaded: every check runs before
    for ov, said in [("optim.lr=1e30", "optim.lr=1e+30 is not allowed: must be in (0, 1]"),
                     ("algorithm.ppo.clip_high=1e308", "algorithm.ppo.clip_high=1e+308 is not allowed: must be in "
                                                       "[0, 1000]"),
                     ("algorithm.gspo.seq_clip_high=1e308", "algorithm.gspo.seq_clip_high=1e+308 is not allowed: "
                                                            "must be in [0, 1000]"),
                     ("algorithm.infomem.coef=1e300", "algorithm.infomem.coef=1e+300 is not allowed: must be in "
                                                      "[0, 1000]"),
                     ("trainer.batch_size=1000000000", "trainer.batch_size=1000000000 is not allowed: must be in "
                                                       "[1, 1000000]"),
                     ("trainer.seed=100000000000000000000000", "trainer.seed=100000000000000000000000 is not "
                                                               "allowed: must be in [0, 4294967295]")]:
        line = _fails(["train", f"model.path={model}", f"out_dir={tmp_path / 'out'}", ov], capsys)
        assert line == f"memrl train: error: {said}", line
    for argv, said in [(["model", "init", "--preset", "tiny-qwen3", "--out", model, "--seed",
                         "100000000000000000000000"],
                        "argument --seed: 100000000000000000000000 is not allowed: must be in [0, 4294967295]"),
                       (["model", "init", "--preset", "tiny", "--out", model, "--vocab-size", "1000000000000"],
                        "argument --vocab-size: 1000000000000 is not allowed: must be in [1, 1048576]")]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.endswith(f": error: {said}\n"), err
