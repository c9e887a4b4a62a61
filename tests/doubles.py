"""Test doubles with exact, hand-checkable behaviour: a character tokenizer, a scripted engine, a local
OpenAI-compatible server (completions or chat-only), a JSON endpoint and a `memrl serve retrieval`
subprocess for service stand-ins, and writers of other frameworks' checkpoint layouts.

Use them for contract tests of workflows (what prompt was sent at each step, how the reply was used);
use a real tiny model (memrl.models.tiny) for anything that must learn or batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memrl.demonstrators.engine import Call  # noqa: F401 - re-exported for tests
from memrl.demonstrators.engine import ScriptedEngine as _ScriptedEngine
from memrl.engines.base import SamplingParams
from memrl.services.base import RetrievalError
from memrl.services.keyword import KeywordRetriever as _KeywordRetriever
from memrl.training.ranks.distributed import free_port  # noqa: F401 - re-exported for tests


class CharTokenizer:
    """One token per character (id = code point + 3); ids 0-2 are <pad>, <eos>, <bos>.

    The chat template wraps a user message as "<user>{content}</user><assistant>".
    """

    pad_token_id = 0
    eos_token_id = 1
    bos_token_id = 2
    OFFSET = 3

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) + self.OFFSET for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out = []
        for i in ids:
            if i < self.OFFSET:
                if not skip_special_tokens:
                    out.append(["<pad>", "<eos>", "<bos>"][i])
                continue
            out.append(chr(i - self.OFFSET))
        return "".join(out)

    def apply_chat_template(self, messages: list[dict[str, str]], tokenize: bool = False,
                            add_generation_prompt: bool = True, **_: Any) -> str | list[int]:
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        if add_generation_prompt:
            text += "<assistant>"
        return self.encode(text) if tokenize else text


@dataclass
class ScriptedEngine(_ScriptedEngine):
    """memrl.demonstrators.ScriptedEngine with the character tokenizer by default (contract tests)."""

    tokenizer: Any = field(default_factory=CharTokenizer)


class CompletionServer:
    """A real OpenAI-compatible HTTP server on 127.0.0.1 (free port) in front of an in-process engine.

    Serves what memrl.engines.openai_http uses: POST /v1/completions (token-id prompts, token ids and
    logprobs back), POST /collective_rpc {"method": "memrl_load_weights", "kwargs": {"path": DIR}}
    (engine.update_weights(DIR)), POST /reset_prefix_cache, GET /health. `events` records
    ("complete", prompt_ids, token_ids, logprobs) and ("load", path) in arrival order.

    api="chat": a chat-only server (like MemAgent's serve/llm070.py): /v1/completions answers 404, POST
    /v1/chat/completions renders the messages with the engine tokenizer's chat template and answers
    `message.content` (the generated text without its stop token, special tokens skipped), with
    `logprobs.content` when asked. chat_token_ids=True answers like vLLM >= 0.10 (`choices[0].token_ids`
    on return_token_ids, "token_id:N" token strings on return_tokens_as_token_ids); False like vLLM 0.7
    (token strings are decoded text, no token ids). Events: ("chat", prompt_ids, token_ids, logprobs).
    """

    def __init__(self, engine: Any, api: str = "completions", chat_token_ids: bool = True,
                 served_models: list[str] | None = None) -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        if api not in ("completions", "chat"):
            raise ValueError(f"CompletionServer api must be completions or chat, got {api!r}")
        self.engine = engine
        self.api = api
        self.chat_token_ids = chat_token_ids
        self.served_models = served_models  # GET /v1/models lists them, and a chat request must name one
        self.events: list[tuple[Any, ...]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server API
                if self.path == "/v1/models" and outer.served_models is not None:
                    outer.events.append(("models",))
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model"}
                                                                for m in outer.served_models]})
                    return
                self._send(200 if self.path == "/health" else 404, {})

            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                try:
                    self._send(200, outer._handle(self.path, body))
                except KeyError as e:
                    self._send(404, {"error": f"unknown endpoint or method {e}"})
                except Exception as e:  # noqa: BLE001 - reported to the client as a 400, like a server would
                    self._send(400, {"error": f"{type(e).__name__}: {e}"})

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    @staticmethod
    def _sampling(body: dict[str, Any]) -> SamplingParams:
        return SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0),
                              top_k=body.get("top_k", -1), max_tokens=body["max_tokens"],
                              stop_token_ids=tuple(body.get("stop_token_ids", ())), seed=body.get("seed"))

    def _chat(self, body: dict[str, Any]) -> Any:
        if self.served_models is not None and body.get("model") not in self.served_models:
            raise ValueError(f"model {body.get('model')!r} is not served (a vLLM 0.7-era server requires it)")
        tok = self.engine.tokenizer
        text = tok.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        prompt = list(tok.encode(text, add_special_tokens=False))
        out = asyncio.run(self.engine.generate(prompt, self._sampling(body)))
        self.events.append(("chat", prompt, out.token_ids, out.logprobs))
        ids = list(out.token_ids)
        shown = ids[:-1] if out.finish_reason == "stop" and ids else ids  # the stop token is not text
        choice: dict[str, Any] = {"index": 0, "finish_reason": out.finish_reason,
                                  "message": {"role": "assistant", "content": tok.decode(shown, skip_special_tokens=True)}}
        as_ids = self.chat_token_ids and body.get("return_tokens_as_token_ids")
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": f"token_id:{t}" if as_ids else tok.decode([t]), "logprob": lp, "top_logprobs": []}
                for t, lp in zip(ids, out.logprobs, strict=True)]}
        if self.chat_token_ids and body.get("return_token_ids"):
            choice["token_ids"] = ids
        return {"object": "chat.completion", "choices": [choice]}

    def _handle(self, path: str, body: dict[str, Any]) -> Any:
        if path == "/v1/chat/completions" and self.api == "chat":
            return self._chat(body)
        if path == "/v1/completions" and self.api == "completions":
            out = asyncio.run(self.engine.generate(list(body["prompt"]), self._sampling(body)))
            self.events.append(("complete", list(body["prompt"]), out.token_ids, out.logprobs))
            return {"choices": [{"token_ids": out.token_ids, "finish_reason": out.finish_reason,
                                 "logprobs": {"token_logprobs": out.logprobs}}]}
        if path == "/collective_rpc":
            if body.get("method") != "memrl_load_weights":
                raise KeyError(body.get("method"))
            self.engine.update_weights(body["kwargs"]["path"])
            self.events.append(("load", body["kwargs"]["path"]))
            return {"results": [None]}
        if path == "/reset_prefix_cache":
            return {}
        raise KeyError(path)

    def __enter__(self) -> CompletionServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        asyncio.run(self.engine.close())


class KeywordRetriever(_KeywordRetriever):
    """memrl.services.keyword.KeywordRetriever (the `keyword` retriever kind) that also records every call
    in `calls` and, with `fail_with`, makes every call raise that RetrievalError (to test error handling)."""

    def __init__(self, documents: list[Any], fail_with: str | None = None) -> None:
        super().__init__(documents)
        self.fail_with = fail_with
        self.calls: list[tuple[list[str], int]] = []

    async def retrieve(self, queries: list[str], topk: int) -> list[list[Any]]:
        await asyncio.sleep(0)
        self.calls.append((list(queries), topk))
        if self.fail_with is not None:
            raise RetrievalError(self.fail_with)
        return self.rank(queries, topk)


# ---------------------------------------------------------------------------- foreign checkpoint layouts
def _verl_rank(rank: int, world: int, model_dir: str, actor: str, port: int, replicas: int, version: int) -> None:
    import os

    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoModelForCausalLM, AutoTokenizer

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        if replicas == 1:
            mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        else:  # HSDP: replicate over "ddp", shard over "fsdp" (verl's mesh names)
            mesh = init_device_mesh("cpu", (replicas, world // replicas), mesh_dim_names=("ddp", "fsdp"))
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        if version == 2:
            for layer in model.model.layers:
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            state = model.state_dict()
        else:  # FSDP1 wrapped per decoder layer, state dict type SHARDED_STATE_DICT (MemAgent's verl)
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            from torch.distributed.fsdp import ShardedStateDictConfig, ShardingStrategy, StateDictType
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy

            strategy = ShardingStrategy.FULL_SHARD if replicas == 1 else ShardingStrategy.HYBRID_SHARD
            wrapped = FSDP(model, device_mesh=mesh, use_orig_params=True, device_id=torch.device("cpu"),
                           auto_wrap_policy=ModuleWrapPolicy({type(model.model.layers[0])}), sharding_strategy=strategy)
            with FSDP.state_dict_type(wrapped, StateDictType.SHARDED_STATE_DICT, ShardedStateDictConfig(offload_to_cpu=True)):
                state = wrapped.state_dict()
        torch.save(state, f"{actor}/model_world_size_{world}_rank_{rank}.pt")
        dist.barrier()
        if rank == 0:  # verl's manager: config + tokenizer (no weights) in actor/huggingface
            model.config.save_pretrained(f"{actor}/huggingface")
            AutoTokenizer.from_pretrained(model_dir).save_pretrained(f"{actor}/huggingface")
            with open(f"{actor}/fsdp_config.json", "w", encoding="utf-8") as f:
                f.write(f'{{"FSDP_version": {version}, "world_size": {world}}}\n')
        dist.barrier()
    finally:
        dist.destroy_process_group()


def save_verl_fsdp_checkpoint(model_dir: str, step_dir: str, world_size: int, replicas: int = 1,
                              fsdp_version: int = 2) -> str:
    """Write the model at `model_dir` as verl's FSDP checkpoint manager does, from `world_size` gloo ranks
    (FSDP2 `fully_shard` per decoder layer and the root, or FSDP1 wrapping each decoder layer with the
    SHARDED_STATE_DICT state dict type; on a 1-D mesh named "fsdp", or with `replicas` > 1 HSDP on a
    ("ddp", "fsdp") mesh of replicas x world_size/replicas): each rank
    torch.save()s its sharded `model.state_dict()` (DTensors, Shard(0)) to
    `<step_dir>/actor/model_world_size_W_rank_R.pt`; rank 0 adds `actor/huggingface/` (config and
    tokenizer, no weights) and `actor/fsdp_config.json`. Returns the actor directory."""
    import os

    import torch.multiprocessing as mp

    from memrl.training.ranks.distributed import free_port

    actor = os.path.join(step_dir, "actor")
    os.makedirs(actor, exist_ok=True)
    mp.spawn(_verl_rank, args=(world_size, str(model_dir), actor, free_port(), replicas, fsdp_version),
             nprocs=world_size, join=True)
    return actor


@contextlib.contextmanager
def local_ray(num_cpus: int, temp_dir: Any = None) -> Iterator[None]:
    """A local Ray session for one test module (token auth off, no dashboard) with its session files in
    `temp_dir` (the test's own folder) when that path is short enough, else in a fresh folder in /tmp that
    is removed afterwards: Ray's socket paths (the folder + ~60 characters) must stay under AF_UNIX's 107."""
    import os
    import shutil
    import tempfile

    import ray

    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    temp = str(temp_dir) if temp_dir is not None and len(str(temp_dir)) <= 40 else None
    own = temp is None
    if own:
        temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    ray.init(_temp_dir=temp, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        if own:
            shutil.rmtree(temp, ignore_errors=True)
        if old is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = old


def send_json(handler: Any, status: int, data: bytes) -> None:
    """A test HTTP server's reply (http.server handler): `status` with the JSON body `data`."""
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class JsonServer:
    """A JSON POST endpoint on 127.0.0.1 (a free port) for tests that stand in for a service (a judge, a
    retrieval endpoint): each POST body goes to `reply(body)` and what it returns is sent back as JSON
    with status 200. `url` is the base URL plus `suffix` (e.g. "/v1"); `stop()` shuts it down."""

    def __init__(self, reply: Any, suffix: str = "") -> None:
        import json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                send_json(self, 200, json.dumps(reply(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))).encode())

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}{suffix}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextlib.contextmanager
def retrieval_server(corpus: Any, *args: str, timeout_s: float = 90.0) -> Iterator[tuple[str, int]]:
    """`memrl serve retrieval --corpus CORPUS --port <free> ARGS` in a subprocess (127.0.0.1); yields
    (url, port) once GET /health answers 200; terminated on exit (killed after 10 s), its output closed."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    import httpx

    repo = Path(__file__).resolve().parents[1]
    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "memrl.cli", "serve", "retrieval", "--corpus", str(corpus),
                             "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"retrieval server did not come up in {timeout_s:.0f} s"
            time.sleep(0.2)
        yield url, port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


def parity_reward(task: Any, traj: Any) -> float:
    """A reward a random model earns about half the time (the final answer's first token id is even), so
    advantages are non-zero and every step really updates the weights."""
    final = traj.segments[-1].response_ids
    return float(bool(final) and final[0] % 2 == 0)


def register_parity_workflow(name: str) -> None:
    """Register `name` as MemAgent's run and config scored by `parity_reward`: a plain spec (no format keys,
    train defaults or step rewards), as the training tests' pinned runs were made with."""
    from memrl.workflows import WorkflowSpec, register_workflow

    def spec() -> WorkflowSpec:
        from memrl.workflows import memagent

        return WorkflowSpec(name, memagent.run, memagent.MemAgentConfig, parity_reward)

    register_workflow(name, spec)


