"""One client of each service per run (issue 29): 50 training steps and one `memrl eval` run against a real
retrieval service (`memrl serve retrieval`, a subprocess) and an OpenAI-compatible judge (a thread), both
on 127.0.0.1 free ports, started and stopped here. Every httpx.AsyncClient made is counted (by patching
its constructor) and must be closed when the run ends.

Training runs `Trainer.fit` over MemAct with a scripted policy (`Trainer(assemble(..., workers=, engine=))`: a ScriptedEngine and
stub workers, no model), so the 50 steps take seconds; the clients are the runtime's whatever the engine.
Eval runs `memrl.eval.runner.evaluate` with engine=openai against CompletionServer in tests/doubles.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from doubles import JsonServer, retrieval_server

from memrl.types import Task

CORPUS = [{"id": "d1", "title": "Tower", "text": "The tower stands in Paris."},
          {"id": "d2", "title": "Bridge", "text": "The bridge is in London."}]


@pytest.fixture(scope="module")
def retriever_url(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    with retrieval_server(corpus) as (url, _):
        yield url


class Judge:
    """Says CORRECT when the predicted answer names Paris, INCORRECT otherwise; counts requests."""

    def __init__(self) -> None:
        self.calls = 0
        self.server = JsonServer(self.reply, "/v1")
        self.url = self.server.url

    def reply(self, body: dict) -> dict:
        self.calls += 1
        verdict = "CORRECT" if "Predicted answer: Paris" in body["messages"][0]["content"] else "INCORRECT"
        return {"choices": [{"message": {"role": "assistant", "content": verdict}}]}

    def stop(self) -> None:
        self.server.stop()


@pytest.fixture
def judge():
    j = Judge()
    yield j
    j.stop()


@pytest.fixture
def clients(monkeypatch):
    """Every httpx.AsyncClient made while the test runs: [client, ...]; `closed` tells which were closed."""
    made: list[httpx.AsyncClient] = []
    init = httpx.AsyncClient.__init__

    def counting_init(self, *args, **kwargs):  # noqa: ANN001, ANN202
        made.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(httpx.AsyncClient, "__init__", counting_init)
    return made


def closed(c: httpx.AsyncClient) -> bool:
    return c.is_closed


def search(query: str) -> str:
    return "<tool_call>" + json.dumps({"name": "search", "arguments": {"query": query}}) + "</tool_call>"


def policy(prompt: str, idx: int) -> str:
    """Search once, then answer from the result (Paris when the search found the tower)."""
    if "Search results" not in prompt:
        return search("tower")
    return "FINAL_ANSWER: Paris" if "stands in Paris" in prompt else "FINAL_ANSWER: Rome"


WORKFLOW = {"name": "memact", "no_prune_prob": 0.0, "max_turn_tokens": 200, "max_assistant_turns": 3,
            "system_template": "S", "user_template": "{question}|{answer_format}"}


class StubWorkers:
    def __init__(self) -> None:
        self.steps = 0
        self.closed = False

    def train_rows(self, rows, step_scheduler=True):  # noqa: ANN001, ANN201
        self.steps += 1
        return {"train/rows": float(len(rows))}

    def weights_for_engines(self):  # noqa: ANN201
        return {}

    def save(self, root, step, state, keep=0, extra_files=None):  # noqa: ANN001, ANN201
        return Path(root) / f"step_{step:06d}"

    def close(self) -> None:
        self.closed = True


def test_50_training_steps_make_one_client_per_service(tmp_path, retriever_url, judge, clients):
    from doubles import CharTokenizer, ScriptedEngine

    from memrl.training.assemble import assemble
    from memrl.training.config import TrainConfig
    from memrl.training.trainer import Trainer

    cfg = TrainConfig()
    cfg.out_dir = str(tmp_path / "run")
    cfg.model.path = "stub"  # the stub workers load nothing; the config is checked as any run's
    cfg.data.name, cfg.data.path = "file", "unused.jsonl"
    cfg.workflow = {**WORKFLOW, "retriever_url": retriever_url, "judge": {"url": judge.url, "model": "judge"}}
    cfg.algorithm.name, cfg.algorithm.n = "grpo", 2
    cfg.trainer.steps, cfg.trainer.batch_size, cfg.trainer.concurrency = 50, 2, 4
    tasks = [Task(f"q{i}", "Where is the tower?", "", ["Paris"]) for i in range(3)]
    workers = StubWorkers()
    trainer = Trainer(assemble(cfg, workers=workers, engine=ScriptedEngine(policy, tokenizer=CharTokenizer()), tasks=tasks))
    history = trainer.fit()
    assert len(history) == 50 and workers.steps == 50 and workers.closed and trainer.parts.runtime.closed
    # every trajectory searched once (through the service) and was judged correct by the judge server
    assert all(h["reward/mean"] == 1.0 and h["judge/correct"] == 4.0 and h["traj/searches"] == 1.0
               for h in history)
    assert judge.calls == 50 * 2 * 2
    assert "rollout/memory_tokens_mean" not in history[0]  # MemAgent's metric is not a MemAct run's
    assert len(clients) == 2, f"{len(clients)} AsyncClients for one run: one retriever, one judge expected"
    assert all(closed(c) for c in clients)


def test_eval_makes_one_client_per_service_and_engine(tmp_path, retriever_url, judge, clients):
    from doubles import CompletionServer, ScriptedEngine
    from transformers import AutoTokenizer

    from memrl.data.memagent_files import write_eval_json
    from memrl.engines.config import EngineConfig, OpenAISection
    from memrl.eval.runner import EvalConfig, evaluate
    from memrl.models.tiny import cached_tiny_model

    model = cached_tiny_model("tiny")
    data = tmp_path / "eval.json"
    write_eval_json(data, [Task(f"q{i}", "Where is the tower?", "", ["Paris"]) for i in range(6)])
    server = CompletionServer(ScriptedEngine(policy, tokenizer=AutoTokenizer.from_pretrained(model)))
    with server:
        cfg = EvalConfig(workflow={**WORKFLOW, "temperature": 0.0, "retriever_url": retriever_url,
                                   "judge": {"url": judge.url, "model": "judge"}},
                         engine=EngineConfig(name="openai", model=model, openai=OpenAISection(base_url=server.url)),
                         concurrency=3, progress=False)
        rows = evaluate([data], tmp_path / "out", cfg)
    assert len(rows) == 6 and all(r["reward"] == 1.0 for r in rows)
    assert judge.calls == 6
    assert len(clients) == 3, f"{len(clients)} AsyncClients: one engine, one retriever, one judge expected"
    assert all(closed(c) for c in clients)
