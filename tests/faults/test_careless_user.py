"""Issue 49: what a careless or hostile user does that used to finish "fine" while something was lost,
wrong or exposed. Each test failed on the code before its fix; every refusal is one line naming the thing."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import train_child  # noqa: F401 - registers memagent_parity
from conftest import ROOT, make_trainer, one_line, run_child, train_overrides

import memrl.data.files as files
import memrl.training.ranks.workers as workers
from memrl.cli import main
from memrl.config import ConfigError, check_config, load_config
from memrl.data.io import write_records
from memrl.errors import UserError
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig


# ------------------------------------------------------------------ 1. nan / inf in float fields, diverged steps
@pytest.mark.parametrize(("override", "field", "shown"), [
    ("optim.lr=inf", "optim.lr", "inf"),
    ("optim.weight_decay=inf", "optim.weight_decay", "inf"),
    ("algorithm.kl_coef=inf", "algorithm.kl_coef", "inf"),
    ("algorithm.entropy_coef=nan", "algorithm.entropy_coef", "nan"),
    ("optim.grad_clip=-inf", "optim.grad_clip", "-inf"),
    ("val.top_p=nan", "val.top_p", "nan"),
])
def test_float_fields_refuse_nan_and_inf_by_name(override, field, shown, tmp_path, capsys):
    argv = ["train", "--preset", "demo_cpu", f"out_dir={tmp_path / 'run'}", override]
    assert main(argv) == 2
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: {field}={shown} is not allowed: must be a finite number (not nan or inf)")
    assert not (tmp_path / "run").exists()


def test_inf_in_a_preset_and_in_a_config_built_in_code(tmp_path, capsys):
    preset = tmp_path / "p.yaml"
    preset.write_text("inherit: demo_cpu\noptim:\n  lr: .inf\n", encoding="utf-8")
    assert main(["train", "--preset", str(preset), "model.path=x"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: optim.lr=inf is not allowed: must be a finite number (not nan or inf)")
    cfg = load_config(TrainConfig, [], preset="demo_cpu")
    built = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, kl_coef=math.inf))
    with pytest.raises(ConfigError, match=r"^algorithm\.kl_coef=inf is not allowed: must be a finite number"):
        check_config(built)
    # a float field without a declared range (sft's lr floor is declared; a workflow's float is checked too)
    with pytest.raises(ConfigError, match=r"^workflow\.temperature=nan is not allowed: must be a finite number"):
        validate(load_config(TrainConfig, ["model.path=x", "workflow.temperature=nan",
                                           "algorithm.temperature=1.0"], preset="demo_cpu"))


def test_non_finite_loss_stops_the_run_in_one_line_and_saves_nothing(tiny_model, tmp_path, monkeypatch):
    real = workers.ppo_micro_loss

    def poisoned(*args, **kwargs):
        part = real(*args, **kwargs)
        part.loss = part.loss * math.nan
        return part

    monkeypatch.setattr(workers, "ppo_micro_loss", poisoned)
    out = tmp_path / "run"
    trainer = make_trainer(tiny_model, out)
    before = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    with pytest.raises(UserError) as e:
        trainer.fit()
    assert str(e.value) == ("step 1: training diverged (loss/total=nan, train/grad_norm=nan); "
                            "stopped without saving this step (lower optim.lr or check the rewards and advantages)")
    assert not list((out / "checkpoints").glob("step_*"))
    after = trainer.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "a diverged step changed the weights"


# ------------------------------------------------------------------ 2-4. out_dir: a run there, locks, resume config
def _train(model: str, out: Path, *extra: str) -> int:
    return main(["train", *train_overrides(model, out, steps=1), *extra])


def test_a_finished_run_is_not_restarted_without_resume_or_overwrite(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(tiny_model, out) == 0
    ckpt = out / "checkpoints" / "step_000001"
    stamp = (ckpt / "trainer_state.pt").stat().st_mtime_ns
    capsys.readouterr()
    assert _train(tiny_model, out) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: out_dir={out} holds a run (1 checkpoint(s), the last step_000001, metrics.jsonl); "
        "pass --resume to continue it or --overwrite to delete it and start again from step 0")
    assert (ckpt / "trainer_state.pt").stat().st_mtime_ns == stamp
    assert _train(tiny_model, out, "--resume", "--overwrite") == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: --resume and --overwrite exclude each other: continue the run or start it again")
    assert _train(tiny_model, out, "--overwrite") == 0
    assert (ckpt / "trainer_state.pt").stat().st_mtime_ns != stamp
    assert [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())] == [1]


def test_resume_refuses_a_changed_config_and_allows_more_steps(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    assert _train(tiny_model, out) == 0
    capsys.readouterr()
    assert _train(tiny_model, out, "--resume", "data.seed=5", "optim.lr=2e-3", "trainer.steps=2") == 2
    saved = out / "checkpoints" / "step_000001" / "config.yaml"
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: --resume: the config differs from the run's ({saved}) in 2 setting(s) that change "
        "the run: data.seed (0 -> 5); optim.lr (0.001 -> 0.002); resume with the saved values or train into a "
        "new out_dir")
    assert not (out / "checkpoints" / "step_000002").exists()
    assert _train(tiny_model, out, "--resume", "trainer.steps=2", "trainer.save_every=2") == 0
    assert (out / "checkpoints" / "step_000002").is_dir()


HOLD = ("import sys, time; sys.path.insert(0, {root!r}); from memrl.locks import acquire; "
        "acquire(sys.argv[1], 'x'); print('held', flush=True); time.sleep(60)")


def _holder(path: Path):
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(root=str(ROOT)), str(path)], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_locked_out_dir_is_refused_naming_the_owner_and_a_dead_owners_lock_is_stale(tiny_model, tmp_path, capsys):
    out = tmp_path / "run"
    proc = _holder(out)
    try:
        assert _train(tiny_model, out) == 1
        assert one_line(capsys.readouterr().err) == (
            f"memrl train: error: output directory out_dir={out} is in use by pid {proc.pid} (lock file "
            f"{out / '.memrl.lock'}); wait for it to end or choose another directory")
        evals = tmp_path / "eval_1.json"
        write_records(evals, [{"input": "q?", "answers": ["a"], "context": "Document 1: a.", "index": 0,
                               "num_docs": 1}])
        assert main(["eval", str(evals), "--out", str(out), "--model", tiny_model]) == 1
        assert one_line(capsys.readouterr().err) == (
            f"memrl eval: error: output directory --out={out} is in use by pid {proc.pid} (lock file "
            f"{out / '.memrl.lock'}); wait for it to end or choose another directory")
        assert not (out / "results.jsonl").exists()
        assert main(["train-sft", f"model.path={tiny_model}", f"out_dir={out}"]) == 1
        assert one_line(capsys.readouterr().err) == (
            f"memrl train-sft: error: output directory out_dir={out} is in use by pid {proc.pid} (lock file "
            f"{out / '.memrl.lock'}); wait for it to end or choose another directory")
        assert not (out / "config.yaml").exists()
    finally:
        proc.kill()
        proc.wait()
    assert (out / ".memrl.lock").read_text().strip() == str(proc.pid)  # left behind by kill -9: stale
    assert _train(tiny_model, out) == 0


def test_a_sweep_child_ends_with_its_parent(tmp_path):
    """kill -9 of the sweep (memrl demo --seeds) ends the run it started (seeds.end_with_parent)."""


    code = ("import os, subprocess, sys; sys.path.insert(0, {root!r}); from memrl.recipes.seeds import end_with_parent; "
            "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
            "preexec_fn=end_with_parent(os.getpid())); print(p.pid, flush=True); p.wait()")
    parent = subprocess.Popen([sys.executable, "-c", code.format(root=str(ROOT))], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    for _ in range(100):
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        raise AssertionError("the sweep's child outlived it")


# ------------------------------------------------------------------ 5. eval resume of a rebuilt file
def test_eval_resume_drops_rows_of_an_earlier_version_of_a_rebuilt_file(tiny_model, tmp_path, capsys):
    small = ["workflow.chunk_tokens=64", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2"]
    f = tmp_path / "eval_1.json"

    def build(tag: str) -> None:
        write_records(f, [{"input": f"what is {tag}{i}?", "answers": [f"v{i}"], "context": f"Document 1: {tag}{i} is v{i}.",
                           "index": i, "num_docs": 1} for i in range(3)])

    out = tmp_path / "ev"
    build("key")
    assert main(["eval", str(f), "--out", str(out), "--model", tiny_model, "--no-progress", *small]) == 0
    first = [json.loads(x)["file_sha256"] for x in (out / "results.jsonl").read_text().splitlines()]
    build("other")  # rebuilt at the same path: 3 other questions
    assert main(["eval", str(f), "--out", str(out), "--model", tiny_model, "--no-progress", *small]) == 0
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and len(set(first)) == 1
    assert {r["file_sha256"] for r in rows} != set(first)
    assert [r["questions"] for r in csv_rows(out / "summary.csv")] == ["3"]


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# ------------------------------------------------------------------ 6. save_best and val.files before step 1
def test_save_best_and_val_files_are_checked_before_the_first_step(tiny_model, tmp_path, capsys):
    val = tmp_path / "hotpotqa_eval_1.json"
    write_records(val, [{"input": "q?", "answers": ["a"], "context": "Document 1: a.", "index": 0, "num_docs": 1,
                         "dataset": "hotpotqa"}])
    out = tmp_path / "run"
    on = ["trainer.val_every=1", f"val.files=[{val}]"]
    assert _train(tiny_model, out, *on, "trainer.save_best=val/hotpotqa/1/acuracy") == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: trainer.save_best='val/hotpotqa/1/acuracy' is not a metric validation of val.files "
        "logs; known: val/mean_accuracy, val/hotpotqa/1/accuracy, val/hotpotqa/1/em, val/hotpotqa/1/f1, "
        "val/hotpotqa/1/questions")
    assert not (out / "val").exists(), "refused only after a step trained and validated"
    assert _train(tiny_model, out, "trainer.save_best=rewrd/mean") == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: trainer.save_best='rewrd/mean' is not a metric of this run: a metric's name starts "
        "with one of reward/, rollout/, traj/, format/, judge/, loss/, train/, mismatch/, time/, perf/, dcpo/, "
        "async/, val/")
    bad = tmp_path / "bad_eval_1.json"
    bad.write_text('[{"input": "q?"', encoding="utf-8")
    assert _train(tiny_model, out, "trainer.val_every=1", f"val.files=[{bad}]") == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"memrl train: error: {bad}: invalid JSON"), err
    assert not (out / "metrics.jsonl").exists() and not (out / "checkpoints").exists()


def test_a_kill_while_copying_the_best_checkpoint_keeps_that_steps_metrics_row(tiny_model, tmp_path):
    out = tmp_path / "run"
    proc = run_child(tiny_model, out, "best_copy", "trainer.save_best=reward/mean")
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (out / "checkpoints" / "step_000001").is_dir() and not (out / "checkpoints" / "best").exists()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    make_trainer(tiny_model, out, resume=True, extra=("trainer.save_best=reward/mean",)).fit()
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert (out / "checkpoints" / "best" / "best.json").is_file()


# ------------------------------------------------------------------ 7. data that can never score, empty builds
def test_gold_answers_of_only_zero_width_spaces_are_refused(tmp_path, capsys):
    f = tmp_path / "eval_1.json"
    write_records(f, [{"input": "q?", "answers": ["\u200b", " \u200b\ufeff "], "context": "Document 1: a.",
                       "index": 0, "num_docs": 1}])
    assert main(["data", "show", str(f)]) == 1
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"memrl data: error: {f}: row 0") and "every gold answer is empty" in err, err
    assert err.endswith("the task can never be scored"), err


@pytest.mark.parametrize("text", ["", "  \n\t \n"])
def test_ruler_build_refuses_an_empty_or_blank_haystack(text, tiny_model, tmp_path, capsys):
    essay = tmp_path / "essay.txt"
    essay.write_text(text, encoding="utf-8")
    out = tmp_path / "ruler"
    argv = ["data", "build", "--kind", "ruler", "--tasks", "niah_single_2", "--lengths", "1k", "--samples", "1",
            "--tokenizer", tiny_model, "--haystack", str(essay), "--out", str(out)]
    assert main(argv) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl data: error: --haystack {essay}: no words of text; the essay haystack needs some")
    assert not list(out.rglob("*.json*"))


@pytest.mark.parametrize(("flag", "value", "said"), [
    ("--tasks", ",", "--tasks ',' names no task; expected some of "),
    ("--lengths", " , ", "--lengths ' , ' names no length, e.g. --lengths 8k,16k,32k"),
])
def test_ruler_build_refuses_a_list_that_names_nothing(flag, value, said, tiny_model, tmp_path, capsys):
    argv = {"--tasks": "vt", "--lengths": "1k"}
    argv[flag] = value
    out = tmp_path / "ruler"
    assert main(["data", "build", "--kind", "ruler", "--tasks", argv["--tasks"], "--lengths", argv["--lengths"],
                 "--samples", "1", "--tokenizer", tiny_model, "--out", str(out)]) == 1
    assert one_line(capsys.readouterr().err).startswith(f"memrl data: error: {said}")
    assert not out.exists()


# ------------------------------------------------------------------ 9. builders write through a temporary file
@pytest.mark.parametrize("name", ["eval_1.json", "train.jsonl", "eval_1.json.gz", "corpus.parquet"])
def test_a_write_that_fails_midway_leaves_the_old_file_whole_and_no_partial_one(name, tmp_path, monkeypatch):
    path = tmp_path / "out" / name
    old = [{"input": "q?", "answers": ["a"]}]
    write_records(path, old)
    before = path.read_bytes()

    class DiskFull(list):
        def __iter__(self):
            yield {"input": "q1?", "answers": ["b"]}
            raise OSError(28, "No space left on device")

    def full_disk_parquet(table, where):  # pyarrow writes part of the file, then the disk is full
        Path(where).write_bytes(b"PAR1 partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(files.pq, "write_table", full_disk_parquet)
    with pytest.raises(OSError, match="No space left"):
        write_records(path, DiskFull([{"input": "x", "answers": ["y"]}]) if "parquet" not in name else old)
    assert path.read_bytes() == before
    assert sorted(p.name for p in path.parent.iterdir()) == [name]


# ------------------------------------------------------------------ 11. secrets: api keys and URL credentials
SECRET = "sk-do-not-leak-1234"
CREDS = "http://bob:pw-do-not-leak@example.invalid:8000/v1"


def _tree_holds(root: Path, *needles: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and any(n.encode() in p.read_bytes() for n in needles)]


def test_wandb_run_files_keep_no_key_from_the_command_line_or_config(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    from memrl.training.monitor.trackers import open_trackers

    monkeypatch.setattr(sys, "argv", ["memrl", "train", f"engine.openai.api_key={SECRET}",
                                      f"engine.openai.base_url={CREDS}"])
    config = {"engine": {"openai": {"api_key": SECRET, "base_url": CREDS}}}
    for t in open_trackers(["wandb"], tmp_path, {}, config, ""):
        t.log(1, {"x": 1.0})
        t.close()
    assert list(tmp_path.rglob("*.wandb"))
    assert _tree_holds(tmp_path, SECRET, "pw-do-not-leak") == []
    assert sys.argv[2] == f"engine.openai.api_key={SECRET}"  # restored after wandb.init


def test_the_seed_sweep_record_keeps_no_key(tmp_path):
    from memrl.recipes.seeds import Run, marker_of, write_outputs

    run = Run(0, "native", tmp_path / "native" / "seed0", (f"train.engine.openai.api_key={SECRET}",
                                                           f"train.engine.openai.base_url={CREDS}"))
    assert marker_of("memagent", run)["overrides"] == [
        "train.engine.openai.api_key=<redacted>", "train.engine.openai.base_url=http://<redacted>@example.invalid:8000/v1"]
    agg = {"agent": "memagent", "runs": [{"overrides": list(run.overrides)}], "rows": []}
    try:
        write_outputs(agg, tmp_path, command=f"memrl demo --seeds 0 train.engine.openai.api_key={SECRET}")
    except (KeyError, TypeError):  # the markdown wants a full aggregate; the json is written after it
        pass
    assert _tree_holds(tmp_path, SECRET, "pw-do-not-leak") == []


def test_printed_configs_and_errors_show_no_url_credentials_or_key(capsys):
    argv = ["train", "--preset", "demo_cpu", "model.path=x", f"engine.openai.base_url={CREDS}",
            f"engine.openai.api_key={SECRET}", "--print-config"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "base_url: http://<redacted>@example.invalid:8000/v1" in out and "api_key: <redacted>" in out
    assert SECRET not in out and "pw-do-not-leak" not in out
    assert main(["train", "--preset", "demo_cpu", f"engine.openai.timeout_s={CREDS}"]) == 2
    err = one_line(capsys.readouterr().err)
    assert "engine.openai.timeout_s=http://<redacted>@example.invalid:8000/v1" in err and "pw-do-not-leak" not in err
    assert main(["train", "--preset", "demo_cpu", f"engine.openai.api_key={SECRET}", "optim.lr=[1"]) == 2
    assert SECRET not in capsys.readouterr().err


# ------------------------------------------------------------------ 12-13. interpolations, alias bombs, bad YAML values
def test_env_interpolation_is_refused_in_overrides_and_presets(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMRL_TEST_SECRET", SECRET)
    assert main(["train", "--preset", "demo_cpu", "model.path=x",
                 "engine.openai.base_url=http://h/${oc.env:MEMRL_TEST_SECRET}", "--print-config"]) == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl train: error: engine.openai.base_url='http://h/${oc.env:MEMRL_TEST_SECRET}' (set by an override) is "
        "an interpolation; memrl resolves no ${...} in configs (write the value itself, or \\${ for a literal)")
    preset = tmp_path / "shared.yaml"
    preset.write_text("inherit: demo_cpu\nworkflow:\n  name: memagent\n  prompt_note: ${oc.env:MEMRL_TEST_SECRET}\n",
                      encoding="utf-8")
    assert main(["train", "--preset", str(preset), "model.path=x", "--print-config"]) == 2
    err = one_line(capsys.readouterr().err)
    assert err == (f"memrl train: error: workflow.prompt_note='${{oc.env:MEMRL_TEST_SECRET}}' (set by preset {preset}) "
                   "is an interpolation; memrl resolves no ${...} in configs (write the value itself, or \\${ for a "
                   "literal)")
    assert SECRET not in err


def test_a_yaml_alias_bomb_preset_is_refused_quickly(tmp_path, capsys):
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        ref = ", ".join([f"*{chr(96 + i)}"] * 10)
        lines.append(f"{chr(97 + i)}: &{chr(97 + i)} [{ref}]")
    preset = tmp_path / "bomb.yaml"
    preset.write_text("\n".join(lines) + "\n", encoding="utf-8")  # 10^9 values once expanded
    t0 = time.perf_counter()
    assert main(["train", "--preset", str(preset), "model.path=x"]) == 2
    assert time.perf_counter() - t0 < 10
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: preset {preset}: its aliases expand to more than 200000 values (an alias bomb?); "
        "refusing to load it")
    from memrl.workflows.memact_config import load_tool_schemas  # a MemAct tool_schemas_file is YAML too

    with pytest.raises(ConfigError, match=r"tool_schemas_file .*: its aliases expand to more than 200000 values"):
        load_tool_schemas(str(preset))


@pytest.mark.parametrize("value", ["[1", "{a", "[1, 2"])
def test_an_override_value_yaml_cannot_parse_is_one_line(value, capsys):
    assert main(["train", "--preset", "demo_cpu", "model.path=x", f"optim.lr={value}"]) == 2
    err = one_line(capsys.readouterr().err)
    assert err.startswith(f"memrl train: error: override 'optim.lr={value}': the value is not valid YAML ("), err
    assert err.endswith("); quote it to pass it as text"), err


def test_log_messages_naming_a_url_with_credentials_are_redacted(tmp_path, caplog):
    f = tmp_path / "eval_1.json"
    write_records(f, [{"input": "q?", "answers": ["a"], "context": "Document 1: a.", "index": 0, "num_docs": 1}])
    assert main(["data", "show", str(f)]) == 0  # any command installs the redaction
    with caplog.at_level("WARNING"):
        logging.getLogger("memrl.engines.openai_http").warning("%s: retrying (503)", CREDS)
    assert caplog.records[-1].getMessage() == "http://<redacted>@example.invalid:8000/v1: retrying (503)"


def test_a_non_finite_sft_loss_stops_before_the_weights_change(tiny_model, monkeypatch):
    from transformers import AutoModelForCausalLM

    import memrl.training.sft as sft
    from memrl.types import Segment

    real = sft.sft_micro_loss

    def poisoned(*args, **kwargs):
        part = real(*args, **kwargs)
        part.loss = part.loss * math.inf
        return part

    monkeypatch.setattr(sft, "sft_micro_loss", poisoned)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    rows = [Segment([5, 6, 7], [8, 9], [0.0, 0.0], [1, 1])]
    with pytest.raises(UserError, match=r"^sft step 1: training diverged \(sft/loss=inf, sft/grad_norm=nan\)"):
        sft.sft_train(model, rows, sft.SFTConfig(epochs=1, batch_rows=1))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
