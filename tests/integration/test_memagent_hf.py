"""MemAgent end to end with a real (random) tiny Qwen2 through HFEngine: 8 tasks x 4 samples at once.

Checks the trajectory shape (ceil(context tokens / chunk) memory calls + 1 final call), that the engine's
ids and logprobs reach the segments, and, by counting forward passes, that requests were batched.
"""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest

from memrl.engines.hf import HFEngine
from memrl.models.tiny import cached_tiny_model, synthetic_corpus
from memrl.runtime import RolloutRuntime
from memrl.types import Task
from memrl.workflows import get_workflow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = cached_tiny_model("tiny", tmp_path_factory.getbasetemp() / "memrl-models")
    eng = HFEngine(path, device="cpu", max_batch_size=64, max_wait_ms=20.0, seed=0, deterministic=False)
    yield eng
    asyncio.run(eng.close())


def make_tasks(tokenizer, n: int, seed: int = 0) -> list[Task]:
    """Tasks with synthetic contexts of about 40, 100, 160, 220 tokens (1 to 4 chunks of 64)."""
    text = "\n\n".join(itertools.islice(synthetic_corpus(seed, num_blocks=400, num_names=200), 400))
    ids = tokenizer.encode(text, add_special_tokens=False)
    tasks = []
    for i in range(n):
        start = 997 * i
        context = tokenizer.decode(ids[start : start + 40 + 60 * (i % 4)])
        tasks.append(Task(task_id=f"t{i}", question=f"Who founded the town in document {i}?",
                          context=context, answers=["Kalomi"]))
    return tasks


def test_memagent_rollout_batches_through_hf_engine(engine):
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=64, max_memory_tokens=12, max_final_tokens=8, temperature=1.0)
    tok = engine.tokenizer
    tasks = make_tasks(tok, 8)
    expected_chunks = {t.task_id: math.ceil(len(tok.encode(t.context, add_special_tokens=False)) / 64) for t in tasks}
    assert sorted(set(expected_chunks.values())) == [1, 2, 3, 4]
    engine.stats.reset()

    with RolloutRuntime(engine, spec, cfg, concurrency=64, close_engine=False) as rt:
        groups = rt.run(asyncio.wait_for(rt.asample(tasks, 4, 0, score=True), 120))

    assert [g.task_id for g in groups] == [t.task_id for t in tasks]
    requests = 0
    for g in groups:
        assert len(g.trajectories) == 4
        for traj in g.trajectories:
            segs = traj.segments
            assert len(segs) == expected_chunks[g.task_id] + 1
            assert [s.info["kind"] for s in segs] == ["memory"] * (len(segs) - 1) + ["final"]
            assert [s.step for s in segs] == list(range(len(segs)))
            for s in segs:
                assert 1 <= len(s.response_ids) == len(s.response_logprobs)
                assert len(s.response_ids) <= (cfg.max_final_tokens if s.info["kind"] == "final" else cfg.max_memory_tokens)
                assert all(lp <= 0 for lp in s.response_logprobs)
                assert s.prompt_ids[-3:] == tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
            assert traj.reward in (0.0, 1.0)
            requests += len(segs)
    # sampled trajectories of one task differ (each has its own seed)
    assert len({tuple(t.segments[0].response_ids) for t in groups[0].trajectories}) > 1

    st = engine.stats
    assert st.requests == requests and st.completed == requests
    assert st.generated_tokens == sum(len(s.response_ids) for g in groups for s in g.segments())
    batched = sum(c for b, c in st.batch_sizes.items() if b > 1)
    assert batched > 0.8 * st.forward_calls, st.batch_sizes  # nearly every forward pass served several rows
    assert st.max_batch_size >= 16
    assert st.forward_calls * 5 < st.generated_tokens  # one-by-one decoding would need >= one pass per token
