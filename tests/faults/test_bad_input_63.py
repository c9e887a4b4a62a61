"""Issue 63 (part B): hostile and careless input, round four: contradictions refused before any model loads,
foreign or broken model directories, write failures, damaged demo files; each probe is one line naming the
field / file / directory (exit 2 for a command-line value, 1 otherwise), no traceback, nothing half-written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.recipes.pipeline import load_recipe


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
                "decoded alone, so no running rows wait while it prefills); set deterministic=false or "
                "prefill_chunk_tokens=0")


@pytest.mark.parametrize(("ov", "said"), [
    (["engine.hf.kv_cache=padded", "engine.hf.prefix_cache_tokens=64"], _PADDED_PREFIX),
    (["engine.hf.kv_cache=padded", "engine.hf.prefill_chunk_tokens=64"], _PADDED_CHUNK),
    (["engine.hf.kv_cache=slots", "engine.hf.prefill_chunk_tokens=64"], _WAVES_CHUNK),
])
def test_train_refuses_contradictory_hf_engine_settings_before_the_model_loads(ov, said, tmp_path, capsys):
    # before: a ValueError traceback from HFEngine's constructor, after the policy had loaded; here the model
    # directory does not even exist, so the refusal provably comes first
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}", *ov], capsys)
    assert line == f"memrl train: error: {said}"


@pytest.mark.parametrize(("ov", "said"), [
    (["engine.hf.kv_cache=padded", "engine.hf.prefill_chunk_tokens=64"], _PADDED_CHUNK),
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


# ------------------------------------------- items 18 and 13: model directories transformers cannot build; NaN


def _model_copy(src: str, dst: Path, config: dict | None = None, nan_in: str | None = None) -> Path:
    """A copy of model directory `src` with config.json keys replaced and/or one NaN in weight `nan_in`."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    if config:
        cfg = json.loads((dst / "config.json").read_text())
        cfg.update(config)
        (dst / "config.json").write_text(json.dumps(cfg))
    if nan_in:
        sd = load_file(dst / "model.safetensors")
        sd[nan_in][3] = float("nan")
        save_file(sd, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


_FOREIGN = [
    ({"model_type": "foobar"}, None,
     "config.json's model_type 'foobar' is not a model type transformers {v} knows (a newer transformers, or a model "
     "of a known type such as qwen2, qwen3, llama, is needed)"),
    ({"model_type": "t5"}, None,
     "config.json's model_type 't5' has no causal language model in transformers {v} (memrl needs a model that "
     "generates text)"),
    ({"num_hidden_layers": 6, "layer_types": ["full_attention"] * 6}, None,
     "config.json does not match the weights: 24 weight(s) of the model it describes are not in the files (first: "
     "model.layers.4.input_layernorm.weight); they would start random"),
    ({"num_hidden_layers": 2, "layer_types": ["full_attention"] * 2}, None,
     "config.json does not match the weights: 24 weight(s) in the files have no place in the model it describes "
     "(first: model.layers.2.input_layernorm.weight); they would be dropped"),
    ({"hidden_size": 384}, None,
     "config.json does not match the weights: 50 weight(s) have another shape in the files (first: "
     "model.embed_tokens.weight is [4096, 192] in the files, [4096, 384] in the model config.json describes)"),
    ({"num_hidden_layers": 6}, None,
     "config.json is not a valid qwen2 config: `num_hidden_layers` (6) must be equal to the number of `layer_types` (4)"),
    (None, "model.norm.weight",
     "weight model.norm.weight holds 1 NaN or infinite value(s) of 192 (a diverged or damaged checkpoint); refusing "
     "to generate from it"),
]


@pytest.mark.parametrize(("config", "nan_in", "said"), _FOREIGN)
def test_train_names_a_model_directory_transformers_cannot_build(config, nan_in, said, tmp_path, tiny_model, capsys):
    # before: transformers' traceback ("does not recognize this architecture", "size mismatch"), or a model
    # partly initialized at random without a word; NaN weights trained and generated garbage
    import transformers

    m = _model_copy(tiny_model, tmp_path / "m", config, nan_in)
    line = _fails(["train", f"model.path={m}", f"out_dir={tmp_path / 'out'}", "trainer.steps=1"], capsys, code=1)
    assert line == f"memrl train: error: model.path={m}: {said.format(v=transformers.__version__)}"


@pytest.mark.parametrize(("config", "nan_in", "said"), [_FOREIGN[0], _FOREIGN[2], _FOREIGN[4], _FOREIGN[6]])
def test_eval_names_a_model_directory_transformers_cannot_build(config, nan_in, said, tmp_path, tiny_model, capsys):
    import transformers

    m = _model_copy(tiny_model, tmp_path / "m", config, nan_in)
    line = _fails(["eval", str(_eval_file(tmp_path)), "--model", str(m), "--out", str(tmp_path / "ev"),
                   "--no-progress"], capsys, code=1)
    # config.json itself is read up front (--model); the weights when the engine loads them (engine.model)
    key = "--model" if config and "model_type" in config else "engine.model"
    assert line == f"memrl eval: error: {key}={m}: {said.format(v=transformers.__version__)}"
    assert not (tmp_path / "ev" / "results.jsonl").exists()


def test_train_sft_names_a_model_directory_whose_config_does_not_match(tmp_path, tiny_model, capsys):
    config, nan_in, said = _FOREIGN[4]
    m = _model_copy(tiny_model, tmp_path / "m", config, nan_in)
    line = _fails(["train-sft", f"model.path={m}", f"out_dir={tmp_path / 's'}"], capsys, code=1)
    assert line == f"memrl train-sft: error: model.path={m}: {said}"


def test_open_model_is_the_plain_load_for_a_sound_directory(tiny_model):
    import torch
    from transformers import AutoModelForCausalLM

    from memrl.model_open import open_model

    got = open_model(tiny_model, "model.path", dtype=torch.float32).state_dict()
    want = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


# ------------------------------------------------------------ item 21: `memrl model init` on a full disk


@pytest.mark.parametrize("how", ["oserror", "safetensors"])
def test_model_init_onto_a_full_disk_is_one_line_and_leaves_no_model(how, tmp_path, capsys, monkeypatch):
    # before: the OSError's traceback, and --out left with a tokenizer and config but no (or half the) weights
    import errno

    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    corpus = tmp_path / "c.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 50)
    argv = ["model", "init", "--corpus", str(corpus), "--vocab-size", "300"]
    older = tmp_path / "older"
    assert main([*argv, "--out", str(older)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in older.iterdir()}

    def full(self, save_directory, **kwargs):
        (Path(save_directory) / "model.safetensors").write_bytes(b"\0" * 100)  # the part that fitted
        if how == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", str(save_directory))
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full)
    for dest in (tmp_path / "fresh", older):  # a new directory, and --force over an older model
        line = _fails([*argv, "--out", str(dest), "--force"], capsys, code=1)
        assert line == (f"memrl model: error: --out {dest}: the disk is full (no space left on the device holding "
                        f"{tmp_path}); nothing was written to {dest}")
    assert {p.name: p.read_bytes() for p in older.iterdir()} == before  # the older model is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "older"]  # no fresh/, no temporary directory


def test_model_init_names_a_corpus_that_is_not_a_regular_file(tmp_path, capsys):
    # before: `--corpus /dev/zero` "does not exist"
    line = _fails(["model", "init", "--corpus", "/dev/zero", "--out", str(tmp_path / "m")], capsys, code=1)
    assert line == ("memrl model: error: --corpus /dev/zero is not a regular file (a directory, device or pipe); give "
                    "text files")
    line = _fails(["model", "init", "--corpus", str(tmp_path / "none.txt"), "--out", str(tmp_path / "m")], capsys,
                  code=1)
    assert line == f"memrl model: error: --corpus file {tmp_path / 'none.txt'} does not exist"


# ------------------------------------------------ item 20: a reused context demo with damaged files


_TOY = ["threads=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1"]


def _finished_context_demo(src: Path, out: Path) -> None:
    """The files `sft_from` reads of a finished fold demo, matching this run's config (no training needed)."""
    from memrl.config import to_yaml
    from memrl.recipes.context import RECIPE

    run = load_recipe(RECIPE, ["method=fold", *_TOY], out)
    cfg, tcfg = run.cfg, run.tcfg
    (src / "sft").mkdir(parents=True)
    (src / "sft" / "model.safetensors").write_bytes(b"")
    (src / "rl").mkdir()
    (src / "rl" / "config.yaml").write_text(to_yaml(tcfg))
    (src / "demo_config.yaml").write_text(to_yaml(cfg))
    (src / "results.json").write_text(json.dumps({
        "facts": {"budget": {"max_context_tokens": 100}, "cold_start": {}}, "num_parameters": 1,
        "losses": {"copy_warmup": [], "sft": []}, "summary": []}))


@pytest.mark.parametrize(("name", "text", "said"), [
    ("demo_config.yaml", "seed: [1\n", "demo_config.yaml is damaged (while parsing a flow sequence)"),
    ("demo_config.yaml", "- a\n- b\n", "demo_config.yaml is damaged (it holds a ListConfig, not a mapping)"),
    ("demo_config.yaml", "seed: abc\n", "demo_config.yaml is damaged (Value 'abc' of type 'str' could not be "
                                        "converted to Integer)"),
    ("results.json", '{"budget": {', "results.json is damaged (Expecting property name enclosed in double quotes: "
                                     "line 1 column 13 (char 12))"),
    ("results.json", '{"facts": {"budget": {}}}', "results.json is damaged (it has no facts.budget.max_context_tokens)"),
    ("results.json", "[]", "results.json is damaged (it holds a list, not a mapping)"),
    ("rl/config.yaml", "workflow: 3\n", "rl/config.yaml is damaged (it has no workflow section)"),
])
def test_demo_reusing_a_damaged_cold_start_is_one_line(name, text, said, tmp_path, capsys):
    # before: a YAML / JSON / KeyError traceback from inside reused_cold_start
    src, out = tmp_path / "fold", tmp_path / "ablation"
    _finished_context_demo(src, out)
    (src / name).write_text(text)
    line = _fails(["demo", "--agent", "context", "--out", str(out), "method=fold_no_process", f"sft_from={src}",
                   *_TOY], capsys)
    assert line == f"memrl demo: error: sft_from={src}: {said}; rerun that demo or drop sft_from"


def test_demo_reusing_a_cold_start_without_its_demo_config_names_it(tmp_path, capsys):
    src, out = tmp_path / "fold", tmp_path / "ablation"
    _finished_context_demo(src, out)
    (src / "demo_config.yaml").unlink()
    line = _fails(["demo", "--agent", "context", "--out", str(out), "method=fold_no_process", f"sft_from={src}",
                   *_TOY], capsys)
    assert line == f"memrl demo: error: sft_from={src}: demo_config.yaml is missing (not a finished context demo)"


# ------------------------------------------------------------------------ item 22: misleading messages


def test_summarize_without_a_retriever_names_its_workflow_before_the_model_loads(tmp_path, capsys):
    # before: "memact needs a retriever" from the first search of the first step
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}", "workflow=summarize"],
                  capsys)
    assert line == ("memrl train: error: workflow=summarize needs a retriever: set workflow.retriever_url, "
                    "workflow.retriever_corpus (with retriever_kind bm25 or keyword), or workflow.retriever_scope=task "
                    "(each task searches its own documents)")
    line = _fails(["eval", str(_eval_file(tmp_path)), "--model", str(tmp_path / "no_model"), "--out",
                   str(tmp_path / "ev"), "workflow=mem1"], capsys)
    assert line.startswith("memrl eval: error: workflow=mem1 needs a retriever: set workflow.retriever_url")


