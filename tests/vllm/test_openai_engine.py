"""OpenAIEngine against a real `python -m vllm.entrypoints.openai.api_server` (CPU, tiny model).

The server is started by the session fixture on 127.0.0.1 with a free port, with the same dtype, seed and
`--logprobs-mode processed_logprobs` as the in-process engine; its replies must match that engine's.
The stopped-server test stops the shared server, so it runs last in this module.
"""

from __future__ import annotations

import asyncio

import pytest
from test_vllm_engine import (  # tests/vllm is on sys.path (rootdir-relative, no __init__)
    assert_same,
    assert_same_trajectories,
    chat_prompts,
    generate_all,
    memagent_batch,
    perturbed_model,
)

from memrl.engines.base import EngineError, SamplingParams
from memrl.engines.openai_http import OpenAIEngine


@pytest.fixture(scope="module")
def loop():  # noqa: ANN201
    """One event loop for the module: the engine's HTTP client lives on it (as on a run's RolloutRuntime)."""
    with asyncio.Runner() as runner:
        yield runner


@pytest.fixture(scope="module")
def http_engine(vllm_server, vllm_engine, loop):  # noqa: ANN001, ANN201
    eng = OpenAIEngine(base_url=f"{vllm_server.url}/v1", tokenizer=vllm_engine.tokenizer, max_concurrency=32,
                       timeout_s=120.0, max_retries=1, backoff_s=0.05)
    yield eng
    loop.run(eng.close())


def test_http_tokens_and_logprobs_match_in_process_engine(http_engine, loop, vllm_engine) -> None:  # noqa: ANN001
    prompts = chat_prompts(vllm_engine.tokenizer)
    for sampling in (SamplingParams(temperature=0, max_tokens=24), SamplingParams(temperature=0.8, max_tokens=16, seed=99)):
        over_http = generate_all(http_engine, prompts, sampling, runner=loop)
        assert all(len(c.token_ids) >= 1 for c in over_http)
        assert_same(over_http, generate_all(vllm_engine, prompts, sampling))


def test_http_stop_token_included(http_engine, loop, vllm_engine) -> None:  # noqa: ANN001
    prompt = chat_prompts(vllm_engine.tokenizer)[1]
    full = generate_all(http_engine, [prompt], SamplingParams(temperature=0, max_tokens=6), runner=loop)[0]
    stop = full.token_ids[1]
    cut = generate_all(http_engine, [prompt], SamplingParams(temperature=0, max_tokens=6, stop_token_ids=(stop,)), runner=loop)[0]
    assert cut.finish_reason == "stop" and cut.token_ids == full.token_ids[: full.token_ids.index(stop) + 1]


def test_memagent_trajectories_identical_over_http(http_engine, loop, vllm_engine) -> None:  # noqa: ANN001
    assert_same_trajectories(memagent_batch(http_engine, loop), memagent_batch(vllm_engine))


def test_http_update_weights_reloads_the_server(http_engine, loop, vllm_engine, tiny_model, tmp_path) -> None:  # noqa: ANN001
    prompts = chat_prompts(vllm_engine.tokenizer)[:3]
    greedy = SamplingParams(temperature=0, max_tokens=12)
    before = generate_all(http_engine, prompts, greedy, runner=loop)
    ckpt = tmp_path / "step1"
    perturbed_model(tiny_model, seed=7).save_pretrained(ckpt)
    try:
        http_engine.update_weights(str(ckpt))
        vllm_engine.update_weights(str(ckpt))
        after = generate_all(http_engine, prompts, greedy, runner=loop)
        assert [c.token_ids for c in after] != [c.token_ids for c in before]
        assert_same(after, generate_all(vllm_engine, prompts, greedy))
    finally:
        http_engine.update_weights(str(tiny_model))
        vllm_engine.update_weights(str(tiny_model))
    assert_same(generate_all(http_engine, prompts, greedy, runner=loop), before)


def test_stopped_server_gives_a_clear_error(http_engine, loop, vllm_server) -> None:  # noqa: ANN001
    vllm_server.stop()
    with pytest.raises(EngineError, match=rf"{vllm_server.url}/v1/completions: unreachable"):
        generate_all(http_engine, [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=2), runner=loop)
