"""engine.openai.api=chat against a real chat-only server on 127.0.0.1 (CompletionServer in tests/doubles.py in
chat mode, serving the tiny model through an in-process HFEngine): `memrl eval` runs end to end and gives
exactly the answers of the same model run in process; `memrl train` refuses chat mode before any request."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data.io import write_records

RECORDS = [{"input": f"What is key{i}?", "answers": ["v0"],
            "context": f"Document 1: key{i} is v{i}. Document 2: the river runs north of town {i}.",
            "index": i, "num_docs": 2} for i in range(3)]
WORKFLOW = ["workflow=memagent", "workflow.chunk_tokens=12", "workflow.max_memory_tokens=6",
            "workflow.max_final_tokens=6", "concurrency=1", "--no-progress"]


@pytest.fixture(scope="module")
def tiny_model() -> str:
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def rows(out: Path) -> list[tuple[str, str, list[str]]]:
    from memrl.eval.runner import read_results

    return [(r["task_id"], r["prediction"], [s["info"].get("memory", "") for s in r["steps"]])
            for r in sorted(read_results(out / "results.jsonl"), key=lambda r: r["task_id"])]


@pytest.mark.parametrize("token_ids", [True, False], ids=["vllm-token-ids", "text-only"])
def test_eval_through_chat_endpoint_matches_in_process(token_ids, tiny_model, tmp_path, capsys):
    from doubles import CompletionServer

    from memrl.engines.hf import HFEngine

    data = tmp_path / "eval_2.json"
    write_records(data, RECORDS)
    local = tmp_path / "local"
    assert main(["eval", str(data), "--out", str(local), "--model", tiny_model, "engine.hf.deterministic=true",
                 *WORKFLOW]) == 0
    with CompletionServer(HFEngine(tiny_model, deterministic=True, seed=None), api="chat", chat_token_ids=token_ids) as srv:
        chat = tmp_path / "chat"
        assert main(["eval", str(data), "--out", str(chat), "--model", tiny_model, "engine=openai",
                     f"engine.openai.base_url={srv.url}", "engine.openai.api=chat", *WORKFLOW]) == 0
        # the completions endpoint is absent, as on MemAgent's server
        with pytest.raises(Exception, match="HTTP 404.*engine.openai.api=chat"):
            import asyncio

            from memrl.engines.openai_http import OpenAIEngine

            asyncio.run(OpenAIEngine(base_url=srv.url, tokenizer=None).generate([1, 2], _greedy()))
    capsys.readouterr()
    got, want = rows(chat), rows(local)
    assert got == want and len(got) == 3
    assert sum(1 for _, _, mems in got for m in mems if m) >= 3  # real generated memories were compared
    # Each task: context chunks of 12 tokens, one memory call per chunk, then the final call; the server saw
    # every one of them, rendered from the messages with the same chat template memrl renders locally.
    calls = [e for e in srv.events if e[0] == "chat"]
    local_rows = [json.loads(x) for x in (local / "results.jsonl").read_text().splitlines()]
    assert len(calls) == sum(len(r["steps"]) for r in local_rows)


def _greedy():  # noqa: ANN202
    from memrl.engines.base import SamplingParams

    return SamplingParams(temperature=0, max_tokens=2)


def test_chat_engine_returns_server_ids_and_logprobs_or_marks_them_unavailable(tiny_model):
    """Through the chat server the completion equals the in-process engine's (ids and logprobs) when the
    server returns ids; with text only, the ids are the re-tokenized text and logprobs are marked unavailable."""
    import asyncio

    from doubles import CompletionServer
    from transformers import AutoTokenizer

    from memrl.engines.base import SamplingParams
    from memrl.engines.hf import HFEngine
    from memrl.engines.openai_http import OpenAIEngine
    from memrl.workflows.templates import chat_prompt

    tok = AutoTokenizer.from_pretrained(tiny_model)
    _, prompt = chat_prompt(tok, "What is the capital of the village?")
    sp = SamplingParams(temperature=0, max_tokens=8)
    direct = asyncio.run(HFEngine(tiny_model, deterministic=True, seed=None).generate(list(prompt), sp))
    for token_ids in (True, False):
        with CompletionServer(HFEngine(tiny_model, deterministic=True, seed=None), api="chat", chat_token_ids=token_ids) as srv:
            eng = OpenAIEngine(base_url=srv.url, tokenizer=tok, api="chat")
            out = asyncio.run(eng.generate(prompt, sp))
            asyncio.run(eng.close())
        assert srv.events[0][1] == list(prompt)  # the server's rendering of the message = memrl's prompt ids
        if token_ids:
            assert (out.token_ids, out.logprobs, out.finish_reason) == (direct.token_ids, direct.logprobs,
                                                                        direct.finish_reason)
            assert out.info == {"token_ids": "server", "logprobs": "server"}
        else:
            shown = direct.token_ids[:-1] if direct.finish_reason == "stop" else direct.token_ids
            text = tok.decode(shown, skip_special_tokens=True)
            assert out.token_ids == tok.encode(text, add_special_tokens=False)
            assert out.logprobs == [0.0] * len(out.token_ids) and out.info["logprobs"] == "unavailable"


def test_training_refuses_chat_mode_before_any_request(tiny_model, tmp_path, capsys):
    from doubles import CompletionServer

    from memrl.engines.hf import HFEngine

    with CompletionServer(HFEngine(tiny_model, deterministic=False, seed=None), api="chat") as srv:
        capsys.readouterr()  # the server's own model loading
        code = main(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'run'}", "trainer.steps=1",
                     "engine=openai", f"engine.openai.base_url={srv.url}", "engine.openai.api=chat"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err == ("memrl train: error: engine.openai.api=chat cannot train: RL needs the generated token ids and "
                   "their sampling logprobs for the exact prompt tokens, and /v1/chat/completions renders its own "
                   "prompt and returns ids and logprobs only as optional extras; serve /v1/completions and set "
                   "engine.openai.api=completions")
    assert srv.events == []
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_chat_asks_the_server_for_its_one_model(tiny_model, tmp_path, capsys):
    """A vLLM 0.7-era chat server (MemAgent's serve/llm070.py) requires `model` in every chat request: with
    engine.openai.served_model unset, memrl asks GET /v1/models once and sends its only model; a server
    listing several is one line naming the setting, before any chat request."""
    from doubles import CompletionServer

    from memrl.engines.hf import HFEngine

    data = tmp_path / "eval_2.json"
    write_records(data, RECORDS)
    local = tmp_path / "local"
    assert main(["eval", str(data), "--out", str(local), "--model", tiny_model, "engine.hf.deterministic=true",
                 *WORKFLOW]) == 0
    with CompletionServer(HFEngine(tiny_model, deterministic=True, seed=None), api="chat",
                          served_models=["llm070"]) as srv:
        assert main(["eval", str(data), "--out", str(tmp_path / "one"), "--model", tiny_model, "engine=openai",
                     f"engine.openai.base_url={srv.url}", "engine.openai.api=chat", *WORKFLOW]) == 0
        # asked once; then every chat request named the model (the server refuses one that does not)
        assert [e for e in srv.events if e[0] == "models"] == [("models",)]
        assert sum(e[0] == "chat" for e in srv.events) == len(srv.events) - 1 > 0
    assert rows(tmp_path / "one") == rows(local)
    capsys.readouterr()
    with CompletionServer(HFEngine(tiny_model, deterministic=True, seed=None), api="chat",
                          served_models=["a", "b"]) as srv:
        code = main(["eval", str(data), "--out", str(tmp_path / "two"), "--model", tiny_model, "engine=openai",
                     f"engine.openai.base_url={srv.url}", "engine.openai.api=chat", *WORKFLOW])
        assert [e[0] for e in srv.events] == ["models"]
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1
    assert err[0].endswith(f"{srv.url}/v1/models serves 2 models (a, b); set engine.openai.served_model to the one "
                           "to evaluate")
