"""HFEngine against plain transformers forward passes on the tiny random model (CPU)."""

from __future__ import annotations

import asyncio
import threading
import types

import pytest
import torch

from memrl.engines import EngineConfig, build_engine, engine_kind
from memrl.engines.base import Engine, EngineError, SamplingParams
from memrl.engines.hf import HFEngine
from memrl.engines.hf_sampling import sample_rows
from memrl.models.tiny import cached_tiny_model, qwen2_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models")


@pytest.fixture(scope="module")
def ref_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir).eval()


@pytest.fixture(scope="module", params=["padded", "slots"])
def kv_cache(request):
    """Every engine test runs with both KV-cache layouts (engine.hf.kv_cache)."""
    return request.param


LAYOUTS = {"padded": {"kv_cache": "padded"}, "slots": {"kv_cache": "slots"},
           "slots-chunk3": {"kv_cache": "slots", "prefill_chunk_tokens": 3}}
"""The shared engine's settings: both layouts, and slots with prefill chunked to 3 tokens a step (every
prompt of `prompts` but "x" spans several steps)."""


@pytest.fixture(scope="module", params=list(LAYOUTS))
def layout(request):
    return request.param


@pytest.fixture(scope="module")
def engine(model_dir, layout):
    eng = HFEngine(model_dir, max_batch_size=64, max_wait_ms=20.0, seed=0, deterministic=False, **LAYOUTS[layout])
    yield eng
    asyncio.run(eng.close())


TEXTS = ["Hello there.", "Document 1:\nKalomi\nThe river was founded in 1875 by a band",
         "<problem>Who won?</problem>", "x", "The answer is \\boxed{42}. " * 3]


@pytest.fixture(scope="module")
def prompts(engine):
    return [engine.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]


def run(coro):
    return asyncio.run(coro)


def run_all(coros, timeout: float = 60.0) -> list:
    """Await the coroutines concurrently (so the engine batches them) in a fresh event loop."""

    async def main():
        return await asyncio.wait_for(asyncio.gather(*coros), timeout)

    return run(main())


