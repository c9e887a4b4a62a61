"""engine.vllm / engine.openai lora_sync: the config checks, and the OpenAI engine's adapter calls against a
local stand-in server (the real vLLM paths: tests/vllm/test_vllm_lora.py)."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from memrl.config import ConfigError, load_config
from memrl.engines.base import EngineError, SamplingParams
from memrl.engines.openai_http import OpenAIEngine
from memrl.training.config import TrainConfig
from memrl.training.sync import adapter_sync


def _cfg(*extra: str) -> TrainConfig:
    return load_config(TrainConfig, ["model.path=m", *extra])


@pytest.mark.parametrize(("overrides", "message"), [
    (["engine=vllm", "engine.vllm.lora_sync=adapter"],
     "engine.vllm.lora_sync=adapter needs LoRA (model.lora.rank > 0, got 0)"),
    (["engine=openai", "engine.openai.lora_sync=adapter"],
     "engine.openai.lora_sync=adapter needs LoRA (model.lora.rank > 0, got 0)"),
    (["engine=vllm", "engine.vllm.lora_sync=adapter", "model.lora.rank=8", "rollout.num_engines=1"],
     "engine.vllm.lora_sync=adapter is for an in-process engine (rollout.num_engines=0, got 1): Ray replicas "
     "get the merged weights (rollout.weight_sync)"),
    (["engine=openai", "engine.openai.lora_sync=adapter", "model.lora.rank=8", "engine.openai.server=sglang"],
     "engine.openai.lora_sync=adapter needs engine.openai.server=vllm (its /v1/load_lora_adapter), got 'sglang'"),
    (["engine=vllm-cpu", "engine.vllm.lora_sync=adapter", "model.lora.rank=1024"],
     "engine.vllm.lora_sync=adapter: model.lora.rank=1024 is above vLLM's largest max_lora_rank 512"),
])
def test_adapter_sync_the_run_cannot_do_is_refused_in_one_line(overrides, message):
    from memrl.training.assemble import validate

    with pytest.raises(ConfigError) as e:
        validate(_cfg(*overrides))
    assert str(e.value) == message


def test_bad_lora_sync_value_names_the_field():
    from memrl.config import check_config

    with pytest.raises(ConfigError, match=r"^engine\.vllm\.lora_sync"):
        check_config(_cfg("engine.vllm.lora_sync=adapters"))


def test_mode_applies_to_in_process_vllm_and_openai_only():
    assert adapter_sync.mode(_cfg()) == "merged"
    assert adapter_sync.mode(_cfg("engine=vllm-cpu", "engine.vllm.lora_sync=adapter")) == "adapter"
    assert adapter_sync.mode(_cfg("engine=openai", "engine.openai.lora_sync=adapter")) == "adapter"
    assert adapter_sync.mode(_cfg("engine=openai", "engine.vllm.lora_sync=adapter")) == "merged"
    assert adapter_sync.mode(_cfg("engine=hf", "engine.vllm.lora_sync=adapter")) == "merged"
    assert adapter_sync.mode(_cfg("engine=vllm", "engine.vllm.lora_sync=adapter", "rollout.num_engines=1")) == "merged"


def test_vllm_lora_rank_rounds_up_to_a_rank_vllm_accepts():
    from memrl.engines.vllm import vllm_lora_rank

    assert [vllm_lora_rank(r) for r in (1, 2, 8, 9, 16, 17, 300, 512)] == [1, 8, 8, 16, 16, 32, 320, 512]


class Recorder:
    """POSTs answered by `reply(path, body) -> (status, text)`, every (path, body) recorded."""

    def __init__(self, reply) -> None:  # noqa: ANN001
        self.calls: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                outer.calls.append((self.path, body))
                status, text = reply(self.path, body)
                data = text.encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _vllm_like(path: str, body: dict) -> tuple[int, str]:
    if path == "/v1/completions":
        return 200, json.dumps({"choices": [{"token_ids": [5], "finish_reason": "length",
                                             "logprobs": {"token_logprobs": [-1.0]}}]})
    if path == "/v1/load_lora_adapter" and body["lora_path"] == "/bad":
        return 500, json.dumps({"error": {"message": "No adapter found\nfor /bad", "code": 500}})
    if path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
        return 200, "Success"
    return 404, json.dumps({"detail": "Not Found"})


@pytest.fixture
def server() -> Iterator[Recorder]:
    s = Recorder(_vllm_like)
    yield s
    s.stop()


def test_each_load_names_a_new_adapter_requests_use_it_and_the_previous_is_unloaded(server):
    eng = OpenAIEngine(base_url=f"{server.url}/v1", model="base")
    one = eng.load_adapter("/a/adapter-1")
    two = eng.load_adapter("/a/adapter-2")
    tag = one[len("memrl-lora-"):-len("-1")]
    assert (one, two) == (f"memrl-lora-{tag}-1", f"memrl-lora-{tag}-2") and len(tag) == 8
    greedy = SamplingParams(temperature=0, max_tokens=1)

    async def run() -> None:
        await eng.generate([1, 2], greedy)
        eng.unload_adapter()
        await eng.generate([1, 2], greedy)
        await eng.close()

    asyncio.run(run())
    calls = [(p, b if p != "/v1/completions" else b["model"]) for p, b in server.calls]
    assert calls == [
        ("/v1/load_lora_adapter", {"lora_name": one, "lora_path": "/a/adapter-1"}),
        ("/v1/load_lora_adapter", {"lora_name": two, "lora_path": "/a/adapter-2"}),
        ("/v1/unload_lora_adapter", {"lora_name": one}),
        ("/v1/completions", two),
        ("/v1/unload_lora_adapter", {"lora_name": two}),
        ("/v1/completions", "base"),
    ]
    assert eng.adapter is None


def test_a_refused_load_is_one_line_naming_the_endpoint_and_keeps_the_adapter(server):
    eng = OpenAIEngine(base_url=f"{server.url}/v1")
    first = eng.load_adapter("/a/adapter-1")
    with pytest.raises(EngineError) as e:
        eng.load_adapter("/bad")
    assert str(e.value) == f"{server.url}/v1/load_lora_adapter: HTTP 500: No adapter found for /bad"
    assert eng.adapter == first


def test_a_server_without_the_route_names_the_flags():
    s = Recorder(lambda path, body: (404, json.dumps({"detail": "Not Found"})))
    try:
        eng = OpenAIEngine(base_url=s.url)
        with pytest.raises(EngineError) as e:
            eng.load_adapter("/a/adapter-1")
    finally:
        s.stop()
    assert str(e.value) == (f"{s.url}/v1/load_lora_adapter: not found (start vLLM with --enable-lora and "
                            "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)")


def test_load_adapter_needs_a_vllm_server():
    eng = OpenAIEngine(base_url="http://127.0.0.1:9", server="sglang")
    with pytest.raises(EngineError, match=r"^http://127.0.0.1:9: load_adapter needs a vLLM server"):
        eng.load_adapter("/a")


def test_adapter_sync_writes_a_new_directory_per_sync_and_keeps_only_the_current(tmp_path):
    class Model:
        def save_pretrained(self, path: str, safe_serialization: bool) -> None:
            assert safe_serialization
            (tmp_path / "root" / path).joinpath("adapter_config.json").write_text("{}")

    class Engine:
        def __init__(self) -> None:
            self.loaded: list[str] = []

        def load_adapter(self, path: str) -> str:
            self.loaded.append(path)
            return f"n{len(self.loaded)}"

    root = tmp_path / "root"
    (root / "adapter-7").mkdir(parents=True)  # an earlier run's
    (root / "keep.txt").write_text("x")
    engine = Engine()
    sync = adapter_sync.AdapterSync(Model(), engine, root)
    assert sync() >= 0 and sorted(p.name for p in root.iterdir()) == ["adapter-1", "keep.txt"]
    sync()
    assert sorted(p.name for p in root.iterdir()) == ["adapter-2", "keep.txt"]
    assert engine.loaded == [str(root.resolve() / "adapter-1"), str(root.resolve() / "adapter-2")]
    assert set(sync.last) == {"write_s", "load_s"}
