"""Issue 48: hostile and careless input on the surfaces added since round two (the OpenAI chat engine,
checkpoint conversion, the RULER builder, trackers, validation): each probe is one line naming the
option / file / row / field / endpoint (exit 2 for a command-line value, 1 otherwise), no traceback, and
nothing half-written."""

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


# ------------------------------------------------------------------- item 9: flags a --kind does not read


@pytest.mark.parametrize(("extra", "said"), [
    (["--kind", "ruler", "--num-questions", "4"],
     "--num-questions is not used by --kind ruler; it reads --samples (rows per task and length)"),
    (["--kind", "ruler", "--docs", "50"], "--docs is not used by --kind ruler; it reads --lengths (target lengths in tokens)"),
    (["--kind", "ruler", "--source", "h.json"],
     "--source is not used by --kind ruler; it reads --qa-source (qa tasks) and --haystack (essay haystacks)"),
    (["--source", "h.json", "--samples", "3"], "--samples is not used by --kind auto (eval sets); it reads --num-questions"),
    (["--source", "h.json", "--lengths", "8k"], "--lengths is not used by --kind auto (eval sets); it reads --docs "
                                                "(document counts)"),
    (["--kind", "multiobjective", "--source", "h.json", "--haystack", "e.txt"],
     "--haystack is not used by --kind multiobjective (only by --kind ruler)"),
    (["--kind", "hotpotqa", "--source", "h.json", "--sub-questions", "2"],
     "--sub-questions is not used by --kind hotpotqa (eval sets) (only by --kind multiobjective)"),
])
def test_data_build_refuses_an_option_its_kind_would_ignore(extra, said, tmp_path, capsys):
    # before: `--kind ruler --num-questions 4` built 100 rows per task (the builder reads --samples)
    line = _fails(["data", "build", "--out", str(tmp_path / "out"), *extra], capsys)
    assert line == f"memrl data: error: {said}"
    assert not (tmp_path / "out").exists()


def test_serve_retrieval_refuses_dense_options_for_bm25(tmp_path, capsys):
    line = _fails(["serve", "retrieval", "--corpus", str(tmp_path / "c.jsonl"), "--model", "m"], capsys)
    assert line == "memrl serve: error: --model is not used by --retriever bm25 (only by --retriever dense)"


def test_serve_help_lists_only_services_that_exist(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    serve = next(ln for ln in out.splitlines() if ln.strip().startswith("serve"))
    assert "judge" not in serve and "retrieval" in serve


# ----------------------------------------------------------- item 2: an OpenAI-compatible server's garbage


def _garbage_chat(body: dict) -> dict:
    """A chat reply whose ids cannot be tokens (huge, negative) and whose logprob is positive."""
    return {"choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"},
                         "token_ids": [10**20, -5], "logprobs": {"content": [{"token": "token_id:1", "logprob": 3.0}]}}]}


@pytest.mark.parametrize("mode", ["error", "drop"])
def test_eval_against_a_server_answering_garbage(mode, tmp_path, tiny_model, capsys):
    # before: a traceback from the tokenizer ("number too small to fit in target type")
    from doubles import JsonServer

    from memrl.data.io import write_records

    srv = JsonServer(_garbage_chat)
    try:
        data = tmp_path / "eval_1.json"
        write_records(data, [{"input": "q0", "answers": ["v0"], "context": "Document 1: x", "index": 0, "num_docs": 1}])
        argv = ["eval", str(data), "--out", str(tmp_path / "ev"), "--model", tiny_model, "engine=openai",
                "engine.openai.api=chat", f"engine.openai.base_url={srv.url}", "engine.openai.served_model=m",
                "engine.openai.max_retries=1", "engine.openai.backoff_s=0", f"failed_requests={mode}",
                "workflow.chunk_tokens=64", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2",
                "--no-progress"]
        rc = main(argv)
    finally:
        srv.stop()
    err = capsys.readouterr().err
    assert "Traceback" not in err
    why = (f"{srv.url}/v1/chat/completions: malformed chat reply: token id 0 is 100000000000000000000, outside the "
           "vocabulary [0, 4096) (gave up after 2 attempts)")
    if mode == "error":
        assert rc == 1
        assert err.splitlines()[-1] == f"memrl eval: error: workflow memagent failed on task 0 sample 0: {why}"
    else:  # dropped, logged with its reason and counted
        assert rc == 0 and not (tmp_path / "ev" / "results.jsonl").read_text().strip()


