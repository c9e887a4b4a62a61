"""Issue 63: a property test over the commands' options. Every numeric config field of `memrl train` and
`memrl eval` (the nested sections, the estimator and loss options, the workflow's own fields) and the
numeric command-line options of the other commands are fed hostile values: huge, tiny, negative, NaN, inf,
empty, a lone surrogate, a wrong type; and the contradictory pairs of the issue. Each run of a command
must end in one of two ways: exit status != 0 with exactly one line on stderr and no traceback, or (for
the few values that may mean something) a completed run whose weights are all finite.

By default every hostile value meets one field of `memrl train` and one of `memrl eval` (fields drawn with
a fixed seed, so the run is repeatable and a few seconds long); MEMRL_HOSTILE_FULL=1 sweeps every field with
every value (about two thousand commands, minutes).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import math
import os
import random
import typing
from functools import partial

import pytest
import torch
from conftest import one_line

from memrl.cli import main
from memrl.recipes.pipeline import load_recipe

HOSTILE = ["1e308", "-1e308", "nan", "inf", "-inf", "-1", "0", "1e-300", "100000000000000000000000", "''",
           '"\\ud800"', "[1, 2]", "{a: 1}", "abc", "true", "3.5"]
"""Override values (YAML text, as typed after `key=`)."""

FULL = os.environ.get("MEMRL_HOSTILE_FULL") == "1"


def numeric_fields(cls: type, prefix: str = "") -> list[str]:
    """Dotted names of the int / float fields (optional ones too) of dataclass `cls`, nested sections walked."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        h = hints[f.name]
        if dataclasses.is_dataclass(h):
            out += numeric_fields(h, f"{prefix}{f.name}.")
        elif set(typing.get_args(h) or (h,)) - {type(None)} <= {int, float} and h is not bool:
            out.append(prefix + f.name)
    return out


def _train_cases() -> list[str]:
    from memrl.training.config import TrainConfig
    from memrl.workflows import get_workflow

    wf = [f"workflow.{k}" for k in numeric_fields(get_workflow("memagent").config_cls)]
    return numeric_fields(TrainConfig) + wf


def _eval_cases() -> list[str]:
    from memrl.eval.runner import EvalConfig

    return [k for k in numeric_fields(EvalConfig) if not k.startswith("engine.")]  # engine.*: train's sweep


DEMOS = {"memagent": "memrl.recipes.memagent:DemoConfig", "context": "memrl.recipes.context:ContextDemoConfig",
         "memact": "memrl.recipes.memact:MemActDemoConfig", "infmem": "memrl.recipes.infmem:InfMemDemoConfig",
         "mem1": "memrl.recipes.mem1:Mem1DemoConfig"}
"""`memrl demo --agent A` -> its config class (module:attr)."""


def _demo_cases(agent: str) -> list[str]:
    module, attr = DEMOS[agent].split(":")
    # threads: an accepted value would set this process's torch thread count
    return [k for k in numeric_fields(getattr(importlib.import_module(module), attr)) if k != "threads"]


def _demo_loader(agent: str):
    """The config loader `memrl demo --agent A` runs first: (overrides, out dir) -> configs."""
    return partial(load_recipe, importlib.import_module(DEMOS[agent].split(":")[0]).RECIPE)


def _cases(keys: list[str], seed: int, per: int | None = None) -> list[tuple[str, str]]:
    """(field, value) pairs: every value with one field drawn with `seed`, or `per` pairs drawn (every field
    with every value, FULL)."""
    if FULL:
        return [(k, v) for k in keys for v in HOSTILE]
    rng = random.Random(seed)
    if per is not None:
        return [(rng.choice(keys), rng.choice(HOSTILE)) for _ in range(per)]
    return [(rng.choice(keys), v) for v in HOSTILE]


def _assert_refused_in_one_line(argv: list[str], capsys) -> str:
    """The command exits != 0 with one line on stderr (no traceback); that line."""
    rc = main(argv)
    err = capsys.readouterr().err
    assert "Traceback" not in err, (argv, err)
    assert rc != 0, argv
    return one_line(err)


