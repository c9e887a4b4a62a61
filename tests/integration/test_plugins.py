"""Plugins by import path: a workflow and a reward verifier that live outside memrl, named as
`workflow=module:SPEC` and `workflow.reward=module:fn`, through `memrl eval` and `memrl train` (with resume);
the one-line errors for each way a name can be wrong; the built-ins unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memrl.cli import main
from memrl.config import ConfigError
from memrl.workflows import (
    BUILTIN_WORKFLOWS,
    WorkflowSpec,
    format_counts,
    format_keys,
    get_workflow,
    parse_workflow,
    register_workflow,
)

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""A workflow written outside memrl: one call that answers from the head of the context."""
from __future__ import annotations

from dataclasses import dataclass

from memrl.config import valid
from memrl.engines.base import SamplingParams
from memrl.rewards.verifiers import verifier
from memrl.types import Trajectory
from memrl.workflows import WorkflowSpec, boxed_em_outcome
from memrl.workflows.chunked import call_model, call_segment

CALLED = []


@verifier
def even_length(response_text, golds):
    """A reward a random model earns about half the time: the answer text has an even length."""
    return float(len(response_text) % 2 == 0)


def not_marked(response_text, golds):
    CALLED.append(response_text)
    return 1.0


@dataclass
class HeadConfig:
    head_tokens: int = valid(16, ge=1)
    max_tokens: int = valid(8, ge=1)
    temperature: float = valid(1.0, ge=0)
    reward: str = "boxed_em"


async def run(task, engine, cfg, rng):
    tok = engine.tokenizer
    head = tok.decode(tok.encode(task.context, add_special_tokens=False)[: cfg.head_tokens])
    seed = rng.getrandbits(31) if cfg.temperature > 0 else None
    sp = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_tokens, seed=seed)
    prompt_ids, out, text = await call_model(engine, f"{task.question}\\n{head}", sp)
    seg = call_segment(prompt_ids, out, 0, {"kind": "final", "answer_text": text})
    metrics = {"short_answer": float(len(out.token_ids) < cfg.max_tokens),
               "generated_tokens": float(len(out.token_ids))}
    return Trajectory(task.task_id, "", [seg], final_answer=text, metrics=metrics,
                      info={"answer_text": text, "reward": cfg.reward})


SPEC = WorkflowSpec("head_answer", run, HeadConfig, boxed_em_outcome, format_keys=("short_answer",),
                    train_defaults={"max_tokens": 4}, eval_defaults={"temperature": 0.0, "max_tokens": 3})
NOT_A_SPEC = {"name": "head_answer"}
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch, request):
    """The module name of PLUGIN written under tmp_path (on sys.path; unique per test)."""
    name = f"memrl_plugin_{request.node.name.split('[')[0]}"
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / f"{name}.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
    yield name
    sys.modules.pop(name, None)


# ---------------------------------------------------------------- resolving, defaults, format keys


def test_a_workflow_by_import_path_is_known_by_that_path(plugin):
    spec = get_workflow(f"{plugin}:SPEC")
    assert spec.name == f"{plugin}:SPEC" and spec.config_cls.__name__ == "HeadConfig"
    assert spec.format_keys == ("short_answer",)
    assert spec.defaults("train") == {"max_tokens": 4}
    assert spec.defaults("eval") == {"temperature": 0.0, "max_tokens": 3}
    # the section wins, then the caller's defaults, then the spec's own for the stage, then the class's
    _, wf = parse_workflow({"name": f"{plugin}:SPEC"}, defaults={"temperature": 0.7}, stage="train")
    assert (wf.head_tokens, wf.max_tokens, wf.temperature) == (16, 4, 0.7)
    _, wf = parse_workflow({"name": f"{plugin}:SPEC", "max_tokens": 5}, stage="eval")
    assert (wf.max_tokens, wf.temperature) == (5, 0.0)
    _, wf = parse_workflow({"name": f"{plugin}:SPEC"})
    assert (wf.max_tokens, wf.temperature) == (8, 1.0)