# ----------------------------------------------------------- item 4: sizes that would exhaust the machine


@pytest.mark.parametrize(("ov", "said"), [
    (["algorithm.n=100000000"], "algorithm.n=100000000 is not allowed: must be in [1, 4096] (a bound: a task's n "
                                "trajectories are held in memory together)"),
    (["data.synthetic.num_chunks=100000000"], "data.synthetic.num_chunks=100000000 is not allowed: must be in "
                                              "[1, 1048576] (a bound: each document is built in memory)"),
    (["data.synthetic.num_chunks=100000", "data.synthetic.chunk_words=10000"],
     "SyntheticConfig: num_chunks x chunk_words = 1000000000 words per document is more than 67108864: a bound: "
     "each document is built in memory"),
])
def test_train_sizes_have_declared_upper_bounds(ov, said, tmp_path, capsys):
    # before: accepted, then MemoryError
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}", *ov], capsys)
    assert line == f"memrl train: error: {said}"


def test_ruler_lengths_have_a_declared_upper_bound(tmp_path, tiny_model, capsys):
    line = _fails(["data", "build", "--kind", "ruler", "--lengths", "8k,99999999m", "--tokenizer", tiny_model,
                   "--out", str(tmp_path / "r")], capsys, code=1)
    assert line == ("memrl data: error: --lengths: '99999999m' is more than 32m tokens: each row's context is built "
                    "and tokenized in memory")
    assert not (tmp_path / "r").exists()


# --------------------------------------------------------------- item 3: text that is not valid Unicode


def _surrogate_file(tmp_path):
    """eval_1.json whose row 1 holds a lone surrogate in its context (a JSON \\ud800 escape)."""
    path = tmp_path / "eval_1.json"
    rows = [{"input": f"q{i}", "answers": [f"v{i}"], "context": "Document 1: x", "index": i, "num_docs": 1}
            for i in range(3)]
    text = json.dumps(rows).replace('"Document 1: x", "index": 1', '"Document 1: x\\ud800y", "index": 1')
    path.write_text(text, encoding="utf-8")
    return path


def test_lone_surrogate_in_a_data_row_is_refused_at_load(tmp_path, tiny_model, capsys):
    # before: `data show` died in print() with UnicodeEncodeError; eval / train in the tokenizer
    path = _surrogate_file(tmp_path)
    msg = f"{path}: row 1: field 'context' holds a lone surrogate \\ud800 (not valid Unicode text) at character 13"
    assert _fails(["data", "show", str(path), "--rows", "3"], capsys, code=1) == f"memrl data: error: {msg}"
    assert _fails(["eval", str(path), "--out", str(tmp_path / "ev"), "--model", tiny_model, "--no-progress"],
                  capsys, code=1) == f"memrl eval: error: {msg}"
    assert not (tmp_path / "ev" / "results.jsonl").exists()
    # --skip-bad: skipped and counted
    assert main(["data", "show", str(path), "--rows", "3", "--skip-bad"]) == 0
    out = capsys.readouterr().out
    assert f"read 3 rows, 1 rejected (first: {msg})" in out


