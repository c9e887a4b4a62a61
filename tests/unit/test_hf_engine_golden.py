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


def scenarios(model, tok, **engine_kw) -> dict:
    """Every scenario's (tokens, logprobs, finish) per request, with HFEngine(**engine_kw)."""
    from memrl.engines.hf import HFEngine

    prompts, params = requests(tok)
    out: dict = {}

    def collect(outs):
        return [{"tokens": o.token_ids, "logprobs": o.logprobs, "finish": o.finish_reason} for o in outs]

    # one wave: all six prompts admitted together (deterministic waves), plus each prompt a second time
    # (identical prompts admitted together)
    eng = HFEngine(model, tokenizer=tok, max_batch_size=16, seed=0, deterministic=True, **engine_kw)

    async def wave():
        return await asyncio.gather(*[eng.generate(p, s) for p, s in zip(prompts + prompts, params + params, strict=True)])

    out["wave"] = collect(asyncio.run(wave()))
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
    asyncio.run(eng.close())
    return out


@pytest.fixture(scope="module")
def model_tok():
    return varied_model()


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.mark.parametrize("kv_cache", ["padded", "slots"])
def test_greedy_outputs_equal_mains_engine(model_tok, golden, kv_cache):
    got, golden = scenarios(*model_tok, kv_cache=kv_cache), dict(golden)
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