def test_builtin_names_and_their_import_paths_are_the_same_specs():
    for name in BUILTIN_WORKFLOWS:
        assert get_workflow(f"memrl.workflows.{name}:SPEC").name == name
        assert get_workflow(name).run is get_workflow(f"memrl.workflows.{name}:SPEC").run
    # what WORKFLOW_DEFAULTS and eval's greedy defaults gave each built-in before the specs carried them
    assert {n: get_workflow(n).defaults("train") for n in BUILTIN_WORKFLOWS} == {
        "memagent": {"max_chunks": 8}, "rememr1": {"max_chunks": 8}, "full_context": {}, "memact": {},
        "infmem": {"max_chunks": 8}, "mem1": {}, "fold": {}, "summarize": {}, "sliding_window": {}}
    assert {n: get_workflow(n).defaults("eval") for n in BUILTIN_WORKFLOWS} == {
        "memagent": {"temperature": 0.0}, "rememr1": {"temperature": 0.0}, "full_context": {"temperature": 0.0},
        "memact": {"temperature": 0.0, "no_prune_prob": 0.0}, "infmem": {"temperature": 0.0},
        "mem1": {"temperature": 0.0}, "fold": {"temperature": 0.0}, "summarize": {"temperature": 0.0},
        "sliding_window": {"temperature": 0.0}}


def test_format_keys_are_gathered_from_the_specs(plugin):
    builtin = ("no_box", "missing_update", "empty_update", "multiple_updates", "unclosed_update",
               "multiple_recalls", "unclosed_recall", "empty_recall",
               "no_final_marker", "malformed_calls", "answer_unparsed")  # fmt: skip
    assert format_keys()[: len(builtin)] == builtin
    spec = get_workflow(f"{plugin}:SPEC")
    assert format_keys()[-1] == "short_answer"  # known once the spec was named in this process
    metrics = [{"short_answer": 1.0, "no_box": 1.0}, {"short_answer": 0.0}, {"short_answer": 2.0}]
    assert format_counts(metrics) == {"no_box": 1, "short_answer": 2}
    assert format_counts(metrics, spec.format_keys) == {"short_answer": 2}


def test_registered_path_and_factory_names(monkeypatch):
    import memrl.workflows as workflows

    monkeypatch.setattr(workflows, "_REGISTRY", dict(workflows._REGISTRY))  # registrations end with the test
    register_workflow("memagent_alias", "memrl.workflows.memagent:SPEC")
    register_workflow("memagent_made", lambda: get_workflow("memagent"))
    assert get_workflow("memagent_alias").name == "memagent_alias"  # known by the name it was given
    assert get_workflow("memagent_made").name == "memagent_made"
    assert get_workflow("memagent_alias").defaults("train") == {"max_chunks": 8}