def test_corpus_with_bytes_that_are_not_utf8_names_the_line(tmp_path, capsys):
    from memrl.data.corpus import load_corpus
    from memrl.data.errors import DataError

    corpus = tmp_path / "corpus_nonutf8.jsonl"
    corpus.write_bytes(b'{"id": "a", "title": "t", "text": "fine"}\n{"id": "b", "title": "t", "text": "bad \xff"}\n')
    with pytest.raises(DataError, match=rf"^{corpus}: line 2: a byte that is not UTF-8 \(0xff\) at character 39$"):
        load_corpus(corpus)
    surrogate = tmp_path / "corpus_surrogate.jsonl"
    surrogate.write_text('{"id": "a", "title": "t\\udc00", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"^{surrogate}: line 1: field 'title' holds a lone surrogate \\udc00"):
        load_corpus(surrogate)


def test_ruler_haystack_that_is_not_utf8_names_file_and_line(tmp_path, tiny_model, capsys):
    hay = tmp_path / "binary.txt"
    hay.write_bytes(b"some essay text\nmore\x80\x81 text\n")
    line = _fails(["data", "build", "--kind", "ruler", "--tasks", "niah_single_2", "--lengths", "1k", "--samples", "1",
                   "--tokenizer", tiny_model, "--haystack", str(hay), "--out", str(tmp_path / "r")], capsys, code=1)
    assert line == (f"memrl data: error: --haystack {hay}: line 2: a byte that is not UTF-8 (0x80) at byte 20; "
                    "expected UTF-8 text")


# ------------------------------------------------------ item 1: a model that produces non-finite logprobs


def test_eval_of_a_model_with_nan_weights_is_one_line_naming_the_model(tmp_path, tiny_model, capsys):
    # before: a RolloutError traceback ("response_logprobs must be finite and <= 0") deep in a rollout
    import shutil

    from safetensors.torch import load_file, save_file

    from memrl.data.io import write_records

    model = tmp_path / "nan_model"
    shutil.copytree(tiny_model, model)
    weights = next(model.glob("*.safetensors"))
    state = load_file(weights)
    for v in state.values():
        v.fill_(float("nan"))
    save_file(state, weights, metadata={"format": "pt"})
    data = tmp_path / "eval_1.json"
    write_records(data, [{"input": "q0", "answers": ["v0"], "context": "Document 1: x", "index": 0, "num_docs": 1}])
    assert main(["eval", str(data), "--out", str(tmp_path / "ev"), "--model", str(model), "workflow.chunk_tokens=64",
                 "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    # issue 63 item 13: refused when the engine loads it, before any generation (the engine's own check, a
    # non-finite logprob, stays for weights that go bad in a run)
    assert err.splitlines()[-1] == (
        f"memrl eval: error: engine.model={model}: weight model.embed_tokens.weight holds 786432 NaN or infinite "
        "value(s) of 786432 (a diverged or damaged checkpoint); refusing to generate from it")


# ------------------------------------------- items 5, 4, 6: checkpoint conversion on damaged input, full disk


@pytest.fixture(scope="module")
def megatron_src(tmp_path_factory):
    """(a Qwen2 model directory, a Megatron torch_dist iter_* directory holding it)."""
    from doubles import make_model, megatron_state, write_dcp

    root = tmp_path_factory.mktemp("megatron")
    model = make_model(root / "qwen2", "qwen2")
    return model, write_dcp(megatron_state(model, True, pad_vocab=0), root / "iter_0000001")


def _copy_iter(megatron_src, tmp_path):
    import shutil

    return shutil.copytree(megatron_src[1], tmp_path / "iter_0000001")


def _nothing_left(out) -> None:
    """No model and no staging directory beside it."""
    assert not out.exists()
    assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")]


def _damage(kind: str, it, model, tmp_path) -> tuple[list[str], str]:
    """Damage a copy of the checkpoint; (extra convert arguments, the error line expected)."""
    shard = it / "__0_0.distcp"
    data = shard.read_bytes()
    if kind == "cut_shard":
        shard.write_bytes(data[: len(data) // 2])
        return [], (f"{shard}: cut short: {len(data) // 2} bytes, but the metadata places embedding.word_embeddings."
                    f"weight at bytes 2586..593987")
    if kind == "missing_shard":
        shard.unlink()
        return [], (f"{shard} is missing (a shard of this checkpoint: the metadata places 12 entries in it, e.g. "
                    "embedding.word_embeddings.weight)")
    if kind == "garbled_shard":  # the same length, the tensor records overwritten
        shard.write_bytes(data[:2586] + b"\0" * (len(data) - 2586))
        return [], (f"{it}: cannot read the tensor data, a damaged .distcp file? (UnpicklingError: Unsupported operand 0)")
    if kind == "unknown_arch":
        import shutil

        cfg_dir = shutil.copytree(model, tmp_path / "cfg")
        cfg = json.loads((cfg_dir / "config.json").read_text())
        cfg["model_type"] = "nosuch_arch"
        (cfg_dir / "config.json").write_text(json.dumps(cfg))
        import transformers

        return ["--hf-config", str(cfg_dir)], (
            f"--hf-config={cfg_dir / 'config.json'}: model_type 'nosuch_arch' is not an architecture transformers "
            f"{transformers.__version__} knows (Qwen2 / Qwen3 checkpoints say 'qwen2' / 'qwen3')")
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["cut_shard", "missing_shard", "garbled_shard", "unknown_arch"])
def test_convert_of_a_damaged_megatron_checkpoint_is_one_line(kind, megatron_src, tmp_path, capsys):
    # before: tracebacks: CheckpointException / EOFError (cut or garbled .distcp), FileNotFoundError
    # (__0_0.distcp), transformers' ValueError about model type nosuch_arch
    model, _ = megatron_src
    it = _copy_iter(megatron_src, tmp_path)
    extra, said = _damage(kind, it, model, tmp_path)
    out = tmp_path / "hf"
    hf = extra or ["--hf-config", str(model)]
    assert _fails(["model", "convert", str(it), "--out", str(out), *hf], capsys, code=1) == f"memrl model: error: {said}"
    _nothing_left(out)


def test_convert_of_a_truncated_verl_rank_file_is_one_line(megatron_src, tmp_path, capsys):
    import shutil

    import torch

    actor = tmp_path / "global_step_1" / "actor"
    actor.mkdir(parents=True)
    shutil.copytree(megatron_src[0], actor / "huggingface", ignore=shutil.ignore_patterns("*.safetensors"))
    rank = actor / "model_world_size_1_rank_0.pt"
    torch.save({"model.norm.weight": torch.ones(36)}, rank)
    rank.write_bytes(rank.read_bytes()[:300])
    out = tmp_path / "hf"
    assert _fails(["model", "convert", str(actor.parent), "--out", str(out)], capsys, code=1) == (
        f"memrl model: error: {rank}: not a readable torch file, truncated or damaged? (RuntimeError: "
        "PytorchStreamReader failed reading zip archive: failed finding central directory)")
    _nothing_left(out)


def _declare(it, key: str, size: tuple[int, ...]) -> None:
    """Rewrite the checkpoint's .metadata so that tensor `key` (one chunk) declares shape `size`."""
    import pickle

    import torch

    md = pickle.loads((it / ".metadata").read_bytes())
    tm = md.state_dict_metadata[key]
    tm.size = torch.Size(size)
    tm.chunks[0].sizes = torch.Size(size)
    (it / ".metadata").write_bytes(pickle.dumps(md))


def test_convert_checks_declared_shapes_against_the_config(megatron_src, tmp_path, capsys):
    # before: the declared shapes were allocated first (torch.empty), then read
    model, _ = megatron_src
    it = _copy_iter(megatron_src, tmp_path)
    _declare(it, "decoder.layers.mlp.linear_fc2.weight", (2, 36, 2**40))
    out = tmp_path / "hf"
    assert _fails(["model", "convert", str(it), "--out", str(out), "--hf-config", str(model)], capsys, code=1) == (
        f"memrl model: error: {it}: decoder.layers.mlp.linear_fc2.weight: declared shape (2, 36, {2**40}), the config "
        "gives (2, 36, 71) (num_hidden_layers 2 stacked; hidden_size x intermediate_size)")
    _nothing_left(out)


def test_convert_checks_a_declared_huge_tensor_against_the_file_sizes(megatron_src, tmp_path, capsys, monkeypatch):
    # before: torch.empty((2**35, 36)) - 4.9 TB - for a config that declares the same vocabulary
    import shutil

    import torch

    model, _ = megatron_src
    it = _copy_iter(megatron_src, tmp_path)
    _declare(it, "embedding.word_embeddings.weight", (2**35, 36))
    cfg_dir = shutil.copytree(model, tmp_path / "cfg")
    cfg = json.loads((cfg_dir / "config.json").read_text())
    cfg["vocab_size"] = 2**35
    (cfg_dir / "config.json").write_text(json.dumps(cfg))
    allocated = []
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, **k: allocated.append(a) or real_empty(*a, **k))
    out = tmp_path / "hf"
    assert _fails(["model", "convert", str(it), "--out", str(out), "--hf-config", str(cfg_dir)], capsys, code=1) == (
        f"memrl model: error: {it / '.metadata'}: embedding.word_embeddings.weight: chunk 0 declares "
        f"{2**35 * 36 * 4} bytes ((34359738368, 36) x torch.float32), but its record in __0_0.distcp holds 591401")
    assert not [a for a in allocated if a and a[0] and a[0][0] == 2**35]
    _nothing_left(out)


@pytest.mark.parametrize("how", ["oserror", "safetensors"])
def test_convert_onto_a_full_disk_is_one_line_and_keeps_the_older_model(how, megatron_src, tmp_path, capsys,
                                                                        monkeypatch):
    # before: `SafetensorError: Error while serializing: I/O error: No space left on device (os error 28)` (seen on
    # a 400 KiB tmpfs) with a half-written model.safetensors left at --out; here the error is injected
    import errno

    from safetensors import SafetensorError
    from safetensors.torch import load_file

    import memrl.models.convert as conv

    model, it = megatron_src
    out = tmp_path / "hf"
    assert main(["model", "convert", str(it), "--out", str(out), "--hf-config", str(model)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_save = conv.save_file

    def full(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"\0" * 100)  # the part that fitted
        if how == "oserror":
            raise OSError(errno.ENOSPC, "No space left on device", filename)
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(conv, "save_file", full)
    for dest in (out, tmp_path / "fresh"):  # --force over the older model, and a new directory
        line = _fails(["model", "convert", str(it), "--out", str(dest), "--hf-config", str(model), "--force"], capsys,
                      code=1)
        assert line == (f"memrl model: error: --out {dest}: the disk is full (no space left on the device holding "
                        f"{tmp_path}); nothing was written to {dest}")
    _nothing_left(tmp_path / "fresh")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    monkeypatch.setattr(conv, "save_file", real_save)
    assert load_file(out / "model.safetensors")


@pytest.mark.parametrize("where", ["optimizer", "weights"])
def test_train_save_onto_a_full_disk_is_one_line_and_resume_continues(where, tiny_model, reference, tmp_path, capsys,
                                                                      monkeypatch):
    # before: `RuntimeError: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598` (DCP's optimizer
    # shards) or safetensors' SafetensorError, each a traceback (seen with out_dir on a 40 MiB tmpfs); here the
    # second checkpoint's save is made to fail the same way
    import torch
    import train_child  # noqa: F401 - registers memagent_parity
    from conftest import assert_same_weights, make_trainer, train_overrides
    from safetensors import SafetensorError

    import memrl.training.ranks.distributed as D
    import memrl.training.ranks.workers as W

    real_dcp, real_save, real_torch_save = D.save_optim_dcp, W.save_checkpoint, torch.save

    def dcp_full(model, opt, path):
        if ".step_000002" not in str(path):
            return real_dcp(model, opt, path)

        def short_write(obj, f, *a, **k):
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")

        monkeypatch.setattr(torch, "save", short_write)
        try:
            return real_dcp(model, opt, path)
        finally:
            monkeypatch.setattr(torch, "save", real_torch_save)

    class FullDisk:
        def __init__(self, model):
            self.model = model

        def save_pretrained(self, path, **kw):
            (Path(path) / "model.safetensors").write_bytes(b"\0" * 100)  # the part that fitted
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def save_full(root, step, model, *a, **k):
        return real_save(root, step, FullDisk(model) if step == 2 else model, *a, **k)

    if where == "optimizer":
        monkeypatch.setattr(D, "save_optim_dcp", dcp_full)
    else:
        monkeypatch.setattr(W, "save_checkpoint", save_full)
    out = tmp_path / "run"
    ckpts = out / "checkpoints"
    line = _fails(["train", *train_overrides(tiny_model, out)], capsys, code=1)
    assert line.startswith(f"memrl train: error: the disk is full: saving checkpoint step_000002 in {ckpts} failed (")
    assert line.endswith(f" MiB free); the previous checkpoint {ckpts / 'step_000001'} is intact; free space, then "
                         f"`memrl train --resume out_dir={out}` continues from it")
    assert sorted(p.name for p in ckpts.iterdir()) == ["latest", "step_000001"]
    assert (ckpts / "latest").read_text().strip() == "step_000001"
    monkeypatch.undo()
    trainer = make_trainer(tiny_model, out, resume=True)
    trainer.fit()
    assert_same_weights(reference[1], trainer.model.state_dict())


# ------------------------------------------------------------------------------------- item 7: trackers


def _tracked(tiny_model, out, *extra, steps: int = 1) -> list[str]:
    import train_child  # noqa: F401 - registers memagent_parity
    from conftest import train_overrides

    return ["train", *train_overrides(tiny_model, out, steps), *extra]


@pytest.mark.parametrize(("uri", "said"), [
    ("nosuch://x/y", "scheme 'nosuch' is not a tracking store mlflow serves (file, sqlite, postgresql, mysql, mssql, "
                     "http, https, databricks; a local one: {local})"),
    ("file:{tmp}/afile", "{tmp}/afile is a file; mlflow's file store is a directory of experiments"),
    ("{tmp}/afile/mlruns", "{tmp}/afile is a file; mlflow's file store is a directory of experiments"),
])
def test_mlflow_uri_is_checked_before_the_run(uri, said, tiny_model, tmp_path, capsys):
    # before: the model loaded, then mlflow's UnsupportedModelRegistryStoreURIException / NotADirectoryError
    # ('.../afile/.trash') as a traceback
    import importlib.util

    (tmp_path / "afile").write_text("x")
    local = ("sqlite:///<out_dir>/mlflow.db, or a directory path" if importlib.util.find_spec("sqlalchemy") else
             "a directory path; sqlite:/// would need sqlalchemy, which is not installed")  # issue 63 item 22
    uri, said = uri.format(tmp=tmp_path), said.format(tmp=tmp_path, local=local)
    line = _fails(_tracked(tiny_model, tmp_path / "run", "trainer.loggers=[jsonl,mlflow]", f"trainer.mlflow_uri={uri}"),
                  capsys)
    assert line == f"memrl train: error: trainer.mlflow_uri={uri}: {said}"
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_wandb_run_id_from_the_environment_is_checked_before_the_run(tiny_model, tmp_path, capsys, monkeypatch):
    # before: wandb's UsageError "Run ID cannot contain the characters: :;,#?/'" as a traceback, after the model loaded
    monkeypatch.setenv("WANDB_RUN_ID", "a/b:c;d#e?")
    line = _fails(_tracked(tiny_model, tmp_path / "run", "trainer.loggers=[jsonl,wandb]"), capsys)
    assert line == ("memrl train: error: WANDB_RUN_ID='a/b:c;d#e?' (wandb's run id, from the environment) is not a "
                    "wandb run id: it may not be empty or hold any of \":;,#?/\\\\'%\" or space (it holds '#/:;?')")


def test_damaged_mlflow_store_is_one_line_naming_the_file(tiny_model, tmp_path, capsys):
    # before: yaml's ParserError traceback from inside mlflow's file store
    store = tmp_path / "store"
    argv = ["trainer.loggers=[jsonl,mlflow]", f"trainer.mlflow_uri=file:{store}"]
    assert main(_tracked(tiny_model, tmp_path / "run1", *argv)) == 0
    meta = next(p for p in store.glob("*/meta.yaml") if p.parent.name not in ("0", ".trash"))
    meta.write_text("{{{ : [")
    capsys.readouterr()
    line = _fails(_tracked(tiny_model, tmp_path / "run2", *argv), capsys, code=1)
    assert line == (f"memrl train: error: trainer.mlflow_uri=file:{store}: mlflow cannot use the store (ParserError: "
                    f"while parsing a flow node (in {meta}, line 1))")
    assert not (tmp_path / "run2" / "checkpoints").exists()


def test_resume_whose_tracker_runs_are_gone_or_invalid_is_one_line(tiny_model, tmp_path, capsys):
    # before: MlflowException "Run '...' not found" / wandb's UsageError, each a traceback
    import shutil

    import torch

    out = tmp_path / "run"
    argv = ["trainer.loggers=[jsonl,mlflow]"]
    assert main(_tracked(tiny_model, out, *argv)) == 0
    state_file = out / "checkpoints" / "step_000001" / "trainer_state.pt"
    run_id = torch.load(state_file, weights_only=True)["trackers"]["mlflow"]
    shutil.rmtree(next((out / "mlruns").glob(f"*/{run_id}")))
    capsys.readouterr()
    line = _fails([*_tracked(tiny_model, out, *argv, steps=2), "--resume"], capsys, code=1)
    assert line == (f"memrl train: error: the mlflow store file:{out / 'mlruns'}: the mlflow run {run_id} this run's "
                    "checkpoint continues (trainer state trackers.mlflow) is not in the store; restore the store, or "
                    "resume without mlflow in trainer.loggers")
    state = torch.load(state_file, weights_only=True)
    state["trackers"] = {"wandb": "a/b:c;d#e?"}
    torch.save(state, state_file)
    line = _fails([*_tracked(tiny_model, out, "trainer.loggers=[jsonl,wandb]", steps=2), "--resume"], capsys, code=1)
    assert line == ("memrl train: error: the wandb run id 'a/b:c;d#e?' this run's checkpoint continues (trainer state "
                    "trackers.wandb) is not a wandb run id: it may not be empty or hold any of \":;,#?/\\\\'%\" or "
                    "space (it holds '#/:;?')")
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"


def test_a_tracker_failing_mid_run_is_logged_and_dropped(tiny_model, tmp_path, capsys, caplog, monkeypatch):
    # before: the run died with the tracker's exception at step 2
    import logging

    from memrl.training.monitor.metrics_log import read_metrics
    from memrl.training.monitor.trackers import MlflowTracker

    real_log = MlflowTracker.log
    calls = []

    def flaky(self, step, metrics):
        calls.append(step)
        if step == 2:
            raise OSError(28, "No space left on device")
        return real_log(self, step, metrics)

    monkeypatch.setattr(MlflowTracker, "log", flaky)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        assert main(_tracked(tiny_model, out, "trainer.loggers=[jsonl,mlflow]", steps=3)) == 0
    assert calls == [1, 2]  # dropped after its failure
    assert [r["step"] for r in read_metrics(out / "metrics.jsonl")] == [1, 2, 3]
    assert (f"tracker mlflow failed at step 2 (OSError: [Errno 28] No space left on device); dropped for the rest of "
            f"the run, {out / 'metrics.jsonl'} keeps every step") in [r.getMessage() for r in caplog.records]


def test_training_policy_turning_non_finite_names_the_step_and_keeps_the_checkpoint(tiny_model, tmp_path, capsys,
                                                                                    monkeypatch):
    # before: the eval-side EngineError inside a rollout, without the step or the model directory, and with the
    # engine calling the model only "(the policy being trained)"
    import torch
    from safetensors.torch import load_file

    from memrl.training.checkpoints.checkpoint import verify_checkpoint
    from memrl.training.trainer import Trainer

    real = Trainer.sample_and_score

    def poisoned(self):
        if self.step == 1:  # the update of step 1 "diverged": the weights step 2 samples with hold NaN (set
            # after the save here; in a real run checkpoint step_000001 holds them, which the message says - issue 63)
            with torch.no_grad():
                for p in self.model.parameters():
                    p.fill_(float("nan"))
        return real(self)

    monkeypatch.setattr(Trainer, "sample_and_score", poisoned)
    out = tmp_path / "run"
    ckpt = out / "checkpoints" / "step_000001"
    line = _fails(_tracked(tiny_model, out, steps=2), capsys, code=1)
    assert line.startswith(f"memrl train: error: step 2: the policy (model.path={tiny_model}, after 1 update(s) in "
                           "this run) produced a non-finite log-probability: workflow memagent_parity failed on task ")
    assert line.endswith("model (the policy being trained): produced a non-finite log-probability (nan) at generated "
                         "token 0; its weights hold NaN or inf (a diverged update, a damaged file); the last checkpoint "
                         f"{ckpt} holds these weights (saved after step 1's update); no earlier checkpoint is kept")
    assert sorted(p.name for p in ckpt.parent.iterdir()) == ["latest", "step_000001"]
    assert verify_checkpoint(ckpt)["step"] == 1
    assert all(torch.isfinite(v).all() for v in load_file(ckpt / "model.safetensors").values())
