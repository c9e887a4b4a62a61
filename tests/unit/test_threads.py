"""memrl.threads: the `threads` section of train / eval / ask, its defaults, and that the OpenMP wait policy is
in the environment before torch is imported (libgomp reads it once, then)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from memrl import threads as T
from memrl.config import ConfigError, load_config
from memrl.eval.runner import EvalConfig
from memrl.training.checkpoints.run_dir import config_changes
from memrl.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", T.ENV)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return {**env, **extra}


def _run(code: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], capture_output=True, text=True,
                          env=_env(**env), cwd=ROOT, timeout=300)


@pytest.fixture
def keep_threads(monkeypatch):
    """Restore torch's intra-op count and the variables apply() exports."""
    before = torch.get_num_threads()
    for k in ("OMP_WAIT_POLICY", T.ENV):
        monkeypatch.setenv(k, "x")
        monkeypatch.delenv(k)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------ the section


def test_defaults_are_auto_intra_op_one_inter_op_and_auto_policy():
    for cfg in (TrainConfig(), EvalConfig()):
        assert (cfg.threads.intra_op, cfg.threads.inter_op, cfg.threads.wait_policy) == (0, 1, "auto")


@pytest.mark.parametrize(("override", "message"), [
    ("threads.wait_policy=spin", "threads.wait_policy='spin' is not allowed: must be one of auto, passive, active"),
    ("threads.intra_op=-1", "threads.intra_op=-1 is not allowed: must be in [0, 4096] (0 = auto: OMP_NUM_THREADS "
                            "if set, else the CPUs this process may use, at most 16 (eval / ask: less those other "
                            "processes keep busy at start))"),
    ("threads.inter_op=5000", "threads.inter_op=5000 is not allowed: must be in [0, 4096] (0 = torch's default, "
                              "one per core)"),
])
@pytest.mark.parametrize("schema", [TrainConfig, EvalConfig])
def test_bad_values_are_one_line_errors_naming_the_field(schema, override, message):
    with pytest.raises(ConfigError) as e:
        load_config(schema, [override])
    assert str(e.value) == message


def test_a_resumed_run_may_change_its_threads():
    assert config_changes({"threads": {"intra_op": 0}}, {"threads": {"intra_op": 2}}) == []