def test_memrl_workflows_imports_no_workflow_module():
    code = ("import sys, memrl.workflows; "
            "print(sorted(m for m in sys.modules if m.startswith('memrl.workflows.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    # only the template-file check's helper (memrl.workflows.templates), no workflow module
    assert out.stdout.strip() == "['memrl.workflows.templates']"


def test_a_spec_refuses_defaults_for_fields_it_does_not_have():
    from memrl.workflows.memagent import MemAgentConfig, reward, run

    with pytest.raises(ValueError, match=r"^WorkflowSpec 'x': train_defaults names bogus, not fields of "
                                         r"MemAgentConfig$"):
        WorkflowSpec("x", run, MemAgentConfig, reward, train_defaults={"bogus": 1, "max_chunks": 2})
    with pytest.raises(ValueError, match=r"^WorkflowSpec 'x': eval_defaults names no_prune_prob, not fields"):
        WorkflowSpec("x", run, MemAgentConfig, reward, eval_defaults={"no_prune_prob": 0.0})


# ---------------------------------------------------------------- one-line errors


def _error(section: dict) -> str:
    with pytest.raises(ConfigError) as e:
        parse_workflow(section)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_workflow_path_errors_name_the_field(plugin, tmp_path):
    assert _error({"name": "a.b:c:d"}) == (
        "workflow.name='a.b:c:d': expected an import path module:attr (e.g. mypkg.mymodule:NAME)")
    assert _error({"name": "memrl_no_such_plugin:SPEC"}) == (
        "workflow.name='memrl_no_such_plugin:SPEC': cannot import module 'memrl_no_such_plugin' "
        "(No module named 'memrl_no_such_plugin')")
    assert _error({"name": f"{plugin}:NOPE"}) == (
        f"workflow.name='{plugin}:NOPE': module '{plugin}' has no attribute 'NOPE'")
    hint = "name a memrl.workflows.WorkflowSpec instance, e.g. mypkg.myworkflow:SPEC (nothing was called)"
    assert _error({"name": f"{plugin}:run"}) == (
        f"workflow.name='{plugin}:run' is not a WorkflowSpec (got function): {hint}")
    assert _error({"name": f"{plugin}:NOT_A_SPEC"}) == (
        f"workflow.name='{plugin}:NOT_A_SPEC' is not a WorkflowSpec (got dict): {hint}")
    assert _error({"name": "os:system"}) == (
        f"workflow.name='os:system' is not a WorkflowSpec (got builtin_function_or_method): {hint}")
    (tmp_path / "plugins" / "memrl_plugin_broken.py").write_text("raise RuntimeError('boom')\n")
    assert _error({"name": "memrl_plugin_broken:SPEC"}) == (
        "workflow.name='memrl_plugin_broken:SPEC': cannot import module 'memrl_plugin_broken' (RuntimeError: boom)")
    # a dotted name without a colon is an unknown name, with a hint
    assert _error({"name": f"{plugin}.SPEC"}).endswith("; an import path is written module:ATTR")


def test_reward_path_errors_name_the_field(plugin):
    import importlib

    hint = "only functions marked with @memrl.rewards.verifiers.verifier may be named (nothing was called)"
    for wf in ("memagent", f"{plugin}:SPEC"):
        assert _error({"name": wf, "reward": f"{plugin}:not_marked"}) == (
            f"workflow.reward='{plugin}:not_marked' is not a verifier (got function): {hint}")
        assert _error({"name": wf, "reward": "os:system"}) == (
            f"workflow.reward='os:system' is not a verifier (got builtin_function_or_method): {hint}")
        assert _error({"name": wf, "reward": f"{plugin}:"}) == (
            f"workflow.reward='{plugin}:': expected an import path module:attr (e.g. mypkg.mymodule:NAME)")
        assert _error({"name": wf, "reward": "memrl_no_such_plugin:fn"}) == (
            "workflow.reward='memrl_no_such_plugin:fn': cannot import module 'memrl_no_such_plugin' "
            "(No module named 'memrl_no_such_plugin')")
        assert _error({"name": wf, "reward": f"{plugin}:nope"}) == (
            f"workflow.reward='{plugin}:nope': module '{plugin}' has no attribute 'nope'")
    assert importlib.import_module(plugin).CALLED == []
    # a registered name still gives the list of names
    assert _error({"name": "memagent", "reward": "em"}) == (
        "workflow: MemAgentConfig.reward must be one of box_weighted_f1, boxed_em, format_f1, published_box_f1, ruler_match, verl_hotpotqa, got 'em' (or the import path "
        "module:fn of a @memrl.rewards.verifiers.verifier function)")


def test_a_reward_by_import_path_scores_memagent(plugin):

    from doubles import ScriptedEngine

    from memrl.runtime import rollout_once
    from memrl.types import Task

    spec, cfg = parse_workflow({"name": "memagent", "chunk_tokens": 8, "max_memory_tokens": 20,
                                "max_final_tokens": 20, "temperature": 0.0, "reward": f"{plugin}:even_length"})
    task = Task("t", "Who?", "abcdefgh", ["Beatles"])
    for final, expected in (("\\boxed{Beatles}", 0.0), ("\\boxed{Beatles}.", 1.0)):  # 15 and 16 characters
        traj = rollout_once([task], spec, ScriptedEngine(["note", final]), cfg, n=1)[0].trajectories[0]
        assert traj.info["answer_text"] == final and traj.reward == expected


def test_unknown_import_path_is_a_usage_error_in_every_command(tmp_path, capsys):
    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    msg = ("workflow.name='memrl_no_such_plugin:SPEC': cannot import module 'memrl_no_such_plugin' "
           "(No module named 'memrl_no_such_plugin')")
    f = tmp_path / "eval_1.json"
    f.write_text("[]")
    for argv in (["eval", str(f), "--out", str(tmp_path / "ev"), "--model", model],
                 ["train", f"model.path={model}", f"out_dir={tmp_path / 'r'}"],
                 ["train-sft", f"model.path={model}", f"out_dir={tmp_path / 's'}"]):
        assert main([*argv, "workflow=memrl_no_such_plugin:SPEC"]) == 2
        lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert lines == [f"memrl {argv[0]}: error: {msg}"]


# ---------------------------------------------------------------- end to end on the tiny model


@pytest.mark.slow
def test_plugin_workflow_through_memrl_eval_and_train(plugin, tmp_path):
    from memrl.data.memagent_files import write_eval_json
    from memrl.eval.runner import CONFIG_FILE, RESULTS_FILE, read_results
    from memrl.models.tiny import cached_tiny_model
    from memrl.types import Task

    model = str(cached_tiny_model("tiny"))
    wf_path, reward_path = f"{plugin}:SPEC", f"{plugin}:even_length"

    # memrl eval: the spec's eval defaults (greedy, max_tokens=3), the reward by path, the record names both
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task(f"q{i}", f"What is key{i}?", f"Document 1: key{i} is v{i}.", [f"v{i}"],
                                meta={"num_docs": 2, "index": i}) for i in range(4)])
    out = tmp_path / "ev"
    argv = ["eval", "--model", model, "--out", str(out), "--no-progress", str(data),
            f"workflow={wf_path}", f"workflow.reward={reward_path}"]
    assert main(argv) == 0
    record = json.loads((out / CONFIG_FILE).read_text())
    assert record["workflow"] == wf_path
    assert record["workflow_config"] == {"head_tokens": 16, "max_tokens": 3, "temperature": 0.0,
                                         "reward": reward_path}
    rows = read_results(out / RESULTS_FILE)
    assert sorted(r["task_id"] for r in rows) == ["q0", "q1", "q2", "q3"]
    for r in rows:
        assert r["reward"] == float(len(r["answer_text"]) % 2 == 0)
        assert set(r["metrics"]) == {"short_answer", "generated_tokens"}
        assert r["metrics"]["generated_tokens"] <= 3
    # the saved config check accepts the same import paths again: nothing is redone
    assert main(argv) == 0
    assert read_results(out / RESULTS_FILE) == rows

    # a report read in a new process resolves the plugin from eval_config.json and counts its format key
    short = sum(1 for r in rows if r["metrics"]["short_answer"] > 0)
    code = ("import json, sys; from memrl.eval.report import load_summaries; "
            "s = load_summaries(sys.argv[1])[0]; print(json.dumps([s.format_errors, s.format_detail]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path / "plugins")])}
    got = subprocess.run([sys.executable, "-c", code, str(out)], env=env, capture_output=True, text=True,
                         check=True)
    assert json.loads(got.stdout) == [short, f"short_answer={short}" if short else ""]

    # memrl train: two steps with the spec's train defaults, then a resumed third step
    run = tmp_path / "train"
    train = ["train", f"model.path={model}", f"out_dir={run}", f"workflow={wf_path}",
             f"workflow.reward={reward_path}", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
             "trainer.batch_size=2", "algorithm.n=2", "optim.lr=1e-3", "optim.warmup_steps=0",
             "trainer.save_every=1", "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf"]
    assert main([*train, "trainer.steps=2"]) == 0
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["workflow"] == {"name": wf_path, "reward": reward_path}
    assert main([*train, "trainer.steps=3", "--resume"]) == 0
    lines = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert all("format/short_answer" in m for m in lines)
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_000003"

    # the saved config.yaml is a preset that names the same workflow, with the same train defaults
    from memrl.config import load_config
    from memrl.training.assemble import workflow_config
    from memrl.training.config import TrainConfig

    cfg = load_config(TrainConfig, preset=str(run / "config.yaml"))
    spec, wf = workflow_config(cfg)
    assert spec.name == wf_path and (wf.max_tokens, wf.reward) == (4, reward_path)
    assert wf.temperature == cfg.algorithm.temperature