@pytest.mark.parametrize("command", ["stats", "build"])
def test_a_file_given_as_tokenizer_is_named_as_a_file(command, tmp_path, tiny_model, capsys):
    # before: huggingface_hub's "Repo id must be in the form 'repo_name' or 'namespace/repo_name'"
    tok = f"{tiny_model}/tokenizer.json"
    argv = (["data", "stats", "--tokenizer", tok, str(_eval_file(tmp_path))] if command == "stats" else
            ["data", "build", "--kind", "ruler", "--lengths", "8k", "--tokenizer", tok, "--out", str(tmp_path / "r")])
    line = _fails(argv, capsys, code=1)
    assert line == (f"memrl data: error: --tokenizer {tok} is a file; give the directory that holds it (a HuggingFace "
                    "tokenizer or model directory)")


@pytest.mark.parametrize(("agent", "ov", "said"), [
    ("context", "model.hidden_size=30", "model.hidden_size=30 is not a multiple of model.num_heads=4 (each head gets "
                                        "hidden_size / num_heads dimensions)"),
    ("infmem", "model.num_kv_heads=3", "model.num_heads=4 is not a multiple of model.num_kv_heads=3 (each key/value "
                                       "head serves num_heads / num_kv_heads query heads)"),
    ("memagent", "hidden_size=30", "hidden_size=30 is not a multiple of num_heads=4 (each head gets hidden_size / "
                                   "num_heads dimensions)"),
])
def test_a_demo_model_shape_that_cannot_be_built_is_named(agent, ov, said, tmp_path, capsys):
    # before: a matrix-size error from the first forward pass, after the data and tokenizer were built
    line = _fails(["demo", "--agent", agent, "--out", str(tmp_path / "d"), ov], capsys)
    assert line == f"memrl demo: error: {said}"


