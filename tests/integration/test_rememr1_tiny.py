"""ReMemR1 end to end with a real (random) tiny model on CPU: rollout, step rewards, multi-level advantage.

A random model writes garbage; the workflow must count it, never crash, and still produce training rows.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks
from memrl.runtime import rollout_once
from memrl.workflows import get_workflow
from memrl.workflows.rememr1 import FORMAT_FLAGS, ReMemR1Config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    pytest.importorskip("transformers")
    from memrl.models.tiny import cached_tiny_model

    path = cached_tiny_model("tiny")
    try:
        from memrl.engines.hf import HFEngine
    except ImportError:
        pytest.skip("memrl.engines.hf is not available")
    eng = HFEngine(str(path), device="cpu", max_batch_size=16, seed=0, deterministic=False)
    yield eng
    asyncio.run(eng.close())


def test_random_tiny_model_rollout_step_rewards_and_advantages(engine):
    from memrl.algorithms.advantages import compute_group_advantages

    tasks = make_lookback_tasks(LookbackConfig(num_chunks=3, chunk_words=24), 2, seed=0)
    cfg = ReMemR1Config(chunk_tokens=32, max_memory_tokens=24, max_final_tokens=8, temperature=1.0)
    groups = rollout_once(tasks, get_workflow("rememr1"), engine, cfg, n=2, seed=0)
    assert [len(g.trajectories) for g in groups] == [2, 2]
    for g in groups:
        for traj in g.trajectories:
            assert traj.reward in (0.0, 1.0)
            kinds = [s.info["kind"] for s in traj.segments]
            assert kinds[-1] == "final" and set(kinds[:-1]) == {"memory"}
            assert all(s.step_reward is not None and math.isfinite(s.step_reward) for s in traj.segments)
            m = traj.metrics
            assert m["format_errors"] == sum(not s.info["format_ok"] for s in traj.segments[:-1])
            assert all(k in m for k in FORMAT_FLAGS)
            for s in traj.segments:
                assert len(s.response_ids) == len(s.response_logprobs) >= 1
                assert all(lp <= 0 for lp in s.response_logprobs)
    compute_group_advantages(groups, "rememr1", alpha=0.8)
    assert all(s.advantage is not None and math.isfinite(s.advantage) for g in groups for s in g.segments())
