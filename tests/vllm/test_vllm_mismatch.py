"""The train/inference mismatch metrics (docs/guides/async.md) on real engines: segments sampled by vLLM (CPU,
float32) and by the transformers engine, trained by a PolicyWorker on the same tiny model; the metrics
are logged under the engine kind, finite and small (both engines compute float32 on CPU)."""

from __future__ import annotations

import asyncio
import math

import pytest

from memrl.config import load_config
from memrl.engines.base import SamplingParams
from memrl.training.config import TrainConfig
from memrl.training.update.packing import weigh
from memrl.types import Segment

TEXTS = ["Who was the president of the river city?", "The answer is", "How many people live in the county?",
         "Document 1:\nKalo Miran\nThe band played music in the north village."]


def _segments(engine, temperature: float) -> list[Segment]:  # noqa: ANN001
    tok = engine.tokenizer
    prompts = [list(tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                       add_generation_prompt=True), add_special_tokens=False))
               for t in TEXTS]
    sampling = SamplingParams(temperature=temperature, max_tokens=16, seed=7)

    async def go():  # noqa: ANN202
        return await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))

    outs = asyncio.run(go())
    return [Segment(p, list(c.token_ids), list(c.logprobs), advantage=1.0 if i % 2 else -1.0, trajectory_id=str(i))
            for i, (p, c) in enumerate(zip(prompts, outs, strict=True))]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_mismatch_metrics_of_vllm_and_hf_segments(vllm_engine, hf_engine, tiny_model, tmp_path, temperature) -> None:  # noqa: ANN001
    from memrl.training.ranks.workers import PolicyWorker

    seen = {}
    for kind, engine in (("vllm", vllm_engine), ("hf", hf_engine)):
        cfg = load_config(TrainConfig, [f"model.path={tiny_model}", f"out_dir={tmp_path}", f"engine.name={kind}",
                                        "algorithm.kl_coef=0", f"algorithm.temperature={temperature}",
                                        "trainer.progress=false"])
        segs = _segments(engine, temperature)
        m = PolicyWorker(cfg).train_rows(weigh(segs, "token-mean"))
        got = {k.split("/")[-1]: v for k, v in m.items() if k.startswith(f"mismatch/{kind}/")}
        assert set(got) == {"abs_logprob_diff_mean", "kl_k3", "ratio_outside_share", "tokens"}, kind
        assert got["tokens"] == sum(len(s.response_ids) for s in segs)
        assert all(math.isfinite(v) for v in got.values()), got
        assert got["abs_logprob_diff_mean"] < 1e-3 and got["kl_k3"] < 1e-5, (kind, got)
        assert got["ratio_outside_share"] == 0.0, (kind, got)
        seen[kind] = got
    print(f"T={temperature}", seen)