@pytest.mark.parametrize(("installed", "local"), [
    (True, "sqlite:///<out_dir>/mlflow.db, or a directory path"),
    (False, "a directory path; sqlite:/// would need sqlalchemy, which is not installed"),
])
def test_the_mlflow_scheme_message_recommends_only_a_store_this_install_has(installed, local, monkeypatch):
    # before: sqlite was recommended also where its check then refused it (no sqlalchemy)
    import importlib.util

    from memrl.training.monitor import trackers

    real = importlib.util.find_spec
    monkeypatch.setattr(trackers.importlib.util, "find_spec",
                        lambda name, *a: (object() if installed else None) if name == "sqlalchemy" else real(name, *a))
    assert trackers.mlflow_uri_problem("nosuch://x") == (
        "scheme 'nosuch' is not a tracking store mlflow serves (file, sqlite, postgresql, mysql, mssql, http, https, "
        f"databricks; a local one: {local})")
    if not installed:
        assert trackers.mlflow_uri_problem("sqlite:///x.db").startswith("mlflow's database stores need sqlalchemy")


def test_serve_names_a_corpus_that_is_a_device(capsys):
    # before: `--corpus /dev/zero` "does not exist"
    line = _fails(["serve", "retrieval", "--corpus", "/dev/zero"], capsys, code=1)
    assert line == ("memrl serve: error: corpus file /dev/zero is not a regular file (a device or pipe) (expected a "
                    "corpus JSONL: memrl data corpus)")