# ------------------------------------------------------------------ models and Megatron checkpoints to convert
# Small shapes chosen so sharding is uneven (intermediate 71 over 2 ranks: 36 + 35 rows) and GQA has
# 3 query heads per group (6 heads, 2 groups); Qwen3's head_dim 8 differs from hidden/heads = 6.
HIDDEN, INTER, LAYERS, HEADS, GROUPS = 36, 71, 2, 6, 2


def _tokenizer():
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    return AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))


def make_model(path: Path, arch: str) -> Path:
    """A seeded Qwen2 (tied embeddings, qkv bias) or Qwen3 (untied, q/k norms) with every weight perturbed
    (norms not all ones, biases not zero) so that any swapped or misplaced tensor changes the result."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from memrl.models.tiny import ModelPreset, qwen2_config

    tok = _tokenizer()
    if arch == "qwen2":
        config = qwen2_config(ModelPreset(0, HIDDEN, INTER, LAYERS, HEADS, GROUPS), len(tok), tok.eos_token_id,
                              tok.pad_token_id)
    else:
        config = Qwen3Config(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=INTER,
                             num_hidden_layers=LAYERS, num_attention_heads=HEADS, num_key_value_heads=GROUPS,
                             head_dim=8, tie_word_embeddings=False, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


def megatron_state(model_dir: Path, stacked: bool, pad_vocab: int) -> dict[str, object]:
    """The HF weights laid out as Megatron-core's GPT model stores them, built independently of the
    converter: fused qkv concatenated group by group ([q heads 3g..3g+2; k head g; v head g], since
    heads/groups = 3), fc1 = [gate; up], TE layer-norm names, the vocabulary padded with `pad_vocab`
    random rows; stacked = one tensor per name with the layer as leading axis (homogeneous layers).
    Plus entries a real checkpoint has that are not weights: an optimizer tensor and byte objects."""
    import torch
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    sd = m.state_dict()
    cfg = m.config
    hd = getattr(cfg, "head_dim", None) or HIDDEN // HEADS
    per = HEADS // GROUPS
    layers: list[dict[str, Any]] = []
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        q = sd[p + "self_attn.q_proj.weight"].reshape(HEADS, hd, HIDDEN)
        k = sd[p + "self_attn.k_proj.weight"].reshape(GROUPS, hd, HIDDEN)
        v = sd[p + "self_attn.v_proj.weight"].reshape(GROUPS, hd, HIDDEN)
        parts = []
        for g in range(GROUPS):
            parts += [q[g * per + j] for j in range(per)] + [k[g], v[g]]
        layer = {
            "self_attention.linear_qkv.weight": torch.cat(parts),
            "self_attention.linear_proj.weight": sd[p + "self_attn.o_proj.weight"],
            "self_attention.linear_qkv.layer_norm_weight": sd[p + "input_layernorm.weight"],
            "mlp.linear_fc1.weight": torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]]),
            "mlp.linear_fc1.layer_norm_weight": sd[p + "post_attention_layernorm.weight"],
            "mlp.linear_fc2.weight": sd[p + "mlp.down_proj.weight"],
        }
        if p + "self_attn.q_proj.bias" in sd:
            qb = sd[p + "self_attn.q_proj.bias"].reshape(HEADS, hd)
            kb = sd[p + "self_attn.k_proj.bias"].reshape(GROUPS, hd)
            vb = sd[p + "self_attn.v_proj.bias"].reshape(GROUPS, hd)
            bparts = []
            for g in range(GROUPS):
                bparts += [qb[g * per + j] for j in range(per)] + [kb[g], vb[g]]
            layer["self_attention.linear_qkv.bias"] = torch.cat(bparts)
        if p + "self_attn.q_norm.weight" in sd:
            layer["self_attention.q_layernorm.weight"] = sd[p + "self_attn.q_norm.weight"]
            layer["self_attention.k_layernorm.weight"] = sd[p + "self_attn.k_norm.weight"]
        layers.append(layer)
    torch.manual_seed(11)
    pad = torch.randn(pad_vocab, HIDDEN)
    out: dict[str, object] = {
        "embedding.word_embeddings.weight": torch.cat([sd["model.embed_tokens.weight"], pad]),
        "decoder.final_layernorm.weight": sd["model.norm.weight"],
        "optimizer.state.exp_avg.decoder.final_layernorm.weight": torch.ones(HIDDEN),
        "rng_state": {"random": [1, 2, 3]},  # stored as bytes (a pickle): must never be read
        "decoder.layers.self_attention.linear_qkv._extra_state": io.BytesIO(b"transformer engine state"),
    }
    if not cfg.tie_word_embeddings:
        out["output_layer.weight"] = torch.cat([sd["lm_head.weight"], pad])
    for name in layers[0]:
        if stacked:
            out[f"decoder.layers.{name}"] = torch.stack([layer[name] for layer in layers])
        else:
            out.update({f"decoder.layers.{i}.{name}": layer[name] for i, layer in enumerate(layers)})
    return out


def write_dcp(state: dict[str, object], path: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "torch.distributed is disabled ...: save in a single process": as meant
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.save(state, checkpoint_id=str(path), no_dist=True)
    return path
