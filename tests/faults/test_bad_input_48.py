"""Issue 48: hostile and careless input on the surfaces added since round two (the OpenAI chat engine,
checkpoint conversion, the RULER builder, trackers, validation): each probe is one line naming the
option / file / row / field / endpoint (exit 2 for a command-line value, 1 otherwise), no traceback, and
nothing half-written."""

from __future__ import annotations

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
