"""VLLMEngine (real vLLM on CPU) against the transformers engine on the tiny model.

Both run float32 on CPU, so greedy tokens must be identical and logprobs equal to float rounding.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import torch

from memrl.engines.base import Completion, SamplingParams
from memrl.workflows.rollouts import rollout

TEXTS = [
    "Who was the president of the river city?",
    "When was the album released? Answer with \\boxed{}.",
    "<problem>\nWhich team won the season?\n</problem>",
    "The answer is",
    "Document 1:\nKalo Miran\nThe band played music in the north village.",
    "How many people live in the county?",
]
LP_TOL = 1e-4


def chat_prompts(tokenizer, texts: list[str] = TEXTS) -> list[list[int]]:  # noqa: ANN001
    out = []
    for t in texts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True)
        out.append(list(tokenizer.encode(text, add_special_tokens=False)))
    return out


def generate_all(engine, prompts: list[list[int]], sampling: SamplingParams,  # noqa: ANN001
                 runner: asyncio.Runner | None = None) -> list[Completion]:
    """All prompts at once; on `runner`'s loop when given (an engine whose client lives on one loop)."""
    async def go() -> list[Completion]:
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    return runner.run(go()) if runner is not None else asyncio.run(go())


def assert_same(a: list[Completion], b: list[Completion]) -> None:
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.token_ids == y.token_ids, f"prompt {i}: token ids differ"
        assert x.finish_reason == y.finish_reason, f"prompt {i}"
        assert max((abs(p - q) for p, q in zip(x.logprobs, y.logprobs, strict=True)), default=0) < LP_TOL, f"prompt {i}"