def greedy_reference(model, prompt: list[int], n: int, stop: set[int]) -> list[int]:
    """Argmax decoding with full forward passes and no cache."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            tok = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(tok)
            ids.append(tok)
            if tok in stop:
                break
    return out


def reference_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(response)[:, None]).squeeze(1)


def test_protocol_and_factory(engine, model_dir):
    assert isinstance(engine, Engine)
    eng = build_engine(EngineConfig(model=model_dir, max_batch_size=4))
    assert isinstance(eng, HFEngine) and eng.max_batch_size == 4
    with pytest.raises(ValueError, match="unknown engine kind 'nope'"):
        engine_kind("nope")


def test_greedy_matches_argmax_loop_in_one_batch(engine, ref_model, prompts):
    eos = {engine.eos_token_id}
    outs = run_all([engine.generate(p, GREEDY) for p in prompts])
    for p, out in zip(prompts, outs, strict=True):
        assert out.token_ids == greedy_reference(ref_model, p, GREEDY.max_tokens, eos)
        assert out.finish_reason == ("stop" if out.token_ids[-1] in eos else "length")
        expected = reference_logprobs(ref_model, p, out.token_ids, 1.0)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4)


def hold_worker(eng: HFEngine, after_decode_steps: int, why: str) -> threading.Event:
    """Hold `eng`'s worker before its next forward once it has made `after_decode_steps` decode steps, until
    the returned event is set (the test sets it once the state it needs is reached; `why` names that)."""
    gate = threading.Event()
    forward = eng._forward

    def gated_forward(*args, **kwargs):
        if eng.stats.decode_steps >= after_decode_steps:
            assert gate.wait(30), why
        return forward(*args, **kwargs)

    eng._forward = gated_forward
    return gate


def test_requests_joining_a_running_batch_decode_correctly(model_dir, ref_model, prompts, layout):
    """Continuous batching: rows admitted mid-decode, and rows leaving early, must not disturb others.

    No timing race: the worker is held after the long row's 5th decode step until the newcomers are queued,
    and the engine holds exactly long + newcomers rows, so they are admitted at the next step (no wait)."""
    eng = HFEngine(model_dir, max_batch_size=len(prompts) + 1, max_wait_ms=20.0, seed=0, deterministic=False,
                   **LAYOUTS[layout])
    eos = {eng.eos_token_id}
    gate = hold_worker(eng, after_decode_steps=5, why="the newcomers were never queued")

    async def staggered():
        long = asyncio.ensure_future(eng.generate(prompts[1], GREEDY.replace(max_tokens=30)))
        while eng.stats.decode_steps < 5:
            await asyncio.sleep(0.005)
        short = [asyncio.ensure_future(eng.generate(p, GREEDY.replace(max_tokens=3 + i)))
                 for i, p in enumerate(prompts)]
        await asyncio.sleep(0)  # each newcomer has run up to its submission
        assert len(eng._pending) == len(prompts)
        gate.set()
        return await asyncio.gather(long, *short)

    try:
        outs = run(asyncio.wait_for(staggered(), 60))
    finally:
        gate.set()
        run(eng.close())
    joined, st = eng.stats.batch_sizes, eng.stats
    if layout == "slots-chunk3":
        # prompts are 5, 21, 6, 1, 28 tokens. The long row's 21 tokens: 7 passes of 3 (6 chunks), nothing
        # decoding yet; the prefix cache keeps its first 16. The newcomers compute 5, 21 - 16, 6, 1, 28 = 45
        # tokens, 3 a step: 15 steps; passes end at step cuts 3..42 (14) and prompt ends 5, 10, 16, 17:
        # 19 passes, 19 - 5 = 14 chunks. The long row (30 tokens: the first, 5 steps before, 24 after)
        # decodes in every one of the 15 steps, and after steps 1..14 a prompt is still part-way: 14 steps
        # beside a partial prefill.
        assert st.prefix_hit_tokens == 16
        assert (st.prefill_calls, st.prefill_chunks, st.decode_steps_beside_prefill) == (7 + 19, 6 + 14, 14)
    else:
        assert joined[len(prompts) + 1] > 0, joined  # the newcomers decoded together with the running row
        assert st.prefill_chunks == st.decode_steps_beside_prefill == 0
    assert outs[0].token_ids == greedy_reference(ref_model, prompts[1], 30, eos)
    for i, (p, out) in enumerate(zip(prompts, outs[1:], strict=True)):
        assert out.token_ids == greedy_reference(ref_model, p, 3 + i, eos)


def test_sampled_logprobs_match_full_forward_before_truncation(engine, ref_model, prompts):
    params = [
        SamplingParams(temperature=1.0, max_tokens=10, seed=1),
        SamplingParams(temperature=0.7, top_k=20, max_tokens=10, seed=2),
        SamplingParams(temperature=1.3, top_p=0.8, max_tokens=10, seed=3),
        SamplingParams(temperature=0.5, top_k=5, top_p=0.9, max_tokens=10, seed=4),
        SamplingParams(temperature=0.0, max_tokens=10),
    ]
    outs = run_all([engine.generate(p, s) for p, s in zip(prompts, params, strict=True)])
    for p, s, out in zip(prompts, params, outs, strict=True):
        expected = reference_logprobs(ref_model, p, out.token_ids, s.logprob_temperature)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-4), s
        if s.top_k > 0:  # every sampled token was among the top_k of its step
            with torch.no_grad():
                logits = ref_model(torch.tensor([p + out.token_ids])).logits[0, len(p) - 1 : -1]
            ranks = (logits > logits.gather(1, torch.tensor(out.token_ids)[:, None])).sum(-1)
            assert int(ranks.max()) < s.top_k


def test_seeded_sampling_is_reproducible_regardless_of_batch(engine, prompts):
    s = SamplingParams(temperature=1.0, max_tokens=16, seed=1234)
    alone = run(engine.generate(prompts[0], s))
    crowd = run_all(
        [engine.generate(p, SamplingParams(temperature=1.0, max_tokens=5 + i, seed=i)) for i, p in enumerate(prompts)]
        + [engine.generate(prompts[0], s)]
    )
    assert crowd[-1].token_ids == alone.token_ids
    assert crowd[-1].logprobs == pytest.approx(alone.logprobs, abs=1e-5)
    other = run(engine.generate(prompts[0], s.replace(seed=99)))
    assert other.token_ids != alone.token_ids


def test_max_tokens_stop_tokens_and_finish_reason(engine, ref_model, prompts):
    p = prompts[2]
    full = greedy_reference(ref_model, p, 8, {engine.eos_token_id})
    assert len(full) == 8  # a random model does not hit EOS this early; the checks below rely on it
    out = run(engine.generate(p, GREEDY.replace(max_tokens=1)))
    assert out.token_ids == full[:1] and out.finish_reason == "length"
    stop_at = full[4]
    first = full.index(stop_at)
    out = run(engine.generate(p, GREEDY.replace(max_tokens=8, stop_token_ids=(stop_at,))))
    assert out.token_ids == full[: first + 1] and out.finish_reason == "stop"  # the stop token is included
    assert len(out.logprobs) == len(out.token_ids)


def test_tokenizer_eos_always_stops(model_dir, ref_model, prompts):
    """The tokenizer's EOS ends a completion even when the request lists no stop tokens."""
    full = greedy_reference(ref_model, prompts[0], 6, set())
    fake_eos = full[3]
    tok = types.SimpleNamespace(eos_token_id=fake_eos, pad_token_id=0)
    eng = HFEngine(ref_model, tokenizer=tok, deterministic=False, seed=None)
    try:
        out = run(eng.generate(prompts[0], GREEDY.replace(max_tokens=6)))
    finally:
        run(eng.close())
    assert out.token_ids == full[: full.index(fake_eos) + 1] and out.finish_reason == "stop"