ACCEPTED = "accepted"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> list[tuple[str, str, str]]:
    """(field, value, the one line said, or ACCEPTED) for each hostile case of `memrl train`, `memrl eval`
    (through the command line: no model directory exists, so a value the config accepts stops at model.path
    / --model, in one line too) and the demos' configs (through each recipe's config loader, the first thing
    `memrl demo --agent A` runs: an accepted value returns the configs). A command that exits 0, prints a
    traceback or more than one line, or a loader that raises anything but a UserError, fails here."""
    from memrl.errors import UserError

    tmp = tmp_path_factory.mktemp("hostile")
    missing = tmp / "no_model"
    cases = [(["train", f"model.path={missing}", f"out_dir={tmp / 'out'}", f"{k}={v}"], k, v)
             for k, v in _cases(_train_cases(), 63)]
    data = tmp / "eval_1.json"
    data.write_text('[{"input": "q", "answers": ["a"], "context": "x", "index": 0}]')
    cases += [(["eval", str(data), "--model", str(missing), "--out", str(tmp / "ev"), f"{k}={v}"], k, v)
              for k, v in _cases(_eval_cases(), 64)]
    out = []
    for argv, key, value in cases:
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            rc = main(argv)
        assert "Traceback" not in err.getvalue() and rc != 0, (argv, err.getvalue())
        line = one_line(err.getvalue())
        out.append((key, value, ACCEPTED if str(missing) in line and key not in line else line))
    threads = torch.get_num_threads()
    try:
        for i, agent in enumerate(DEMOS):
            load = _demo_loader(agent)
            for key, value in _cases(_demo_cases(agent), 65 + i, per=4):
                try:
                    load([f"{key}={value}"], tmp / f"demo_{agent}")
                except UserError as e:
                    out.append((key, value, one_line(f"memrl demo: error: {e}")))
                else:
                    out.append((key, value, ACCEPTED))
    finally:
        # a loader that accepts its config sets torch's thread count to the demo's `threads` (default 1): later
        # tests of this process (the in-process resume of test_kill_resume) must keep the count they started with
        torch.set_num_threads(threads)
    return out


def test_every_numeric_field_answers_hostile_values_in_one_line_naming_it(sweep):
    """No value escapes the checks as a traceback (the fixture); a refused value names its field."""
    for key, value, said in sweep:
        assert said == ACCEPTED or key.rsplit(".", 1)[-1] in said, (key, value, said)


def test_huge_nan_inf_and_surrogate_values_never_pass_a_numeric_field(sweep):
    """Numbers are finite and bounded where a huge value cannot mean anything (issue 63 items 1 and 9:
    every numeric field declares an upper bound)."""
    never = ("1e308", "-1e308", "nan", "inf", "-inf", '"\\ud800"', "100000000000000000000000")
    accepted = [(k, v) for k, v, said in sweep if v in never and said == ACCEPTED]
    assert not accepted, accepted


@pytest.mark.parametrize(("ov", "field"), [
    (["engine.hf.kv_cache=padded", "engine.hf.prefix_cache_tokens=64"], "engine.hf.prefix_cache_tokens"),
    (["engine.hf.kv_cache=slots", "engine.hf.prefill_chunk_tokens=8"], "engine.hf.prefill_chunk_tokens"),
    (["algorithm.name=rememr1", "workflow=fold"], "algorithm.name=rememr1"),
    (["workflow=summarize"], "workflow=summarize"),
    (["data.sampling=task_balanced"], "data.sampling=task_balanced"),
    (["trainer.mini_batch_rows=2", "trainer.mini_batches=2"], "trainer.mini_batch_rows"),
    (["algorithm.aepo.entropy_low=2", "algorithm.aepo.entropy_high=1", "algorithm.aepo.enabled=true",
      "algorithm.old_logprobs=trainer"], "algorithm.aepo.entropy_low"),
    (["rollout.max_staleness=1"], "rollout.max_staleness"),
    (["trainer.num_workers=2"], "trainer.num_workers"),
    (["engine=openai", "engine.openai.api=chat"], "engine.openai.api=chat"),
])
def test_contradictory_pairs_are_one_line_naming_a_field(ov, field, tmp_path, capsys):
    line = _assert_refused_in_one_line(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'o'}",
                                        *ov], capsys)
    assert field in line, line


@pytest.mark.parametrize("value", ["1e308", "-1", "nan", "inf", "100000000000000000000000", "''", "abc", "\ud800"])
@pytest.mark.parametrize("option", ["--seed", "--vocab-size"])
def test_model_init_options_refuse_hostile_values_in_one_line(option, value, tmp_path, capsys):
    line = _assert_refused_in_one_line(["model", "init", "--out", str(tmp_path / "m"), option, value], capsys)
    assert option in line
    assert not (tmp_path / "m").exists()


def test_the_values_that_mean_something_train_to_finite_weights(tiny_model, tmp_path, capsys):
    """The hostile values a field may take (tiny rates, zero coefficients, a large seed) train to the end,
    and every weight of the final checkpoint is finite."""
    import torch
    import train_child  # noqa: F401 - registers memagent_parity
    from conftest import train_overrides
    from safetensors.torch import load_file

    out = tmp_path / "run"
    rc = main(["train", *train_overrides(tiny_model, out, 1), "optim.lr=1e-300", "optim.grad_clip=1e-300",
               "algorithm.kl_coef=0", "algorithm.entropy_coef=0", "trainer.seed=4294967295", "data.seed=4294967295",
               "algorithm.temperature=0.001"])
    assert "Traceback" not in capsys.readouterr().err
    assert rc == 0
    last = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    assert last.name == "step_000001"
    weights = load_file(last / "model.safetensors")
    bad = [k for k, t in weights.items() if not bool(torch.isfinite(t).all())]
    assert weights and not bad and math.isfinite(sum(float(t.float().sum()) for t in weights.values()))
