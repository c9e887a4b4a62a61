"""OpenAIEngine without vLLM: request body, reply parsing, and the errors for unreachable / broken servers.

A tiny local HTTP server (127.0.0.1, free port, bounded requests) stands in for vLLM.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from doubles import send_json

from memrl.engines.base import EngineError, SamplingParams
from memrl.engines.openai_http import OpenAIEngine, completion_request, parse_completion

GREEDY = SamplingParams(temperature=0, max_tokens=4)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def good_reply(ids: list[int], lps: list[float], finish: str = "length") -> dict:
    return {
        "choices": [
            {
                "token_ids": ids,
                "finish_reason": finish,
                "logprobs": {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": lps},
            }
        ]
    }


class FakeServer:
    """Answers POSTs with `reply(n, body) -> (status, bytes)`; n counts requests from 0."""

    def __init__(self, reply: Callable[[int, dict], tuple[int, bytes]]) -> None:
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                outer.bodies.append(body)
                send_json(self, *reply(len(outer.bodies) - 1, body))

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)

    def __enter__(self) -> FakeServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def serve() -> Iterator[Callable[[Callable[[int, dict], tuple[int, bytes]]], FakeServer]]:
    servers: list[FakeServer] = []

    def start(reply: Callable[[int, dict], tuple[int, bytes]]) -> FakeServer:
        servers.append(FakeServer(reply).__enter__())
        return servers[-1]

    yield start
    for s in servers:
        s.__exit__(None, None, None)


def engine(url: str, **kw: object) -> OpenAIEngine:
    kw = {"max_retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, "connect_timeout_s": 2.0, **kw}
    return OpenAIEngine(base_url=url, tokenizer=None, **kw)  # type: ignore[arg-type]


def run(coro):  # noqa: ANN001, ANN201
    return asyncio.run(coro)


def test_request_body_maps_sampling_params() -> None:
    body = completion_request([5, 6], SamplingParams(0.7, 0.9, 20, 8, (2, 3), 11), "m")
    assert body["prompt"] == [5, 6] and body["max_tokens"] == 8 and body["model"] == "m"
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (0.7, 0.9, 20, 11)
    assert body["stop_token_ids"] == [2, 3]
    assert body["logprobs"] == 1 and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    off = completion_request([5], SamplingParams(top_k=-1), None)
    assert "top_k" not in off and "seed" not in off and "stop_token_ids" not in off and "model" not in off


def test_parse_reads_token_ids_or_token_id_strings() -> None:
    c = parse_completion(good_reply([7, 8], [-0.1, -0.2], "stop"), "u")
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([7, 8], [-0.1, -0.2], "stop")
    reply = good_reply([7, 8], [-0.1, -0.2])
    del reply["choices"][0]["token_ids"]
    assert parse_completion(reply, "u").token_ids == [7, 8]


def test_generate_against_fake_server(serve) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (200, json.dumps(good_reply([9, 10], [-1.0, -2.0])).encode()))
    out = run(engine(srv.url + "/v1").generate([1, 2, 3], GREEDY))
    assert out.token_ids == [9, 10] and out.logprobs == [-1.0, -2.0]
    assert srv.bodies[0]["prompt"] == [1, 2, 3]


def test_unreachable_server_names_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(EngineError, match=rf"{url}/v1/completions: unreachable.*gave up after 3 attempts"):
        run(engine(url).generate([1, 2], GREEDY))


@pytest.mark.parametrize(
    "data, what",
    [
        (b"this is not json", "not JSON"),
        (b'{"choices": []}', "no choices"),
        (json.dumps({"choices": [{"finish_reason": "stop", "text": "hi"}]}).encode(), "token_logprobs missing"),
        (
            json.dumps({"choices": [{"finish_reason": "stop", "logprobs": {"tokens": ["hi"], "token_logprobs": [-1]}}]}).encode(),
            "no token ids",
        ),
        (json.dumps(good_reply([1, 2], [-1.0])).encode(), "2 token ids but 1 logprobs"),
        (json.dumps(good_reply([1], [-1.0], "weird")).encode(), "finish_reason 'weird'"),
    ],
)
def test_malformed_reply_is_a_clear_error(serve, data: bytes, what: str) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (200, data))
    with pytest.raises(EngineError, match=rf"{srv.url}/v1/completions: malformed completion reply: .*{what}"):
        run(engine(srv.url).generate([1], GREEDY))
    assert len(srv.bodies) == 1  # malformed data is not retried


def test_5xx_is_retried_then_succeeds(serve) -> None:  # noqa: ANN001
    def reply(n: int, body: dict) -> tuple[int, bytes]:
        return (503, b'{"error": "busy"}') if n < 2 else (200, json.dumps(good_reply([4], [-0.5], "stop")).encode())

    srv = serve(reply)
    assert run(engine(srv.url).generate([1], GREEDY)).token_ids == [4]
    assert len(srv.bodies) == 3


def test_5xx_gives_up_after_retries(serve) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (500, b'{"error": "boom"}'))
    with pytest.raises(EngineError, match="HTTP 500.*gave up after 3 attempts"):
        run(engine(srv.url).generate([1], GREEDY))
    assert len(srv.bodies) == 3


def test_4xx_is_not_retried(serve) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (400, b'{"error": "prompt too long"}'))
    with pytest.raises(EngineError, match="HTTP 400.*prompt too long"):
        run(engine(srv.url).generate([1], GREEDY))
    assert len(srv.bodies) == 1


def test_concurrency_cap_and_loop_changes(serve) -> None:  # noqa: ANN001
    in_flight, peak, lock = [0], [0], threading.Lock()

    def reply(n: int, body: dict) -> tuple[int, bytes]:
        import time

        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.05)
        with lock:
            in_flight[0] -= 1
        return 200, json.dumps(good_reply([body["prompt"][0]], [-0.1])).encode()

    srv = serve(reply)
    eng = engine(srv.url, max_concurrency=2)

    async def batch() -> list[int]:
        outs = await asyncio.gather(*(eng.generate([i], GREEDY) for i in range(6)))
        return [o.token_ids[0] for o in outs]

    assert run(batch()) == list(range(6))
    with pytest.raises(EngineError, match="another event loop"):  # one client per run, never a second
        run(batch())
    run(eng.close())
    assert run(batch()) == list(range(6))  # closed: a new loop may open the next client
    assert peak[0] <= 2
    run(eng.close())


def test_update_weights_rejects_state_dicts_and_names_missing_endpoint(serve) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (404, b'{"detail": "Not Found"}'))
    eng = engine(srv.url)
    with pytest.raises(EngineError, match="checkpoint directory, not a state dict"):
        eng.update_weights({"w": 0})
    with pytest.raises(EngineError, match=rf"{srv.url}/collective_rpc: not found .*VLLM_SERVER_DEV_MODE=1"):
        eng.update_weights("/some/ckpt")


# ------------------------------------------------------------------------------------------ chat mode
def chat_reply(content: str, finish: str = "stop", ids: list[int] | None = None, tokens: list[str] | None = None,
               lps: list[float] | None = None) -> dict:
    choice: dict = {"index": 0, "finish_reason": finish, "message": {"role": "assistant", "content": content}}
    if ids is not None:
        choice["token_ids"] = ids
    if tokens is not None:
        choice["logprobs"] = {"content": [{"token": t, "logprob": lp} for t, lp in zip(tokens, lps or [], strict=True)]}
    return {"choices": [choice]}


def test_chat_request_body_maps_sampling_params() -> None:
    from memrl.engines.openai_http import chat_request

    msgs = [{"role": "user", "content": "hi"}]
    body = chat_request(msgs, SamplingParams(0.7, 0.9, 20, 8, (2, 3), 11), "m")
    assert body["messages"] == msgs and body["max_tokens"] == 8 and body["model"] == "m"
    assert (body["temperature"], body["top_p"], body["top_k"], body["seed"], body["stop_token_ids"]) == (0.7, 0.9, 20, 11, [2, 3])
    assert body["logprobs"] is True and body["top_logprobs"] == 0
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and "prompt" not in body


def test_parse_chat_token_ids_strings_or_text() -> None:
    from doubles import CharTokenizer

    from memrl.engines.openai_http import parse_chat

    tok = CharTokenizer()
    # vLLM >= 0.10: token ids and logprobs from the server
    c = parse_chat(chat_reply("ab", ids=[7, 8, 1], tokens=["a", "b", ""], lps=[-0.1, -0.2, -0.3]), "u", tok)
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([7, 8, 1], [-0.1, -0.2, -0.3], "stop")
    assert c.info == {"token_ids": "server", "logprobs": "server"}
    # return_tokens_as_token_ids only
    c = parse_chat(chat_reply("ab", tokens=["token_id:7", "token_id:8"], lps=[-1.0, -2.0], finish="length"), "u", tok)
    assert (c.token_ids, c.logprobs, c.finish_reason) == ([7, 8], [-1.0, -2.0], "length")
    # vLLM 0.7 (MemAgent's server): decoded token strings -> the text is tokenized locally:
    # CharTokenizer ids are code points + 3: "a" = 97 + 3 = 100, "b" = 101; logprobs unknown (0.0 placeholders)
    c = parse_chat(chat_reply("ab", tokens=["a", "b"], lps=[-1.0, -2.0]), "u", tok)
    assert c.token_ids == [100, 101] and c.logprobs == [0.0, 0.0]
    assert c.info == {"token_ids": "text", "logprobs": "unavailable"}
    # no logprobs at all
    assert parse_chat(chat_reply("a"), "u", tok).token_ids == [100]


@pytest.mark.parametrize("reply, what", [
    ({"choices": []}, "no choices"),
    (chat_reply("x", finish="tool_calls"), "finish_reason 'tool_calls'"),
    ({"choices": [{"finish_reason": "stop"}]}, "message.content missing"),
    (chat_reply("x", ids=["a"]), r"token id 0 is .a. \(str\), not an integer"),
])
def test_parse_chat_malformed(reply: dict, what: str) -> None:
    from doubles import CharTokenizer

    from memrl.engines.openai_http import parse_chat

    with pytest.raises(EngineError, match=rf"^u: malformed chat reply: .*{what}"):
        parse_chat(reply, "u", CharTokenizer())


def test_parse_chat_text_without_tokenizer_is_named() -> None:
    from memrl.engines.openai_http import parse_chat

    with pytest.raises(EngineError, match="no token ids and the engine has no tokenizer"):
        parse_chat(chat_reply("x"), "u", None)


def test_chat_engine_sends_messages_and_refuses_plain_ids(serve) -> None:  # noqa: ANN001
    from memrl.engines.base import ChatPrompt

    srv = serve(lambda n, body: (200, json.dumps(chat_reply("z", ids=[9], tokens=["token_id:9"], lps=[-0.5])).encode()))
    eng = engine(srv.url, api="chat")
    msgs = [{"role": "user", "content": "hello"}]
    out = run(eng.generate(ChatPrompt([1, 2], msgs), GREEDY))
    assert (out.token_ids, out.logprobs) == ([9], [-0.5])
    assert srv.bodies[0]["messages"] == msgs and "prompt" not in srv.bodies[0]
    with pytest.raises(EngineError, match=rf"^{srv.url}/v1/chat/completions: engine.openai.api=chat sends chat "
                                          "messages, but this prompt was built as token ids"):
        run(eng.generate([1, 2], GREEDY))
    assert len(srv.bodies) == 1


def test_completions_404_suggests_chat_mode(serve) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (404, b'{"detail": "Not Found"}'))
    with pytest.raises(EngineError, match=r"/v1/completions: HTTP 404: .*needs engine.openai.api=chat, eval only"):
        run(engine(srv.url).generate([1], GREEDY))
    assert len(srv.bodies) == 1


def test_api_value_is_checked() -> None:
    from memrl.engines.config import EngineConfig, OpenAISection

    with pytest.raises(ValueError, match="engine.openai.api 'chats' is not completions or chat"):
        EngineConfig(openai=OpenAISection(api="chats"))


# ------------------------------------------------ garbage values (issue 48 item 2): checked before decoding
@pytest.mark.parametrize("ids, lps, what", [
    ([10**20], [-1.0], r"token id 0 is 100000000000000000000, outside \[0, 2147483647\)"),
    ([3, -5], [-1.0, -1.0], r"token id 1 is -5, outside \[0, 2147483647\)"),
    ([True], [-1.0], r"token id 0 is True \(bool\), not an integer"),
    ([2.5], [-1.0], r"token id 0 is 2.5 \(float\), not an integer"),
    (["7"], [-1.0], r"token id 0 is '7' \(str\), not an integer"),
    ("12345", [-1.0] * 5, r"token ids must be a list, got str"),  # issue 49 item 8: once read as [1, 2, 3, 4, 5]
    ([7], [0.5], r"logprob 0 is 0.5; a log-probability is finite and <= 0"),
    ([7], [float("nan")], r"logprob 0 is nan; a log-probability is finite and <= 0"),
    ([7], ["-1"], r"logprob 0 is '-1' \(str\), not a number"),
])
def test_garbage_values_are_retried_counted_then_one_error_naming_the_endpoint(serve, ids, lps, what) -> None:  # noqa: ANN001
    srv = serve(lambda n, body: (200, json.dumps(good_reply(ids, lps)).encode()))
    eng = engine(srv.url)
    with pytest.raises(EngineError, match=rf"^{srv.url}/v1/completions: malformed completion reply: {what} "
                                          r"\(gave up after 3 attempts\)$"):
        run(eng.generate([1], GREEDY))
    assert len(srv.bodies) == 3 and eng.bad_replies == 3


def test_a_garbage_reply_then_a_good_one_is_served(serve) -> None:  # noqa: ANN001
    def reply(n: int, body: dict) -> tuple[int, bytes]:
        return 200, json.dumps(good_reply([99] if n else [-1], [-0.5])).encode()

    srv = serve(reply)
    eng = engine(srv.url)
    assert run(eng.generate([1], GREEDY)).token_ids == [99] and eng.bad_replies == 1


def test_token_ids_are_checked_against_the_tokenizer_vocabulary() -> None:
    from doubles import CharTokenizer

    from memrl.engines.openai_http import parse_chat

    class Sized(CharTokenizer):
        def __len__(self) -> int:
            return 50

    with pytest.raises(EngineError, match=r"^u: malformed completion reply: token id 1 is 50, outside the "
                                          r"vocabulary \[0, 50\)$"):
        parse_completion(good_reply([49, 50], [-1.0, -1.0]), "u", vocab_size=50)
    with pytest.raises(EngineError, match=r"^u: malformed chat reply: token id 0 is 60, outside the vocabulary"):
        parse_chat({"choices": [{"finish_reason": "stop", "message": {"content": "x"}, "token_ids": [60]}]}, "u",
                   Sized())


def test_base_url_that_is_not_http_is_a_config_error(capsys, tmp_path) -> None:
    from memrl.cli import main

    data = tmp_path / "eval_1.json"
    data.write_text("[]")
    assert main(["eval", str(data), "--model", str(tmp_path), "--out", str(tmp_path / "o"), "engine=openai",
                 "engine.openai.base_url=ftp://example.org/v1"]) == 2
    err = capsys.readouterr().err
    assert err == ("memrl eval: error: engine.openai.base_url='ftp://example.org/v1' must start with http:// or "
                   "https://\n")