def test_concurrent_requests_are_batched(model_dir, kv_cache):
    eng = HFEngine(model_dir, max_batch_size=64, max_wait_ms=50.0, deterministic=False, seed=None, kv_cache=kv_cache)
    tok = eng.tokenizer
    n, new = 24, 8
    prompts = [tok.encode(f"Question {i}: what is {i} plus {i}?", add_special_tokens=False) for i in range(n)]

    try:
        outs = run_all([eng.generate(p, SamplingParams(max_tokens=new, seed=i)) for i, p in enumerate(prompts)])
    finally:
        run(eng.close())
    st = eng.stats
    assert st.requests == n and st.completed == n
    assert st.generated_tokens == sum(len(o.token_ids) for o in outs)
    assert st.decode_steps <= 2 * new  # new-1 decode steps, plus slack for a late joiner
    # padded: one prefill of all prompts; slots: the admission's prompts in batched passes too, or (chunked)
    # one pass per prompt
    assert st.prefill_calls <= (2 if kv_cache == "padded" else n)
    assert st.decode_steps < n * new / 4
    assert st.max_batch_size >= n // 2
    assert st.generate_seconds > 0 and st.tokens_per_second > 0
    # every request got a first token once; new tokens a row: its first, then new - 1 decode steps, so a
    # decode gap was measured between two of them
    assert st.first_tokens == n and 0 < st.mean_first_token_s <= st.max_first_token_s
    assert st.max_decode_gap_s > 0


