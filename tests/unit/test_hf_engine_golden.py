"""HFEngine's greedy outputs against the ones main's engine (engine.hf.kv_cache=padded, before issue 47)
recorded on one fixed model, in both cache layouts: the optimisations must not change a token.

The model is the tiny preset with every matrix redrawn from N(0, 0.08) (torch seed 0): the preset's own
random weights make greedy decoding repeat one token, which would let a wrong cache pass; these weights give
varied tokens whose top-2 logit gaps are mostly 0.04-0.5, far above float rounding (~1e-6).

The golden file tests/data/hf_engine_greedy_golden.json was written by this module run as a script with
main's memrl first on the path (`PYTHONPATH=<main checkout> python tests/unit/test_hf_engine_golden.py`),
before the slots layout existed. Hand check of that file: the first tokens of `wave` request 0 equal a plain
argmax loop without cache (test_golden_starts_as_a_plain_argmax_loop recomputes them).
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path

import pytest
import torch

GOLDEN = Path(__file__).parents[1] / "data" / "hf_engine_greedy_golden.json"
TEXTS = [
    "Hello there.",
    "Document 1:\nKalomi\nThe river was founded in 1875 by a band of",
    "<problem>Who won the race in the valley?</problem>",
    "x",
    "The answer is \\boxed{42}. " * 6,
    "Memory: the town was founded by Arlen Voss in 1901; the river is the Marne.\nQuestion: who founded it?",
]
MAX_TOKENS = [16, 3, 24, 9, 1, 20]


def varied_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    path = cached_tiny_model("tiny")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.08)
    return model, AutoTokenizer.from_pretrained(path)


def requests(tok):
    from memrl.engines.base import SamplingParams

    prompts = [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in MAX_TOKENS]
    return prompts, params


def scenarios(model, tok, counts: dict | None = None, **engine_kw) -> dict:
    """Every scenario's (tokens, logprobs, finish) per request, with HFEngine(**engine_kw); `counts` gets each
    scenario's (prefill passes, prefill chunks, decode steps beside a partial prefill, prompt positions
    computed in prefills, padding included)."""
    from memrl.engines.hf import HFEngine

    prompts, params = requests(tok)
    out: dict = {}
    counts = {} if counts is None else counts

    def count(name, eng):
        st = eng.stats
        counts[name] = (st.prefill_calls, st.prefill_chunks, st.decode_steps_beside_prefill, st.prefill_tokens)

    def collect(outs):
        return [{"tokens": o.token_ids, "logprobs": o.logprobs, "finish": o.finish_reason} for o in outs]

    # one wave: all six prompts admitted together (deterministic waves), plus each prompt a second time
    # (identical prompts admitted together). Chunked prefill refuses waves: there the twelve requests are
    # admitted together by continuous batching (max_batch_size 12: the worker takes them once all wait)
    if engine_kw.get("prefill_chunk_tokens"):
        eng = HFEngine(model, tokenizer=tok, max_batch_size=12, max_wait_ms=10_000.0, seed=0, deterministic=False,
                       **engine_kw)
    else:
        eng = HFEngine(model, tokenizer=tok, max_batch_size=16, seed=0, deterministic=True, **engine_kw)

    async def wave():
        return await asyncio.gather(*[eng.generate(p, s) for p, s in zip(prompts + prompts, params + params, strict=True)])

    out["wave"] = collect(asyncio.run(wave()))
    count("wave", eng)
    asyncio.run(eng.close())

    # continuous batching, staggered: the long request runs alone for 4 decode steps, then the others join;
    # rows leave at 1, 3, 9, ... tokens while the others go on
    eng = HFEngine(model, tokenizer=tok, max_batch_size=16, max_wait_ms=0.0, seed=0, deterministic=False,
                   **engine_kw)
    gate = threading.Event()
    forward = eng._forward

    def gated(*args, **kwargs):
        if eng.stats.decode_steps >= 4:
            assert gate.wait(30), "the others were never queued"
        return forward(*args, **kwargs)

    eng._forward = gated

    async def staggered():
        first = asyncio.ensure_future(eng.generate(prompts[2], params[2]))
        while eng.stats.decode_steps < 4:
            await asyncio.sleep(0.005)
        rest = [asyncio.ensure_future(eng.generate(p, s)) for i, (p, s) in enumerate(zip(prompts, params, strict=True))
                if i != 2]
        await asyncio.sleep(0)
        gate.set()
        return await asyncio.gather(first, *rest)

    try:
        out["staggered"] = collect(asyncio.run(asyncio.wait_for(staggered(), 120)))
        count("staggered", eng)
    finally:
        gate.set()
        asyncio.run(eng.close())

    # one after another, prompts sharing their first 40 tokens (MemAgent's calls share the template and the
    # problem): a prefix cache reuses 32 tokens (2 blocks of 16) for the second, 48 for the repeat
    eng = HFEngine(model, tokenizer=tok, max_batch_size=16, seed=0, deterministic=False, **engine_kw)
    head = (prompts[4] + prompts[5])[:40]
    shared = [head + prompts[1][:10], head + prompts[2][:7], head + prompts[1][:10]]

    async def one_by_one():
        return [await eng.generate(p, params[0]) for p in shared]

    out["shared_prefix"] = collect(asyncio.run(one_by_one()))
    out["shared_prefix_hits"] = getattr(eng.stats, "prefix_hit_tokens", 0)
    count("shared_prefix", eng)
    asyncio.run(eng.close())
    return out


@pytest.fixture(scope="module")
def model_tok():
    return varied_model()


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


# Prompt lengths in tokens: TEXTS -> 5, 22, 14, 1, 55, 35 (132); max_tokens 16, 3, 24, 9, 1, 20. With a
# chunk budget c the queued prompts form one token stream cut into steps of c tokens; a prefill pass ends at
# a step's end or a prompt's end; a pass that ends before its prompt's end is a chunk; a decode step runs
# every step, beside a partial prefill while the stream is unfinished after that step's prefill.
CHUNKED = {
    # c = 7. wave (the six distinct prompts, 132 tokens; no prompt starts with another's 16-token block):
    #   step cuts 7..126 (18) and prompt ends 5, 27, 41, 42, 97 (42 = 6 x 7 already a step cut): 22 cuts,
    #   23 passes, 23 - 6 = 17 chunks; prompts end in steps 1, 4, 6, 6, 14, 19 and decode 15, 2, 23, 8, 0, 19
    #   steps from there: rows run in every step 1..18 (prompt 2's rows until step 28) -> 18 beside.
    # staggered: prompt 2 alone, 14 tokens = 2 passes, 1 chunk, no row yet; it then decodes 4 steps before
    #   the other five (5, 22, 1, 55, 35 = 118 tokens) are queued and 18 steps after (24 tokens).
    #   Their stream: step cuts 7..112 (16), prompt ends 5, 27, 28 (= 4 x 7), 83 -> 19 cuts, 20 passes,
    #   15 chunks; prompt 2's row decodes in every step 1..16 of the stream -> 16 beside.
    # shared_prefix: one at a time, 50 - 0, 47 - 32, 50 - 48 tokens to compute: 8 + 3 + 1 passes, 7 + 2 + 0
    #   chunks, nothing decodes beside.
    7: {"wave": (23, 17, 18, 132), "staggered": (2 + 20, 1 + 15, 16, 14 + 118), "shared_prefix": (12, 9, 0, 67)},
    # c = 1: one pass per computed token, every pass but a prompt's last a chunk. wave: 132 passes, 126
    #   chunks; rows decode in steps 5-19 (prompt 0), 27-28 (prompt 1), 41-63 (prompt 2, 42-49 prompt 3):
    #   40 steps, all before step 132. staggered: 14 + 118 passes, 13 + 113 chunks; prompt 2's row decodes
    #   in stream steps 1-18, prompt 0's in 5-19, prompt 1's in 27-28, prompt 3's in 28-35 -> 19 + 9 = 28.
    #   shared_prefix: 50 + 15 + 2 passes, 49 + 14 + 1 chunks.
    1: {"wave": (132, 126, 40, 132), "staggered": (132, 126, 28, 132), "shared_prefix": (67, 64, 0, 67)},
    # Unchunked slots: an admission's distinct prompts are prefilled together, right padded to the longest.
    # wave: the six distinct prompts in one pass, 6 x 55 = 330 positions (198 of them padding). staggered:
    # prompt 2 alone (14), then the other five admitted together: 5 x 55 = 275. shared_prefix: one prompt at
    # a time, no padding: 50 + 15 + 2.
    0: {"wave": (1, 0, 0, 330), "staggered": (2, 0, 0, 14 + 275), "shared_prefix": (3, 0, 0, 67)},
}


@pytest.mark.parametrize(("kv_cache", "chunk"), [("padded", 0), ("slots", 0), ("slots", 7), ("slots", 1)])
def test_greedy_outputs_equal_mains_engine(model_tok, golden, kv_cache, chunk):
    counts: dict = {}
    got, golden = scenarios(*model_tok, counts, kv_cache=kv_cache, prefill_chunk_tokens=chunk), dict(golden)
    if kv_cache == "slots":
        assert counts == CHUNKED[chunk]
    else:  # padded: no pass stops inside a prompt, nothing prefills beside a decode step
        assert all(c[1:3] == (0, 0) for c in counts.values()), counts
    assert set(got) == set(golden) == {"wave", "staggered", "shared_prefix", "shared_prefix_hits"}
    # 40 shared tokens -> 2 whole blocks of 16 for the second prompt; the repeat of the first (50 tokens)
    # reuses 3 blocks (48), leaving 2 to compute: 32 + 48 (padded has no prefix cache)
    assert got.pop("shared_prefix_hits") == (80 if kv_cache == "slots" else 0)
    assert golden.pop("shared_prefix_hits") == 0  # main's engine
    for name, rows in golden.items():
        assert len(got[name]) == len(rows)
        for i, (g, want) in enumerate(zip(got[name], rows, strict=True)):
            assert g["tokens"] == want["tokens"], (kv_cache, name, i)
            assert g["finish"] == want["finish"], (kv_cache, name, i)
            assert g["logprobs"] == pytest.approx(want["logprobs"], abs=1e-5), (kv_cache, name, i)
    # the recorded completions end where their max_tokens says (no EOS is hit by these weights)
    assert [len(r["tokens"]) for r in golden["wave"]] == MAX_TOKENS + MAX_TOKENS


def test_slots_batched_prefill_with_shared_prefixes_equals_padded(model_tok):
    """Unequal prompts sharing starts admitted together (one wave): slots prefills them in two batched,
    right-padded passes (the leaders, then the rest after their stored prefix) and gives the padded engine's
    greedy outputs (the padded engine equals the golden file above; its code is not the one under test)."""
    from memrl.engines.base import SamplingParams
    from memrl.engines.hf import HFEngine

    model, tok = model_tok
    prompts, _ = requests(tok)
    head = (prompts[4] + prompts[5])[:40]
    a, b, c = head + prompts[1][:10], head + prompts[2][:7], head[:36] + prompts[0]  # 50, 47, 41 tokens
    d, e = prompts[5], prompts[0]  # 35 and 5 tokens, no 16-token block shared with anyone
    wave = [a, b, c, d, e, a]
    params = [SamplingParams(temperature=0.0, max_tokens=m) for m in (12, 7, 9, 5, 14, 12)]
    outs, stats = {}, {}
    for kv_cache in ("padded", "slots"):
        eng = HFEngine(model, tokenizer=tok, max_batch_size=16, seed=0, deterministic=True, kv_cache=kv_cache)

        async def go(eng=eng):
            return await asyncio.gather(*[eng.generate(p, s) for p, s in zip(wave, params, strict=True)])

        outs[kv_cache] = asyncio.run(go())
        stats[kv_cache] = eng.stats
        asyncio.run(eng.close())
    for i, (g, want) in enumerate(zip(outs["slots"], outs["padded"], strict=True)):
        assert g.token_ids == want.token_ids and g.finish_reason == want.finish_reason, i
        assert g.logprobs == pytest.approx(want.logprobs, abs=1e-5), i
    st = stats["slots"]
    # Leaders: a (first of its first block), d, e; b and c start with a's first block and wait for it; the
    # repeat of a is prefilled once. Pass 1: e, d, a right padded to 50: 3 x 50 = 150 positions (5 + 35 + 50
    # = 90 real, 60 padding). Pass 2: b and c both find a's first 32 tokens stored (2 blocks; b's third
    # block differs from a's at token 40, c's at token 36): 47 - 32 = 15 and 41 - 32 = 9 to compute,
    # 2 x 15 = 30 positions (6 padding), 2 x 32 = 64 tokens from the prefix cache.
    assert (st.prefill_calls, st.prefill_tokens, st.prefix_hit_tokens) == (2, 150 + 30, 64)
    # padded: one pass over the six prompts left padded to 50 (all six computed, the repeat too)
    assert (stats["padded"].prefill_calls, stats["padded"].prefill_tokens) == (1, 6 * 50)


def test_slots_prefill_passes_keep_to_max_prefill_tokens(model_tok, golden):
    """An admission whose prompts exceed max_prefill_tokens together is split into passes that each keep
    rows x longest prompt within it. (The engine's admission already keeps that bound for the padded
    layout, so this calls the slots admission directly with three prompts.)"""
    from memrl.engines.base import SamplingParams
    from memrl.engines.hf import HFEngine

    model, tok = model_tok
    prompts, _ = requests(tok)
    which = [4, 0, 5]  # 55, 5 and 35 tokens
    eng = HFEngine(model, tokenizer=tok, max_batch_size=16, seed=0, deterministic=True, kv_cache="slots",
                   max_prefill_tokens=75)

    async def admit():
        reqs = [eng._make_request(prompts[i], SamplingParams(temperature=0.0, max_tokens=4)) for i in which]
        with torch.inference_mode():
            eng._admit_slots(None, reqs)
        return reqs

    reqs = asyncio.run(admit())
    asyncio.run(eng.close())
    # sorted by length 5, 35, 55: 5 and 35 together (2 x 35 = 70 <= 75; with 55 it would be 3 x 55 = 165),
    # then 55 alone: 2 passes, 70 + 55 = 125 positions, 30 of them padding (35 - 5)
    assert (eng.stats.prefill_calls, eng.stats.prefill_tokens, eng.stats.padded_positions) == (2, 125, 30)
    for r, i in zip(reqs, which, strict=True):  # the first token of each, as recorded from main's engine
        assert r.tokens[0] == golden["wave"][i]["tokens"][0], i
        assert r.logprobs[0] == pytest.approx(golden["wave"][i]["logprobs"][0], abs=1e-5), i


def test_golden_starts_as_a_plain_argmax_loop(model_tok, golden):
    """The recorded tokens are the model's argmax continuation (full forward, no cache, no batch)."""
    model, tok = model_tok
    prompts, _ = requests(tok)
    for i in (0, 2, 5):
        ids, want = list(prompts[i]), golden["wave"][i]["tokens"][:6]
        got = []
        with torch.no_grad():
            for _ in range(len(want)):
                got.append(int(model(torch.tensor([ids + got])).logits[0, -1].argmax()))
        assert got == want, i


def record() -> None:
    model, tok = varied_model()
    GOLDEN.write_text(json.dumps(scenarios(model, tok), indent=None) + "\n")
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    record()
    sys.exit(0)
