"""Issue 48: hostile and careless input on the surfaces added since round two (the OpenAI chat engine,
checkpoint conversion, the RULER builder, trackers, validation): each probe is one line naming the
option / file / row / field / endpoint (exit 2 for a command-line value, 1 otherwise), no traceback, and
nothing half-written."""

from __future__ import annotations

import json

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
    assert err.splitlines()[-1] == (
        f"memrl eval: error: workflow memagent failed on task 0 sample 0: model {model}: produced a non-finite "
        "log-probability (nan) at generated token 0; its weights hold NaN or inf (a diverged update, a damaged file)")