def test_update_weights_from_state_dict_and_path(model_dir, prompts, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen2ForCausalLM

    eng = HFEngine(model_dir, deterministic=False, seed=None)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    torch.manual_seed(123)
    other = Qwen2ForCausalLM(qwen2_config("tiny", base.config.vocab_size, eng.eos_token_id, eng.pad_token_id)).eval()
    eos = {eng.eos_token_id}
    try:
        before = run(eng.generate(prompts[1], GREEDY))
        assert before.token_ids == greedy_reference(base, prompts[1], GREEDY.max_tokens, eos)
        eng.update_weights(other.state_dict())
        after = run(eng.generate(prompts[1], GREEDY))
        assert after.token_ids == greedy_reference(other, prompts[1], GREEDY.max_tokens, eos)
        assert after.token_ids != before.token_ids
        eng.update_weights(str(model_dir))  # back to the original, from a directory
        assert run(eng.generate(prompts[1], GREEDY)).token_ids == before.token_ids
        assert eng.stats.weight_updates == 2
        with pytest.raises(EngineError, match="not in the model"):
            eng.update_weights({"model.nope.weight": torch.zeros(1)})
        with pytest.raises(EngineError, match="shape"):
            eng.update_weights({"model.norm.weight": torch.zeros(3)})
        with pytest.raises(FileNotFoundError):
            eng.update_weights(str(tmp_path / "missing"))
    finally:
        run(eng.close())


def test_update_weights_waits_for_running_rows(model_dir, prompts, layout):
    """A completion never mixes weights: an update requested while a row runs (the worker is held after the
    row's 3rd decode step until the update is waiting) lands only after the row finishes."""
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    zeroed = {k: torch.zeros_like(v) for k, v in base.state_dict().items() if k.endswith("o_proj.weight")}
    eng = HFEngine(model_dir, deterministic=False, seed=None, **LAYOUTS[layout])
    gate = hold_worker(eng, after_decode_steps=3, why="the update was never requested")
    seen_while_running = {}

    async def go():
        task = asyncio.ensure_future(eng.generate(prompts[1], GREEDY.replace(max_tokens=40)))
        while eng.stats.decode_steps < 3:
            await asyncio.sleep(0.005)
        update = asyncio.ensure_future(asyncio.to_thread(eng.update_weights, zeroed))
        while not eng._draining:  # the update is waiting for the running row
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        seen_while_running.update(done=task.done(), updates=eng.stats.weight_updates)
        gate.set()
        out = await task
        await update
        return out

    try:
        out = run(asyncio.wait_for(go(), 60))
        later = run(eng.generate(prompts[1], GREEDY.replace(max_tokens=40)))
    finally:
        gate.set()
        run(eng.close())
    assert seen_while_running == {"done": False, "updates": 0}
    assert out.token_ids == greedy_reference(base, prompts[1], 40, {eng.eos_token_id})
    assert len(out.token_ids) > 4  # the row ran past the step where the update was requested
    assert eng.stats.weight_updates == 1 and later.token_ids != out.token_ids


def test_bad_requests(engine):
    with pytest.raises(EngineError, match="prompt_ids is empty"):
        run(engine.generate([], GREEDY))
    with pytest.raises(EngineError, match="outside the vocabulary"):
        run(engine.generate([engine.vocab_size + 5], GREEDY))
    with pytest.raises(EngineError, match="positions"):
        run(engine.generate([1] * (engine.max_positions + 1), GREEDY))
    with pytest.raises(ValueError, match="max_batch_size"):
        HFEngine(engine.model, tokenizer=engine.tokenizer, max_batch_size=0, deterministic=False, seed=None)


def test_cancelled_request_leaves_the_engine_serving(engine, ref_model, prompts):
    async def go():
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(engine.generate(prompts[0], GREEDY.replace(max_tokens=2000)), 0.2)
        return await engine.generate(prompts[1], GREEDY)

    out = run(asyncio.wait_for(go(), 60))
    assert out.token_ids == greedy_reference(ref_model, prompts[1], GREEDY.max_tokens, {engine.eos_token_id})


def test_closed_engine_refuses(model_dir, prompts):
    eng = HFEngine(model_dir, deterministic=False, seed=None)
    run(eng.close())
    with pytest.raises(EngineError, match="after close"):
        run(eng.generate(prompts[0], GREEDY))


def test_sample_rows_truncation():
    logp = torch.log_softmax(torch.tensor([[0.0, 3.0, 1.0, 2.0], [0.0, 3.0, 1.0, 2.0], [5.0, 0.0, 0.0, 0.0]]), -1)
    for u in (0.0, 0.3, 0.999999):
        out = sample_rows(logp, torch.full((3,), u), [1, 2, -1], [1.0, 1.0, 1e-3])
        assert out[0] == 1  # top_k=1 is argmax
        assert out[1] in (1, 3)  # top_k=2 keeps the two most likely
        assert out[2] == 0  # a tiny top_p keeps only the most likely
    out = sample_rows(logp[:1], torch.tensor([0.999999]), [-1], [1.0])
    assert out[0] == 3  # inverse CDF in vocabulary order: the last bucket is token 3


def test_deterministic_engine_never_merges_a_later_wave_into_a_running_one(model_dir, prompts, kv_cache):
    """A wave submitted while another is decoding waits until every row of the running one is done: its
    rows never join the running batch at a time-dependent decode step (the MemAct nondeterminism: callers
    coming back from a thread-run search joined the batch wherever the decode loop happened to be)."""
    eng = HFEngine(model_dir, max_batch_size=64, seed=0, deterministic=True, kv_cache=kv_cache)
    long = SamplingParams(temperature=1.0, max_tokens=40, seed=1)
    short = SamplingParams(temperature=1.0, max_tokens=4, seed=2)
    order: list[str] = []

    async def first(p):
        out = await eng.generate(p, long)
        order.append("first")
        return out

    async def late(p):
        while eng.stats.decode_steps < 2:  # the first wave is decoding now
            await asyncio.sleep(0.001)
        out = await eng.generate(p, short)
        order.append("late")
        return out

    a, b, c, d = run_all([first(prompts[0]), first(prompts[1]), late(prompts[2]), late(prompts[3])])
    run(eng.close())
    # never 3 or 4 rows in one pass: one prefill pass per wave (slots too: a wave's two prompts, 5 and 21
    # tokens, share no 16-token block, so they are prefilled together, right padded)
    assert set(eng.stats.batch_sizes) == {2}, eng.stats.batch_sizes
    assert eng.stats.prefill_calls == 2 and order[:2] == ["first", "first"]
    # each wave's completions are the ones it gets alone (seeded rows, batches of exactly these two)
    alone = HFEngine(model_dir, max_batch_size=64, seed=0, deterministic=True, kv_cache=kv_cache)
    again = run_all([alone.generate(prompts[2], short), alone.generate(prompts[3], short)])
    run(alone.close())
    assert [c.token_ids, d.token_ids] == [x.token_ids for x in again]
    assert len(a.token_ids) <= 40 and len(b.token_ids) <= 40


def test_slots_a_leaving_row_costs_one_rows_copy(model_dir, prompts):
    """kv_cache=slots: when a row leaves, only the last row moves into its slot; nobody else is copied.

    One wave of A (2 tokens), B and C (6 tokens). A's 2nd token comes from decode step 1, after which A
    leaves and C moves into slot 0. C then holds its prompt + 1 token (the one fed to step 1). Bytes: keys
    and values (2) x 4 layers x 2 kv heads x 48 dims x 4 bytes (float32) = 3072 per token."""
    eng = HFEngine(model_dir, max_batch_size=8, seed=0, deterministic=True, kv_cache="slots", prefix_cache_tokens=0)
    a, b, c = prompts[0], prompts[1], prompts[4]
    run_all([eng.generate(a, GREEDY.replace(max_tokens=2)), eng.generate(b, GREEDY.replace(max_tokens=6)),
             eng.generate(c, GREEDY.replace(max_tokens=6))])
    run(eng.close())
    assert eng.stats.cache_copy_bytes == 3072 * (len(c) + 1)
    # the three prompts in one pass, right padded to the longest (c): 3 x len(c) positions computed
    assert eng.stats.prefill_calls == 1 and eng.stats.prefill_tokens == 3 * len(c)
    assert eng.stats.padded_positions > 3 * len(c) - (len(a) + len(b) + len(c)) > 0  # + the decode steps' padding


def test_slots_identical_prompts_of_a_wave_are_prefilled_once(model_dir, prompts):
    eng = HFEngine(model_dir, max_batch_size=8, seed=0, deterministic=True, kv_cache="slots")
    s = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(4)]
    outs = run_all([eng.generate(prompts[1], p) for p in s])
    run(eng.close())
    assert eng.stats.prefill_calls == 1 and eng.stats.prefill_tokens == len(prompts[1])
    alone = HFEngine(model_dir, max_batch_size=8, seed=0, deterministic=True, kv_cache="slots")
    solo = run(alone.generate(prompts[1], s[2]))
    run(alone.close())
    assert outs[2].token_ids == solo.token_ids  # a seeded row does not depend on its company
    assert outs[2].logprobs == pytest.approx(solo.logprobs, abs=1e-5)