def test_intra_op_explicit_then_environment_then_usable_cpus(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert T.intra_op_threads(T.ThreadsSection(intra_op=3)) == (3, "threads.intra_op")
    monkeypatch.setattr(T, "busy_cpus", lambda: None)  # no /proc/stat: every usable CPU
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    assert T.intra_op_threads(T.ThreadsSection()) == (2, "auto")
    monkeypatch.setattr(T, "usable_cpus", lambda: 64)
    assert T.intra_op_threads(T.ThreadsSection()) == (16, "auto")  # capped
    monkeypatch.setenv("OMP_NUM_THREADS", "5")
    assert T.intra_op_threads(T.ThreadsSection()) == (5, "OMP_NUM_THREADS")  # the user's environment wins
    assert T.intra_op_threads(T.ThreadsSection(intra_op=1)) == (1, "threads.intra_op")  # over the default only
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert T.intra_op_threads(T.ThreadsSection()) == (16, "auto")


@pytest.mark.parametrize("cpus,busy,threads", [
    (2, 0.0, 2), (2, 0.4, 2), (2, 0.6, 1), (2, 1.0, 1), (2, 2.0, 1),  # a busy neighbour takes its core
    (64, 10.0, 16), (64, 50.2, 14), (1, None, 1)])
def test_auto_threads_leave_the_cores_other_processes_keep_busy(monkeypatch, cpus, busy, threads):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(T, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(T, "busy_cpus", lambda: busy)
    n, where = T.intra_op_threads(T.ThreadsSection())
    assert n == threads
    assert where == ("auto" if busy is None else f"auto ({cpus} CPUs, {busy:.1f} busy with other processes)")


def test_train_keeps_every_cpu_and_says_which_count_would_be_faster(monkeypatch, caplog):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    monkeypatch.setattr(T, "busy_cpus", lambda: 1.0)
    with caplog.at_level("WARNING", logger="memrl.threads"):
        assert T.intra_op_threads(T.ThreadsSection(), load_aware=False) == (2, "auto")
    assert caplog.messages == ["threads: other processes keep 1.0 of this process's 2 CPUs busy; threads.intra_op "
                               "stays at 2 so that the run's numbers do not depend on the load (threads.intra_op=1 "
                               "would run faster beside them)"]
    caplog.clear()
    monkeypatch.setattr(T, "busy_cpus", lambda: 0.2)  # an idle machine: nothing to say
    assert T.intra_op_threads(T.ThreadsSection(), load_aware=False) == (2, "auto")
    assert caplog.messages == []


def test_busy_cpus_sees_a_process_spinning_on_one_cpu(tmp_path):
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\n"
                             "open(os.sys.argv[1], 'w').close()\nwhile True: pass", str(tmp_path / "up")])
    try:
        for _ in range(200):  # until it spins
            if (tmp_path / "up").exists():
                break
            time.sleep(0.05)
        busy = T.busy_cpus({cpu}, seconds=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert busy is not None and busy >= 0.8  # one CPU, a busy loop on it: (nearly) all its ticks are busy


def test_wait_policy_auto_keeps_the_users_environment_else_passive():
    assert T.wanted_policy(T.ThreadsSection(), None) == "PASSIVE"
    assert T.wanted_policy(T.ThreadsSection(), "active") is None
    assert T.wanted_policy(T.ThreadsSection(wait_policy="active"), None) == "ACTIVE"
    assert T.wanted_policy(T.ThreadsSection(wait_policy="passive"), "active") == "PASSIVE"


def test_usable_cpus_is_the_affinity_mask():
    assert T.usable_cpus() == len(os.sched_getaffinity(0))


def test_section_from_a_preset_chain_and_overrides(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("threads:\n  intra_op: 3\n  wait_policy: active\noptim:\n  lr: 1.0e-5\n")
    child = tmp_path / "child.yaml"
    child.write_text(f"inherit: {base}\nthreads:\n  inter_op: 2\n")
    sec = T.section_from(str(child), ["threads.wait_policy=passive"])
    assert (sec.intra_op, sec.inter_op, sec.wait_policy) == (3, 2, "passive")
    assert load_config(TrainConfig, ["threads.wait_policy=passive"], preset=str(child)).threads == sec
    with pytest.raises(ConfigError, match="threads.wait_policy"):
        T.section_from(None, ["threads.wait_policy=spin"])


# ------------------------------------------------------------------------------------------ in process


def test_apply_sets_torch_and_exports_the_section(keep_threads):
    info = T.apply(T.ThreadsSection(intra_op=1))
    assert torch.get_num_threads() == 1
    assert (info["intra_op"], info["intra_op_from"]) == (1, "threads.intra_op")
    assert info["inter_op"] == torch.get_num_interop_threads()
    assert json.loads(os.environ[T.ENV]) == {"intra_op": 1, "inter_op": 1, "wait_policy": "auto"}
    assert T.worker_env()[T.ENV] == os.environ[T.ENV]
    assert T.metrics(info)["threads/intra_op"] == 1.0


def test_a_worker_applies_the_inherited_section(keep_threads, monkeypatch):
    monkeypatch.setenv(T.ENV, json.dumps({"intra_op": 1, "inter_op": 1, "wait_policy": "passive"}))
    assert T.apply_inherited()["intra_op"] == 1 == torch.get_num_threads()
    monkeypatch.setenv(T.ENV, json.dumps({"intra_op": -3}))
    assert T.apply_inherited() is None  # a bad value is logged and ignored
    monkeypatch.delenv(T.ENV)
    assert T.apply_inherited() is None


def test_metrics_code_the_policy():
    assert [T.metrics({"intra_op": 2, "inter_op": 1, "wait_policy": p})["threads/passive"]
            for p in ("PASSIVE", "ACTIVE", "unset")] == [1.0, 0.0, -1.0]


def test_the_demos_threads_go_through_the_same_helper(monkeypatch):
    from memrl.recipes import pipeline

    calls = []
    monkeypatch.setattr(pipeline, "set_torch_threads", lambda n: calls.append(n))
    pipeline.set_threads(type("Cfg", (), {"threads": 3})())
    pipeline.set_threads(type("Cfg", (), {"threads": 0})())
    assert calls == [3]


# ------------------------------------------------------------------------------------------ processes


def test_importing_the_cli_does_not_import_torch():
    r = _run("import sys, memrl.cli; print('torch' in sys.modules)")
    assert r.stdout.strip() == "False", r.stderr


CHILD = """
    import os, sys
    from memrl.threads import early_env
    early_env(sys.argv[1:])
    seen = os.environ.get("OMP_WAIT_POLICY")
    import torch
    print(seen, "torch" in sys.modules)
"""


@pytest.mark.parametrize(("argv", "env", "seen"), [
    (["train", "out_dir=x"], {}, "PASSIVE"),
    (["eval", "--out", "o", "f.json", "threads.wait_policy=active"], {}, "ACTIVE"),
    (["ask", "--model", "m", "threads.wait_policy=passive"], {"OMP_WAIT_POLICY": "active"}, "PASSIVE"),
    (["train"], {"OMP_WAIT_POLICY": "active"}, "active"),  # auto: the user's environment wins
    (["train", "threads.wait_policy=spin"], {}, "None"),  # a bad section: left to the config load to report
    (["data", "threads.wait_policy=active"], {}, "None"),  # not a command with a threads section
])
def test_the_policy_is_in_the_environment_before_torch_is_imported(argv, env, seen):
    r = _run(CHILD, *argv, **env)
    assert r.stdout.split() == [seen, "True"], r.stderr


def test_the_policy_comes_from_the_preset_too(tmp_path):
    p = tmp_path / "p.yaml"
    p.write_text("threads:\n  wait_policy: active\n")
    assert _run(CHILD, "train", "--preset", str(p)).stdout.split()[0] == "ACTIVE"
    assert _run(CHILD, "train", f"--preset={p}", "threads.wait_policy=passive").stdout.split()[0] == "PASSIVE"


def _omp_display(*argv: str, **env: str) -> dict[str, str]:
    """What torch's OpenMP runtime read at its initialisation (OMP_DISPLAY_ENV=VERBOSE, libgomp's format)."""
    r = _run("import sys; from memrl.cli import main; sys.exit(main(sys.argv[1:]))", *argv,
             OMP_DISPLAY_ENV="VERBOSE", **env)
    shown = dict(ln.strip().replace("'", "").split(" = ", 1) for ln in r.stderr.splitlines() if " = " in ln)
    if "OMP_WAIT_POLICY" not in shown:
        pytest.skip("torch's OpenMP runtime does not display its settings (not libgomp)")
    return shown


def test_memrl_train_gives_openmp_a_passive_wait_policy():
    shown = _omp_display("train", "--print-config")
    assert shown["OMP_WAIT_POLICY"] == "PASSIVE"
    assert shown["GOMP_SPINCOUNT"] == "0"  # no spinning between parallel regions
    active = _omp_display("train", "--print-config", "threads.wait_policy=active")
    assert active["OMP_WAIT_POLICY"] == "ACTIVE"
    # without memrl setting it, libgomp spins before it sleeps (what a plain `import torch` gets)
    r = _run("import torch", OMP_DISPLAY_ENV="VERBOSE")
    assert "GOMP_SPINCOUNT = '0'" not in r.stderr


FAKE_TRAIN = """
    import sys, torch
    import memrl.commands.train as C
    class Fake:
        step, ckpt_root = 0, ""
        def __init__(self, parts): pass
        def fit(self):
            print("THREADS", torch.get_num_threads(), torch.get_num_interop_threads())
            return []
    C.assemble = lambda cfg, resume, workflow: None
    C.Trainer = Fake
    from memrl.cli import main
    sys.exit(main(sys.argv[1:]))
"""


def test_memrl_train_sets_torchs_threads_before_any_model_loads(tmp_path):
    from memrl.models.tiny import cached_tiny_model

    model = str(cached_tiny_model("tiny"))
    r = _run(FAKE_TRAIN, "train", f"model.path={model}", f"out_dir={tmp_path / 'run'}", "threads.intra_op=1")
    assert "THREADS 1 1" in r.stdout, r.stderr
    r = _run(FAKE_TRAIN, "train", f"model.path={model}", f"out_dir={tmp_path / 'run2'}", OMP_NUM_THREADS="1")
    assert "THREADS 1 1" in r.stdout, r.stderr  # the default defers to the user's OMP_NUM_THREADS


def test_the_demo_refuses_a_train_threads_section_it_would_not_read(tmp_path):
    from memrl.recipes.memagent import DemoConfig
    from memrl.recipes.pipeline import load_run

    with pytest.raises(ConfigError) as e:
        load_run(DemoConfig, ["train.threads.intra_op=1"], tmp_path / "demo")
    assert str(e.value) == ("train.threads.* is not read by memrl demo: its threads=N sets torch's threads for the "
                            "whole demo")
    assert load_run(DemoConfig, ["threads=1"], tmp_path / "demo").cfg.threads == 1
