"""memrl.runtime: one event loop for every call of a run, the services built once per source and
closed with the runtime, the engine closed when owned, nothing usable after close()."""

from __future__ import annotations

import asyncio

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.runtime import RolloutRuntime
from memrl.services.session import Services
from memrl.types import Task
from memrl.workflows import get_workflow


class Closable:
    def __init__(self) -> None:
        self.closed = 0

    async def close(self) -> None:
        self.closed += 1


class Engine(ScriptedEngine):
    closes = 0

    async def close(self) -> None:
        type(self).closes += 1


def test_one_loop_for_every_stage_and_everything_closed_once(monkeypatch):
    import memrl.services.registry as registry

    made: list[Closable] = []

    def fake_http(kind, corpus, url):  # noqa: ANN001, ANN202 - build_retriever's url branch
        made.append(Closable())
        return made[-1]

    monkeypatch.setattr(registry, "build_retriever", fake_http)
    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=100, max_memory_tokens=20, max_final_tokens=20)
    engine = Engine(lambda prompt, i: "m" if i % 2 == 0 else "\\boxed{x}", tokenizer=CharTokenizer())
    loops = []
    rt = RolloutRuntime(engine, spec, cfg, concurrency=2)
    with rt:
        for seed in range(3):
            groups = rt.sample([Task(f"t{seed}", "Q?", "ctx", ["x"])], n=2, seed=seed)
            assert groups[0].task.task_id == f"t{seed}" and all(t.reward is None for t in groups[0].trajectories)
            scores = rt.score(groups)
            assert [len(s.step_rewards) for s in scores[0]] == [2, 2]  # memory call + final call
            loops.append(rt.run(_loop()))
        a = rt.services.retriever("bm25", None, "http://127.0.0.1:9")
        assert rt.services.retriever("bm25", None, "http://127.0.0.1:9") is a and len(made) == 1
    assert len(set(loops)) == 1  # one loop for the whole run
    assert made[0].closed == 1 and Engine.closes == 1 and rt.closed
    rt.close()  # idempotent
    assert made[0].closed == 1 and Engine.closes == 1
    with pytest.raises(RuntimeError, match="after close"):
        rt.run(_loop())
    with pytest.raises(RuntimeError, match="after close"):
        rt.services.retriever("bm25", None, "http://127.0.0.1:9")


def test_services_close_every_owned_client_even_when_one_fails():
    class Broken(Closable):
        async def close(self) -> None:
            raise OSError("gone")

    s = Services()
    good = Closable()
    s._owned += [Broken(), good]
    asyncio.run(s.aclose())
    assert good.closed == 1 and s.closed


async def _loop() -> int:
    return id(asyncio.get_running_loop())


def test_rollout_is_generation_only_unless_asked_to_score():
    """One default for `score`: the runner's rollout and the runtime's sample both generate only (False);
    the runtime passes its own on, so a direct runner call scores nothing either."""
    from memrl.workflows.rollouts import rollout

    spec = get_workflow("memagent")
    cfg = spec.config_cls(chunk_tokens=100, max_memory_tokens=20, max_final_tokens=20)
    engine = ScriptedEngine(lambda prompt, i: "m" if i % 2 == 0 else "\\boxed{x}", tokenizer=CharTokenizer())
    task = Task("t", "Q?", "ctx", ["x"])
    with RolloutRuntime(engine, spec, cfg, close_engine=False) as rt:
        direct = rt.run(rollout([task], spec, engine, cfg, n=1, services=rt.services))
        sampled = rt.sample([task], n=1, seed=0)
        scored = rt.sample([task], n=1, seed=0, score=True)
    assert direct[0].trajectories[0].reward is None and sampled[0].trajectories[0].reward is None
    assert scored[0].trajectories[0].reward == 1.0