def test_slots_prefix_store_is_per_wave_when_deterministic_and_emptied_by_a_weight_update(model_dir, prompts):
    """Deterministic waves start with an empty prefix store (a wave's numbers never depend on an earlier
    wave: exact resume); continuous batching keeps it until a weight update. The prompt is 40 + 1 tokens,
    so a repeat reuses 2 blocks of 16 = 32 tokens."""
    long = (prompts[4] * 3)[:40]
    p1, p2 = long + [5], long + [6]
    det = HFEngine(model_dir, max_batch_size=8, seed=0, deterministic=True, kv_cache="slots")
    run(det.generate(p1, GREEDY))
    run(det.generate(p2, GREEDY))
    run(det.close())
    assert det.stats.prefix_hit_tokens == 0
    cont = HFEngine(model_dir, max_batch_size=8, seed=0, deterministic=False, kv_cache="slots")
    try:
        run(cont.generate(p1, GREEDY))
        run(cont.generate(p2, GREEDY))
        assert cont.stats.prefix_hit_tokens == 32
        cont.update_weights({k: v.clone() for k, v in cont.model.state_dict().items()})
        run(cont.generate(p1, GREEDY))
        assert cont.stats.prefix_hit_tokens == 32  # emptied by the update: nothing reused
    finally:
        run(cont.close())