def reference_logprobs(model, prompt: list[int], tokens: list[int], temperature: float) -> list[float]:  # noqa: ANN001
    """memrl's convention recomputed with transformers: log_softmax(logits / T) of each generated token."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    lp = torch.log_softmax(logits / temperature, dim=-1)
    return lp.gather(-1, torch.tensor(tokens)[:, None])[:, 0].tolist()


def perturbed_model(path: Path, seed: int, scale: float = 0.05):  # noqa: ANN201
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model


def test_greedy_tokens_and_logprobs_match_transformers(vllm_engine, hf_engine) -> None:  # noqa: ANN001
    prompts = chat_prompts(vllm_engine.tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=24)
    got = generate_all(vllm_engine, prompts, greedy)
    assert_same(got, generate_all(hf_engine, prompts, greedy))
    assert all(len(c.token_ids) >= 1 for c in got)


def test_many_concurrent_requests_batch_like_single_ones(vllm_engine) -> None:  # noqa: ANN001
    prompts = chat_prompts(vllm_engine.tokenizer) * 8  # 48 in flight
    greedy = SamplingParams(temperature=0, max_tokens=16)
    together = generate_all(vllm_engine, prompts, greedy)
    alone = [generate_all(vllm_engine, [p], greedy)[0] for p in prompts[:6]]
    assert_same(together[:6], alone)
    assert_same(together[6:12], alone)


def test_sampled_logprobs_follow_memrl_convention(vllm_engine, tiny_model) -> None:  # noqa: ANN001
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).eval()
    prompts = chat_prompts(vllm_engine.tokenizer)[:3]
    sampling = SamplingParams(temperature=0.7, max_tokens=12, seed=1234)
    first = generate_all(vllm_engine, prompts, sampling)
    again = generate_all(vllm_engine, prompts, sampling)
    assert [c.token_ids for c in first] == [c.token_ids for c in again], "same seed, same tokens"
    for p, c in zip(prompts, first, strict=True):
        ref = reference_logprobs(model, p, c.token_ids, 0.7)
        assert max(abs(a - b) for a, b in zip(ref, c.logprobs, strict=True)) < LP_TOL


def test_seeded_requests_with_long_prompts_in_one_batch(vllm_engine) -> None:  # noqa: ANN001
    # More prompt tokens than one default scheduler step (2048): vLLM 0.32 on CPU crashed on seeded
    # requests whose prefill was split across steps, until VLLMEngine turned chunked prefill off there.
    tok = vllm_engine.tokenizer
    long_text = " ".join(TEXTS * 12)
    prompts = [chat_prompts(tok, [f"{i}: {long_text}"])[0] for i in range(16)]
    assert sum(map(len, prompts)) > 2048
    outs = generate_all(vllm_engine, prompts, SamplingParams(temperature=1.0, max_tokens=4, seed=5))
    assert all(len(c.token_ids) == 4 for c in outs)


def test_stop_token_ends_and_is_included(vllm_engine) -> None:  # noqa: ANN001
    prompt = chat_prompts(vllm_engine.tokenizer)[0]
    full = generate_all(vllm_engine, [prompt], SamplingParams(temperature=0, max_tokens=8))[0]
    assert full.finish_reason == "length" and len(full.token_ids) == 8
    stop = full.token_ids[2]
    cut = generate_all(vllm_engine, [prompt], SamplingParams(temperature=0, max_tokens=8, stop_token_ids=(stop,)))[0]
    first = full.token_ids.index(stop)
    assert cut.token_ids == full.token_ids[: first + 1] and cut.finish_reason == "stop"


def test_update_weights_follows_the_updated_transformers_model(vllm_engine, tiny_model, tmp_path) -> None:  # noqa: ANN001
    from memrl.engines.hf import HFEngine

    prompts = chat_prompts(vllm_engine.tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=16)
    before = generate_all(vllm_engine, prompts, greedy)
    model = perturbed_model(tiny_model, seed=7)
    ref_engine = HFEngine(model, tokenizer=vllm_engine.tokenizer, dtype="float32", deterministic=False, seed=None)
    try:
        want = generate_all(ref_engine, prompts, greedy)
        assert [c.token_ids for c in want] != [c.token_ids for c in before], "the perturbation must matter"

        vllm_engine.update_weights(model.state_dict())  # a trainer's state dict, engine keeps running
        assert_same(generate_all(vllm_engine, prompts, greedy), want)

        vllm_engine.update_weights(str(tiny_model))  # back to the original from a checkpoint directory
        assert_same(generate_all(vllm_engine, prompts, greedy), before)

        model.save_pretrained(tmp_path / "step1")
        vllm_engine.update_weights(str(tmp_path / "step1"))
        assert_same(generate_all(vllm_engine, prompts, greedy), want)
    finally:
        vllm_engine.update_weights(str(tiny_model))
        asyncio.run(ref_engine.close())


def test_sleep_and_wake_up_are_no_ops_on_cpu(vllm_engine) -> None:  # noqa: ANN001
    if not vllm_engine.on_cpu:
        pytest.skip("GPU: sleep mode needs enable_sleep_mode=True; covered by GPU runs")
    vllm_engine.sleep()
    vllm_engine.wake_up()
    out = generate_all(vllm_engine, chat_prompts(vllm_engine.tokenizer)[:1], SamplingParams(temperature=0, max_tokens=4))
    assert len(out[0].token_ids) == 4


def memagent_batch(engine, runner: asyncio.Runner | None = None):  # noqa: ANN001, ANN201
    """Greedy MemAgent rollouts on seeded synthetic tasks (3 chunks + final = 4 calls each)."""
    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks
    from memrl.workflows import get_workflow
    from memrl.workflows.memagent import MemAgentConfig

    spec = get_workflow("memagent")
    tasks = make_lookback_tasks(LookbackConfig(num_chunks=3, chunk_words=24), 4, seed=0)
    cfg = MemAgentConfig(chunk_tokens=32, max_memory_tokens=24, max_final_tokens=12, temperature=0.0)
    coro = rollout(tasks, spec, engine, cfg, n=2, concurrency=8, seed=0, services=None)  # memagent takes none
    return runner.run(coro) if runner is not None else asyncio.run(coro)


def assert_same_trajectories(a, b) -> None:  # noqa: ANN001
    for ga, gb in zip(a, b, strict=True):
        for ta, tb in zip(ga.trajectories, gb.trajectories, strict=True):
            assert ta.trajectory_id == tb.trajectory_id
            assert ta.final_answer == tb.final_answer and len(ta.segments) == len(tb.segments)
            for sa, sb in zip(ta.segments, tb.segments, strict=True):
                where = f"{ta.trajectory_id} step {sa.step}"
                assert sa.prompt_ids == sb.prompt_ids, where
                assert sa.response_ids == sb.response_ids, where
                assert all(math.isclose(x, y, abs_tol=LP_TOL) for x, y in zip(sa.response_logprobs, sb.response_logprobs, strict=True)), where


def test_memagent_trajectories_identical_through_vllm_and_transformers(vllm_engine, hf_engine) -> None:  # noqa: ANN001
    via_vllm = memagent_batch(vllm_engine)
    assert sum(len(t.segments) for g in via_vllm for t in g.trajectories) == 8 * 4
    assert_same_trajectories(via_vllm, memagent_batch(hf_engine))


def test_broadcast_weight_transfer_into_vllm_workers(vllm_engine, tiny_model) -> None:  # noqa: ANN001
    """The trainer side (this process, rank 0) broadcasts over gloo into vLLM's worker (rank 1), which
    streams the buckets into reload_weights: greedy output then follows the sent weights, twice."""
    import threading

    from memrl.engines.hf import HFEngine
    from memrl.engines.weight_transfer import TransferSpec, WeightTransfer
    from memrl.training.ranks.distributed import free_port

    prompts = chat_prompts(vllm_engine.tokenizer)
    greedy = SamplingParams(temperature=0, max_tokens=16)
    before = generate_all(vllm_engine, prompts, greedy)
    model = perturbed_model(tiny_model, seed=11)
    ref_engine = HFEngine(model, tokenizer=vllm_engine.tokenizer, dtype="float32", deterministic=False, seed=None)
    spec = TransferSpec("127.0.0.1", free_port(), 1 + vllm_engine.transfer_members, "gloo", bucket_bytes=1 << 20)
    box: dict[str, WeightTransfer] = {}
    joiner = threading.Thread(target=lambda: box.setdefault("t", WeightTransfer(spec, 0)))
    try:
        want = generate_all(ref_engine, prompts, greedy)
        assert [c.token_ids for c in want] != [c.token_ids for c in before], "the perturbation must matter"
        joiner.start()
        vllm_engine.init_weight_transfer(spec, 1)  # blocks until rank 0 joined too
        joiner.join(timeout=60)
        sender = box["t"]
        original = {k: v.clone() for k, v in perturbed_model(tiny_model, seed=0, scale=0.0).state_dict().items()}
        for weights, expect in ((model.state_dict(), want), (original, before)):
            th = threading.Thread(target=sender.send, args=(weights,), kwargs={"skip": ("lm_head.weight",)})
            th.start()
            vllm_engine.receive_weights()
            th.join(timeout=60)
            assert_same(generate_all(vllm_engine, prompts, greedy), expect)
        assert sender.bytes_sent > 2 * (1 << 20)  # several buckets per sync
    finally:
        vllm_engine.update_weights(str(tiny_model))
        asyncio.run(ref_engine.close())
