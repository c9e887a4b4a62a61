"""`memrl eval` against a broken OpenAI-compatible endpoint (a stub server on 127.0.0.1 started here):
after two good answers the server fails (500, malformed reply, hung, connection closed). The command
prints one line naming the endpoint and what went wrong, exits 1, and keeps the two finished rows."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from doubles import send_json

from memrl.cli import main
from memrl.data.io import write_records

RECORDS = [{"input": f"what is key{i}?", "answers": ["v0"], "context": f"Document 1: key{i} is v0.",
            "index": i, "num_docs": 1} for i in range(3)]


class StubServer:
    """POST /v1/completions: the first `good` requests get `ids` as a completion, later ones `mode`."""

    def __init__(self, ids: list[int], mode: str, good: int = 2) -> None:
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests += 1
                if outer.requests <= good:
                    reply = {"choices": [{"token_ids": ids, "finish_reason": "stop", "logprobs": {
                        "tokens": [f"token_id:{i}" for i in ids], "token_logprobs": [-0.5] * len(ids)}}]}
                    return send_json(self, 200, json.dumps(reply).encode())
                if mode == "500":
                    return send_json(self, 500, b'{"error": "boom"}')
                if mode == "malformed":
                    return send_json(self, 200, b"this is not json")
                if mode == "hung":
                    time.sleep(1.0)  # past the client's 0.3 s read timeout; the client has gone by now
                    self.close_connection = True
                    return
                self.close_connection = True  # "closed": hang up without a reply

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


WHY = {
    "500": 'HTTP 500: {"error": "boom"} (gave up after 2 attempts)',
    "malformed": "malformed completion reply: not JSON ('this is not json')",
    "hung": "timed out (ReadTimeout) (gave up after 2 attempts)",
    "closed": "unreachable (RemoteProtocolError: Server disconnected without sending a response.) "
              "(gave up after 2 attempts)",
}


@pytest.mark.parametrize("mode", list(WHY))
def test_broken_endpoint_is_one_line_and_finished_rows_are_kept(mode, tmp_path, tiny_model, capsys, monkeypatch):
    from transformers import AutoTokenizer

    import memrl.eval.runner as runner
    from memrl.engines.openai_http import OpenAIEngine

    tok = AutoTokenizer.from_pretrained(tiny_model)
    srv = StubServer(tok.encode(" \\boxed{v0}", add_special_tokens=False), mode)
    try:
        monkeypatch.setattr(runner, "make_eval_engine", lambda sec: OpenAIEngine(
            base_url=srv.url, tokenizer=tok, max_retries=1, backoff_s=0.01, timeout_s=0.3, connect_timeout_s=1.0))
        good = tmp_path / "eval_1.json"
        write_records(good, RECORDS)
        out = tmp_path / "ev"
        argv = ["eval", str(good), "--out", str(out), "--model", tiny_model, "workflow=full_context",
                "concurrency=1", "--no-progress"]
        assert main(argv) == 1
    finally:
        srv.stop()
    errors = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memrl eval: error:")]
    assert errors == [f"memrl eval: error: workflow full_context failed on task 2 sample 0: "
                      f"{srv.url}/v1/completions: {WHY[mode]}"]
    rows = runner.read_results(out / "results.jsonl")
    assert [(r["task_id"], r["prediction"]) for r in rows] == [("0", "v0"), ("1", "v0")]