def test_prefill_chunk_tokens_needs_slots_and_continuous_batching(model_dir):
    with pytest.raises(ValueError, match=r"^engine.hf.prefill_chunk_tokens needs engine.hf.kv_cache=slots .*=8$"):
        HFEngine(model_dir, kv_cache="padded", deterministic=False, prefill_chunk_tokens=8)
    with pytest.raises(ValueError, match=r"^engine.hf.prefill_chunk_tokens needs engine.hf.deterministic=false"):
        HFEngine(model_dir, kv_cache="slots", deterministic=True, prefill_chunk_tokens=8)
    with pytest.raises(ValueError, match="prefill_chunk_tokens must be >= 0, got -1"):
        HFEngine(model_dir, kv_cache="slots", deterministic=False, prefill_chunk_tokens=-1)


def test_chunked_prefill_keeps_seeded_samples(model_dir):
    """Seeded sampled requests give the same tokens (logprobs within rounding) whether their prompts are
    prefilled whole or one token a step beside other rows' decode steps: a seeded row draws from its own
    generator, once per token, whenever it joins."""
    params = [SamplingParams(temperature=1.0, max_tokens=8 + i, seed=10 + i) for i in range(len(TEXTS))]
    outs = {}
    for chunk in (0, 1):
        eng = HFEngine(model_dir, max_batch_size=8, max_wait_ms=20.0, seed=0, deterministic=False,
                       kv_cache="slots", prefill_chunk_tokens=chunk)
        prompts = [eng.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
        try:
            outs[chunk] = run_all([eng.generate(p, s) for p, s in zip(prompts, params, strict=True)])
        finally:
            run(eng.close())
        if chunk:  # 5 + 21 + 6 + 1 + 28 = 61 prompt tokens, one a pass; rows decoded beside the queue
            assert eng.stats.prefill_calls == 61 - eng.stats.prefix_hit_tokens
            assert eng.stats.decode_steps_beside_prefill > 0
    for whole, chunked in zip(outs[0], outs[1], strict=True):
        assert chunked.token_ids == whole.token_ids and chunked.finish_reason == whole.finish_reason
        assert chunked.logprobs == pytest.approx(whole.logprobs, abs=1e-5)


def test_chunked_admission_counts_rows_still_prefilling(model_dir, ref_model, prompts):
    """max_batch_size bounds decoding rows plus rows whose prompt is part-way prefilled: with room for 2,
    a third request waits until one of the first two has finished, even while both are still prefilling."""
    eng = HFEngine(model_dir, max_batch_size=2, max_wait_ms=0.0, seed=0, deterministic=False, kv_cache="slots",
                   prefill_chunk_tokens=2, prefix_cache_tokens=0)
    seen = []
    admit = eng._queue_slots

    def queue(batch, reqs):
        seen.append(len(reqs) + (batch.prefilling_rows + len(batch) - sum(batch.done) if batch is not None else 0))
        return admit(batch, reqs)

    eng._queue_slots = queue
    try:
        outs = run_all([eng.generate(p, GREEDY.replace(max_tokens=4)) for p in prompts[:3]])
    finally:
        run(eng.close())
    assert max(seen) <= 2, seen
    for p, out in zip(prompts[:3], outs, strict=True):
        assert out.token_ids == greedy_reference(ref_model, p, 4, {eng.eos_token_id})


def test_prefix_cache_needs_slots(model_dir):
    with pytest.raises(ValueError, match="prefix_cache_tokens needs kv_cache='slots'"):
        HFEngine(model_dir, kv_cache="padded", prefix_cache_tokens=100)
    with pytest.raises(ValueError, match="kv_cache must be one of padded, slots, got 'paged'"):
        HFEngine(model_dir, kv_cache="paged")
