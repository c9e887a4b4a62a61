"""Issue 63 (part B): hostile and careless input, round four: contradictions refused before any model loads,
foreign or broken model directories, write failures, damaged demo files; each probe is one line naming the
field / file / directory (exit 2 for a command-line value, 1 otherwise), no traceback, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line

from memrl.cli import main


def _fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


def _eval_file(tmp_path: Path) -> Path:
    data = tmp_path / "eval_1.json"
    data.write_text(json.dumps([{"input": "q0", "answers": ["v0"], "context": "Document 1: x", "index": 0}]))
    return data


# ------------------------------------------------------- item 15: engine.hf settings that contradict each other

_PADDED_PREFIX = ("engine.hf.prefix_cache_tokens=64 needs engine.hf.kv_cache=slots (the padded cache has no prefix "
                  "cache); set kv_cache=slots or prefix_cache_tokens=0")
_PADDED_CHUNK = ("engine.hf.prefill_chunk_tokens=64 needs engine.hf.kv_cache=slots (the padded cache prefills "
                 "admitted prompts as one batch); set kv_cache=slots or prefill_chunk_tokens=0")
_WAVES_CHUNK = ("engine.hf.prefill_chunk_tokens=64 needs engine.hf.deterministic=false (a deterministic wave is "
                "prefilled whole, so its batches never depend on how prefills are split); set deterministic=false "
                "or prefill_chunk_tokens=0")


@pytest.mark.parametrize(("ov", "said"), [
    (["engine.hf.prefix_cache_tokens=64"], _PADDED_PREFIX),
    (["engine.hf.prefill_chunk_tokens=64"], _PADDED_CHUNK),
    (["engine.hf.kv_cache=slots", "engine.hf.prefill_chunk_tokens=64"], _WAVES_CHUNK),
])
def test_train_refuses_contradictory_hf_engine_settings_before_the_model_loads(ov, said, tmp_path, capsys):
    # before: a ValueError traceback from HFEngine's constructor, after the policy had loaded; here the model
    # directory does not even exist, so the refusal provably comes first
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}", *ov], capsys)
    assert line == f"memrl train: error: {said}"


@pytest.mark.parametrize(("ov", "said"), [
    (["engine.hf.prefill_chunk_tokens=64"], _PADDED_CHUNK),
    (["engine.hf.kv_cache=slots", "engine.hf.deterministic=true", "engine.hf.prefill_chunk_tokens=64"], _WAVES_CHUNK),
])
def test_eval_refuses_contradictory_hf_engine_settings_before_the_model_loads(ov, said, tmp_path, capsys):
    line = _fails(["eval", str(_eval_file(tmp_path)), "--model", str(tmp_path / "no_model"), "--out",
                   str(tmp_path / "ev"), *ov], capsys)
    assert line == f"memrl eval: error: {said}"


def test_eval_accepts_chunked_prefill_with_slots_and_continuous_batching():
    # the combination the refusals point to loads (eval's engine default is deterministic=false)
    from memrl.config import load_config
    from memrl.eval.runner import EvalConfig

    cfg = load_config(EvalConfig, ["engine.hf.kv_cache=slots", "engine.hf.prefill_chunk_tokens=64"])
    assert (cfg.engine.hf.prefill_chunk_tokens, cfg.engine.hf.deterministic) == (64, False)


# ------------------------------------------------------- item 16: estimator / data / workflow mismatches


def test_rememr1_on_a_workflow_without_step_rewards_is_refused_up_front(tmp_path, capsys):
    # before: "rememr1 advantage: group ... has no step rewards" raised in the first step
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
                   "algorithm.name=rememr1", "workflow=fold"], capsys)
    assert line == ("memrl train: error: algorithm.name=rememr1 needs step rewards, which workflow=fold does not give "
                    "(WorkflowSpec.step_rewards: memagent, rememr1 and infmem do); use grpo, rloo or dcpo there")


def test_std_over_task_on_synthetic_tasks_is_refused_before_the_model_loads(tmp_path, tiny_model, capsys, monkeypatch):
    import memrl.training.assemble as A

    monkeypatch.setattr(A, "build_workers", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    line = _fails(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'out'}", "algorithm.grpo.norm_by_std=true",
                   "algorithm.grpo.std_over=task"], capsys, code=1)
    assert line == ("memrl train: error: algorithm.grpo.std_over=task reads each task's meta['data_source'] "
                    "(algorithm.grpo.task_key), but task syn-s0-c4-0 of the synthetic stream (data.name=synthetic) "
                    "has none (its meta keys: fact_chunks, hops, num_chunks, seed)")


@pytest.mark.parametrize(("ov", "setting", "key_field"), [
    (["data.sampling=task_balanced"], "data.sampling=task_balanced", "data.task_key"),
    (["algorithm.grpo.norm_by_std=true", "algorithm.grpo.std_over=task"], "algorithm.grpo.std_over=task",
     "algorithm.grpo.task_key"),
])
def test_task_kind_settings_on_a_file_without_the_key_are_refused_when_it_is_read(ov, setting, key_field, tmp_path,
                                                                                  tiny_model, capsys, monkeypatch):
    # before: task_balanced failed when the first batch was drawn, std_over=task when the first advantages were
    import memrl.training.assemble as A

    monkeypatch.setattr(A, "build_workers", lambda *a, **k: pytest.fail("the model loaded before the refusal"))
    data = tmp_path / "d.json"
    data.write_text(json.dumps([{"input": "q", "answers": ["a"], "context": "x", "index": 0, "data_source": "hq"},
                                {"input": "q2", "answers": ["b"], "context": "y", "index": 1}]))
    line = _fails(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'out'}", "data.name=file",
                   f"data.path={data}", *ov], capsys, code=1)
    assert line == (f"memrl train: error: {setting} reads each task's meta['data_source'] ({key_field}), but task 1 "
                    f"of {data} has none (its meta keys: index)")