# ------------------------------------------------------------------ item 17: a lone surrogate in a preset file


@pytest.mark.parametrize(("yaml_text", "key", "where"), [
    ('workflow:\n  memory_template: "a \\ud800 b {chunk}"\n', "workflow.memory_template", "character 2 of its value"),
    ('workflow:\n  name: memagent\n  "x\\udfff": 1\n', "workflow.x\\udfff", "character 1 of its key"),
    ('trainer:\n  loggers: [jsonl, "\\ud83d"]\n', "trainer.loggers[1]", "character 0 of its value"),
])
def test_a_lone_surrogate_in_a_preset_is_refused_like_in_an_override(yaml_text, key, where, tmp_path, capsys):
    # before: the preset passed the config check and the rollout died on the template mid-run
    preset = tmp_path / "p.yaml"
    preset.write_text(yaml_text)
    line = _fails(["train", "--preset", str(preset), f"model.path={tmp_path / 'no_model'}",
                   f"out_dir={tmp_path / 'out'}"], capsys)
    code = next(c for c in yaml_text.split("\\u")[1:])[:4]
    assert line == (f"memrl train: error: {key} (set by preset {preset}) holds a lone surrogate \\u{code} at {where} "
                    "(not valid Unicode text)")


def test_a_lone_surrogate_in_an_override_is_refused_by_the_same_check(tmp_path, capsys):
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
                   'workflow.memory_template="a \\ud800 b"'], capsys)
    assert line == ("memrl train: error: workflow.memory_template (set by an override) holds a lone surrogate \\ud800 "
                    "at character 2 of its value (not valid Unicode text)")


