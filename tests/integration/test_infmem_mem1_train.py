"""End to end on CPU with the tiny random model: `memrl train workflow=infmem|mem1` runs RL steps that
change the weights and write a loadable checkpoint, and `memrl eval` on that checkpoint writes result rows
whose per-trajectory records carry the new actions (plans, retrievals, stops; internal states)."""

from __future__ import annotations

import json

import pytest
import torch

from memrl.cli import main
from memrl.data.tasks_jsonl import write_tasks
from memrl.eval.runner import RESULTS_FILE, read_results
from memrl.types import Task

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _tasks(tmp_path, mem1: bool):
    facts = "The Beatles were formed in Liverpool in 1960. Queen was formed in London in 1970. " * 3
    rows = []
    for i, (q, a) in enumerate([("Where was Queen formed?", "London"), ("When were the Beatles formed?", "1960")]):
        if mem1:
            rows.append(Task(f"m{i}", f"Answer the following 2 questions.\n1. {q}\n2. Who was formed in 1970?", "",
                             [a, "Queen"], meta={"sub_questions": [q, "Who was formed in 1970?"],
                                                 "sub_answers": [[a], ["Queen"]],
                                                 "documents": [facts[:80], facts[80:160]]}))
        else:
            rows.append(Task(f"i{i}", q, facts, [a]))
    path = tmp_path / "tasks.jsonl"
    write_tasks(path, rows)
    return path


def _weights(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


@pytest.mark.parametrize("workflow", ["infmem", "mem1"])
def test_train_then_eval(workflow, tiny_path, tmp_path):
    data = _tasks(tmp_path, workflow == "mem1")
    budgets = (["workflow.chunk_tokens=40", "workflow.max_memory_tokens=8", "workflow.max_plan_tokens=8",
                "workflow.max_final_tokens=4", "workflow.retrieve_passage_tokens=16", "workflow.max_chunks=4"]
               if workflow == "infmem" else
               ["workflow.max_turns=3", "workflow.max_turn_tokens=8", "workflow.retriever_scope=task",
                "workflow.topk=1"])
    out = tmp_path / "train"
    rc = main(["train", f"model.path={tiny_path}", "data.name=file", f"data.path={data}", f"out_dir={out}",
               f"workflow={workflow}", "trainer.steps=2", "trainer.batch_size=2", "algorithm.n=2", "optim.lr=1e-3",
               "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf", *budgets])
    assert rc in (0, None)
    ckpt = out / "checkpoints" / (out / "checkpoints" / "latest").read_text().strip()
    before, after = _weights(tiny_path), _weights(ckpt)
    assert any(not torch.equal(before[k], after[k]) for k in before), "two RL steps changed no weight"
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all("reward/mean" in x for x in lines)
    # the trajectory metrics (InfMem's reward terms and actions; MEM1's turns and peak context) are logged
    keys = (("traj/infmem_early_stop", "traj/retrievals", "traj/stop_step") if workflow == "infmem"
            else ("traj/turns", "traj/peak_context_tokens", "traj/multiq_correct"))
    assert all(k in lines[0] for k in keys), sorted(k for k in lines[0] if k.startswith("traj/"))

    ev = tmp_path / "eval"
    rc = main(["eval", "--model", str(ckpt), "--out", str(ev), "--no-progress", str(data), f"workflow={workflow}",
               *[b for b in budgets if "max_chunks" not in b]])
    assert rc in (0, None)
    rows = read_results(ev / RESULTS_FILE)
    assert len(rows) == 2
    for r in rows:
        kinds = [s["kind"] for s in r["steps"]]
        assert r["model_calls"] == len(kinds)
        if workflow == "infmem":
            # plan before every memory write, the final call last; a stop ends the plans early
            assert kinds[0] == "plan" and kinds[-1] == "final"
            assert kinds.count("plan") - kinds.count("memory") in (0, 1)
            assert {"retrievals", "stop_step", "stopped"} <= set(r["metrics"])
            assert r["retrievals"] == r["metrics"]["retrievals"] and r["stop_step"] == r["metrics"]["stop_step"]
        else:
            assert set(kinds) == {"turn"} and all("internal_state" in s["info"] for s in r["steps"])
            assert r["metrics"]["multiq_questions"] == 2.0 and "peak_context_tokens" in r["metrics"]
    rc = main(["eval", "report", str(ev), "--out", str(tmp_path / "report")])
    assert rc in (0, None)
    table = (tmp_path / "report" / "summary.md").read_text()
    assert "mean_model_calls" in table
    assert ("stop_rate" in table) == (workflow == "infmem")
    # the viewer's row API hands the page the new actions (memrl.viewer.data, what app.js renders)
    from memrl.viewer.data import Run

    run = Run.open(ev)
    steps = run.row(0)["steps"]
    if workflow == "infmem":
        assert steps[0]["info"]["action"] in ("retrieve", "stop", "none") and "memory_shown" in steps[0]["info"]
        assert all("retrieved" in s["info"] for s in steps if s["kind"] == "memory")
    else:
        assert all(s["info"]["action"] in ("search", "answer", "invalid") for s in steps)