# ------------------------------------------------- item 19: more CPUs than a local Ray can have


def test_sequence_parallel_asking_for_more_cpus_than_ray_has_is_one_line_before_ray_starts(tmp_path, tiny_model,
                                                                                          capsys, monkeypatch):
    # before: a PlacementError traceback from check_resources, after Ray had started
    import ray

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: pytest.fail("Ray started before the refusal"))
    line = _fails(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'out'}", "trainer.num_workers=4",
                   "trainer.sequence_parallel=4", "rollout.num_engines=1", "ray.num_cpus=2"], capsys, code=1)
    assert line == (
        "memrl train: error: trainer.num_workers=4 x 1 CPUs + rollout.num_engines=1 x 1 CPUs asks for 5 CPUs "
        "(trainer.sequence_parallel=4 needs trainer.num_workers >= 4), but a Ray started here has 2; lower "
        "trainer.cpus_per_worker / rollout.cpus_per_engine, set ray.num_cpus to share cores, or join a cluster "
        "(ray.address)")


def test_a_cluster_too_small_is_one_line_too(capsys, monkeypatch):
    # a joined cluster is measured after joining (check_resources): its PlacementError is a UserError now
    from memrl.config import load_config
    from memrl.errors import UserError
    from memrl.training.config import TrainConfig
    from memrl.training.ranks.placement import PlacementError, check_resources

    cfg = load_config(TrainConfig, ["model.path=x", "trainer.num_workers=2", "rollout.num_engines=1"])
    with pytest.raises(PlacementError) as e:
        check_resources(cfg, {"CPU": 2.0})
    assert isinstance(e.value, UserError) and isinstance(e.value, RuntimeError)
    assert str(e.value).endswith("asks for 3 CPUs, but the Ray cluster has 2")


# ------------------------------------------------------------ item 12: idle and slow connections to `memrl view`


def test_idle_and_slow_connections_do_not_block_the_viewer(tmp_path, monkeypatch):
    # before: 16 idle connections (or 500 slow ones) took every thread of the pool and held it until they
    # closed: the next visitor waited forever. Now each connection has its own thread and a bounded time.
    import socket
    import time
    import urllib.request

    from memrl.viewer import server as S

    monkeypatch.setattr(S, "IDLE_TIMEOUT_S", 1.0)
    monkeypatch.setattr(S, "CONNECTION_DEADLINE_S", 2.0)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.5}\n')
    srv = S.make_server([str(tmp_path)], "127.0.0.1", 0)
    S.serve_in_thread(srv)
    port = srv.server_address[1]
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]  # the old pool had 16 threads
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(40)]
    try:
        for c in slow:  # a request line that never ends, a byte at a time
            c.sendall(b"GET /api/runs HTTP/1.0\r\nX-Slow: ")
        t0 = time.monotonic()
        with urllib.request.urlopen(S.url_of(srv) + "api/runs", timeout=5) as r:
            assert r.status == 200 and json.loads(r.read())[0]["kind"] == "train"
        assert time.monotonic() - t0 < 1.0  # served at once, not after the others gave up
        for c in slow:
            c.sendall(b"x")
        # the idle ones are cut after IDLE_TIMEOUT_S, the slow ones (still sending) after CONNECTION_DEADLINE_S
        for c in idle + slow:
            c.settimeout(5)
            data = b""
            while chunk := c.recv(65536):
                data += chunk
            assert data == b""  # closed without an answer
        assert time.monotonic() - t0 < 4.5
    finally:
        for c in idle + slow:
            c.close()
        srv.shutdown()
        srv.server_close()
