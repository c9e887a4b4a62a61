"""memrl.eval.evaluator (the one evaluator): standard errors over tasks, paired gains, and the evaluation of a scripted
engine through the real MemAgent workflow (exact, hand-checked accuracies)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math

import pytest

from memrl.data.synthetic import SyntheticConfig, corpus_text, make_tasks
from memrl.demonstrators import RecentFactsDemonstrator, ScriptedEngine
from memrl.eval.evaluator import (
    EngineRollout,
    accuracy,
    eval_record,
    evaluate_rows,
    group_rows,
    mean_and_se,
    paired_gain,
    pass_at_k,
    row_mean,
)
from memrl.models.tiny import train_tokenizer
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"


def test_mean_and_se_by_hand():
    # mean 0.5; sample variance (0.25 + 0.25 + 0 + 0) / 3 = 1/6; SE = sqrt(1/6 / 4)
    assert mean_and_se([1.0, 0.0, 0.5, 0.5]) == pytest.approx((0.5, math.sqrt(1 / 24)))
    assert mean_and_se([0.7]) == (0.7, 0.0)
    with pytest.raises(ValueError, match="no tasks"):
        mean_and_se([])


def test_paired_gain_is_the_se_of_the_differences():
    before, after = [0.0, 0.5, 1.0, 0.25], [0.5, 0.5, 1.0, 0.75]
    # differences 0.5, 0, 0, 0.5: mean 0.25, variance (4 * 0.0625) / 3, SE = sqrt(1/12 / 4) = 0.1443
    g, se = paired_gain(before, after)
    assert g == pytest.approx(25.0) and se == pytest.approx(100 * math.sqrt(1 / 48))
    with pytest.raises(ValueError, match="same tasks"):
        paired_gain([0.0], [0.0, 1.0])


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("tok") / "corpus.txt"
    corpus.write_text(corpus_text(extra=(MT, FT, "No previous memory", "\\boxed{ red}") * 50),
                      encoding="utf-8")
    return train_tokenizer([corpus], 2048)


def test_scripted_engine_accuracy_and_se_over_tasks(tokenizer):
    # The question-blind rule with skip 0 keeps the newest fact and answers with it: right exactly when the
    # question's fact sits in the document's last piece. Deterministic, so every sample of a task agrees,
    # and the SE must count TASKS (40), not tasks x samples (120).
    syn = SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start")
    tasks = make_tasks(syn, 40, seed=11)
    right = [1.0 if list(t.meta["fact_chunks"].values()) == [2] else 0.0 for t in tasks]
    k = sum(right)
    assert 0 < k < 40
    wf = MemAgentConfig(chunk_tokens=8, max_memory_tokens=10, max_final_tokens=6, memory_template=MT,
                        final_template=FT)
    engine = ScriptedEngine(RecentFactsDemonstrator(MT, FT, skip_prob=0.0), tokenizer=tokenizer)
    rows = evaluate_rows(EngineRollout(engine, get_workflow("memagent")), wf, tasks, samples=3, temperature=1.0, seed=5)
    res = eval_record(rows, 3, 1.0)
    p = k / 40
    assert res["per_task"] == right
    assert res["accuracy"] == pytest.approx(100 * p)
    assert res["se"] == pytest.approx(100 * math.sqrt(p * (1 - p) * 40 / 39 / 40))  # ddof 1 over 40 tasks
    assert (res["num_tasks"], res["samples"], res["temperature"]) == (40, 3, 1.0)
    assert len(engine.calls) == 40 * 3 * 4  # 3 memory calls + 1 final per trajectory
    assert res["metrics"]["answer_kept"] == pytest.approx(100 * p) and res["metrics"]["no_box"] == 0.0
    # every sample of a task agrees, so pass@3 (each task's best) is the accuracy, with the same SE over tasks
    assert accuracy(rows) == pass_at_k(rows) == (res["accuracy"], res["se"])
    # the MemAgent demo's protocol: greedy then sampled at each length, the length the rows' bucket
    from memrl.recipes.memagent import DemoEval, evaluate_lengths

    both = evaluate_lengths(EngineRollout(engine, get_workflow("memagent")), wf, {3: tasks}, DemoEval(samples=2, seed=5))
    assert list(both["3"]) == ["greedy", "sampled"] and both["3"]["greedy"]["per_task"] == right
    assert (both["3"]["greedy"]["samples"], both["3"]["sampled"]["samples"]) == (1, 2)
    with pytest.raises(ValueError, match="samples must be 1"):
        evaluate_rows(EngineRollout(engine, get_workflow("memagent")), wf, tasks, samples=2, temperature=0.0)


def test_binomial_se_is_ddof_0():
    # 0/1 values with p = 3/4 over 4 tasks: sum of squared deviations 3 * 1/16 + 9/16 = 3/4;
    # ddof 0: sqrt(3/4 / 4 / 4) = sqrt(p (1 - p) / n) = 0.2165; ddof 1: sqrt(3/4 / 3 / 4) = 0.25
    assert mean_and_se([1.0, 0.0, 1.0, 1.0], ddof=0) == pytest.approx((0.75, math.sqrt(0.75 * 0.25 / 4)))
    assert mean_and_se([1.0, 0.0, 1.0, 1.0]) == pytest.approx((0.75, 0.25))
    # values other than 0/1: squared deviations 1/16 + 1/16 over n = 2, SE = sqrt(1/16 / 2) = 0.1768
    assert mean_and_se([0.5, 1.0], ddof=0) == pytest.approx((0.75, math.sqrt(1 / 32)))
    with pytest.raises(ValueError, match="ddof"):
        mean_and_se([1.0, 0.0], ddof=2)


def _draw_spec():
    """A workflow whose trajectory is one draw of its rng (reward = the draw): which seed a sample got."""
    from memrl.types import Trajectory
    from memrl.workflows import WorkflowSpec

    async def run(task, engine, cfg, rng):
        return Trajectory(task.task_id, "", [], metrics={"context_tokens": 3.0}, info={"draw": rng.random()})

    return WorkflowSpec("draw", run, MemAgentConfig, lambda task, traj: traj.info["draw"])


def test_rollout_sample_k_is_seeded_as_the_kth_trajectory():
    from memrl.types import Task
    from memrl.workflows.rollouts import trajectory_rng

    tasks = [Task(f"t{i}", "q", "c", ["a"]) for i in range(3)]
    rollout = EngineRollout(None, _draw_spec())
    together = rollout(tasks, MemAgentConfig(), n=3, seed=9)
    started = []
    for k in range(3):
        alone = rollout(tasks, MemAgentConfig(), 1, 9, first_sample=k, on_start=lambda t: started.append(t.task_id))
        assert [g.rewards[0] for g in alone] == [g.rewards[k] for g in together] == \
            [trajectory_rng(9, t.task_id, k).random() for t in tasks]
    assert started == ["t0", "t1", "t2"] * 3
    with pytest.raises(ValueError, match="needs n=1"):
        rollout(tasks, MemAgentConfig(), 2, 9, first_sample=1)
    # the per-task mean over samples, then mean and SE over tasks; pass@k over each task's best sample
    rows = evaluate_rows(rollout, MemAgentConfig(), tasks, samples=3, temperature=1.0, seed=9)
    res = eval_record(rows, 3, 1.0)
    assert res["per_task"] == [sum(g.rewards) / 3 for g in together]
    assert (res["accuracy"], res["se"]) == tuple(100 * x for x in mean_and_se(res["per_task"]))
    assert pass_at_k(rows) == tuple(100 * x for x in mean_and_se([max(g.rewards) for g in together]))
    assert res["metrics"] == {"context_tokens": 3.0, "no_box": 0.0, "answer_seen": 0.0, "answer_kept": 0.0}
    # results.json's record of one evaluation: these keys, in this order
    assert list(res) == ["accuracy", "se", "num_tasks", "samples", "temperature", "metrics", "seconds", "per_task"]


def test_one_task_records_se_0_and_row_means_are_exact():
    from memrl.types import Task

    rows = evaluate_rows(EngineRollout(None, _draw_spec()), MemAgentConfig(), [Task("t", "q", "c", ["a"])])
    res = eval_record(rows, 1, 0.0, seconds=2.5, metrics=("context_tokens",))
    draw = rows[0]["reward"]
    assert res == {"accuracy": 100 * draw, "se": 0.0, "num_tasks": 1, "samples": 1, "temperature": 0.0,
                   "metrics": {"context_tokens": 3.0}, "seconds": 2.5, "per_task": [draw]}
    # math.fsum: ten rows of 0.1 sum to exactly 1.0 (a plain sum gives 0.9999999999999999)
    tenths = [{"metrics": {"x": 0.1}} for _ in range(10)] + [{"metrics": {}}] * 10  # a missing metric counts 0
    assert row_mean(tenths[:10], "x") == 0.1 and row_mean(tenths, "x") == 0.05


def test_summaries_need_one_trajectory_per_task():
    from memrl.eval.fields import summary_rows
    from memrl.recipes import context, mem1, memact
    from memrl.types import Task

    rows = evaluate_rows(EngineRollout(None, _draw_spec()), MemAgentConfig(), [Task("t", "q", "c", ["a"])], 2, 1.0)
    for who, fields in (("memact", memact.FIELDS), ("context", context.FIELDS), ("mem1", mem1.FIELDS)):
        with pytest.raises(ValueError, match=f"{who}: 2 rows for 1 tasks; one trajectory per task"):
            summary_rows(rows, fields)


def test_reading_summary_scores_the_exact_match_outcome():
    """InfMem's reward mixes in early-stop and format terms: its accuracy is the outcome term (infmem_outcome);
    MemAgent's reward is the outcome. By hand over three tasks, one row each."""
    from memrl.eval.fields import summary_rows
    from memrl.recipes.infmem import FIELDS

    rows = [
        {"task_id": "a", "reward": 0.9, "metrics": {"infmem_outcome": 0.0, "model_calls": 5.0, "memory_steps": 2.0,
                                                    "num_chunks": 4.0, "stopped": 1.0, "stop_step": 2.0}},
        {"task_id": "b", "reward": 0.3, "metrics": {"infmem_outcome": 1.0, "model_calls": 9.0, "memory_steps": 4.0,
                                                    "num_chunks": 4.0, "stopped": 0.0, "stop_step": 4.0}},
        {"task_id": "c", "reward": 1.0, "metrics": {"model_calls": 5.0, "memory_steps": 4.0, "num_chunks": 4.0}},
    ]
    (s,) = summary_rows([{**r, "policy": "rl", "decoding": "greedy", "bucket": 4} for r in rows], FIELDS)
    assert (s["policy"], s["decoding"], s["bucket"]) == ("rl", "greedy", "4")
    # outcomes 0, 1, 1: mean 2/3, sample sd sqrt(1/3), SE sqrt(1/3 / 3) = 1/3
    assert s["accuracy"] == pytest.approx(200 / 3) and s["accuracy_se"] == pytest.approx(100 / 3)
    assert (s["model_calls"], s["chunks_read"], s["chunks"]) == (19 / 3, 10 / 3, 4.0)
    assert (s["stop_rate"], s["stop_step"], s["num_tasks"]) == (100 / 3, 2.0, 3.0)


def test_memact_accuracy_per_question_count_follows_the_tasks_counts():
    """MemAct's summary has one accuracy per question count its config draws (memrl.recipes.memact.fields_for):
    the mean reward of the rows with that many sub-questions, None where no row has it. By hand: rewards 1, 0
    at 2 questions, 1 at 3."""
    from memrl.eval.fields import summary_rows
    from memrl.recipes.memact import FIELDS, fields_for

    rows = [{"task_id": t, "policy": "sft", "decoding": "greedy", "bucket": "all", "reward": rew,
             "metrics": {"multiq_questions": q, "peak_context_tokens": 10.0 * q}}
            for t, rew, q in (("a", 1.0, 2.0), ("b", 0.0, 2.0), ("c", 1.0, 3.0))]
    assert [f.name for f in fields_for([3, 2, 5])] == [f.name for f in FIELDS] + ["accuracy_2q", "accuracy_3q",
                                                                                  "accuracy_5q"]
    (s,) = summary_rows(rows, fields_for([3, 2, 5]))
    assert (s["accuracy_2q"], s["accuracy_3q"], s["accuracy_5q"]) == (50.0, 100.0, None)
    # 2 of 3 right: 66.7%, binomial SE sqrt(p (1 - p) / 3); the largest peak, the mean one
    assert s["accuracy"] == pytest.approx(200 / 3) and s["accuracy_se"] == pytest.approx(100 * (2 / 27) ** 0.5)
    assert (s["max_context_tokens"], s["peak_context_tokens"], s["num_tasks"]) == (30.0, 70 / 3, 3.0)


def test_every_evaluation_is_rows_with_its_labels(tmp_path):
    """The one evaluation row: task, sample, policy, decoding, bucket, seed, held-out digest, the workflow's own
    columns, reward and metrics; results.json's numbers (eval_record) are computed from the rows."""
    from memrl.eval.evaluator import ROW_COLUMNS, tasks_sha256
    from memrl.types import Task
    from memrl.workflows.rollouts import trajectory_rng

    tasks = [Task(f"t{i}", "q", "c", ["a"]) for i in range(2)]
    spec = dataclasses.replace(_draw_spec(), row_columns=lambda traj: {"half": traj.info["draw"] / 2})
    digest = tasks_sha256(tasks)
    path = tmp_path / "r" / "sft.jsonl"
    labels = {"bucket": 5, "policy": "sft", "heldout_sha256": digest, "rows_to": path}
    greedy = evaluate_rows(EngineRollout(None, spec), MemAgentConfig(), tasks, 1, 0.0, 9, **labels)
    sampled = evaluate_rows(EngineRollout(None, spec), MemAgentConfig(), tasks, 2, 1.0, 9, **labels)
    draw = {(t, k): trajectory_rng(9, t, k).random() for t in ("t0", "t1") for k in range(2)}
    assert sampled == [
        {"task_id": t, "sample": k, "policy": "sft", "decoding": "sampled", "bucket": 5, "seed": 9,
         "heldout_sha256": digest, "half": draw[t, k] / 2, "reward": draw[t, k], "metrics": {"context_tokens": 3.0}}
        for t in ("t0", "t1") for k in range(2)]
    assert [(r["task_id"], r["decoding"], r["reward"]) for r in greedy] == [
        ("t0", "greedy", draw["t0", 0]), ("t1", "greedy", draw["t1", 0])]
    assert tuple(sampled[0])[2:7] == ROW_COLUMNS
    rec = eval_record(sampled, 2, 1.0)
    p0, p1 = (draw["t0", 0] + draw["t0", 1]) / 2, (draw["t1", 0] + draw["t1", 1]) / 2
    assert rec["per_task"] == [p0, p1] and rec["num_tasks"] == 2
    # two tasks: mean (p0 + p1) / 2, sample sd |p0 - p1| / sqrt(2), SE |p0 - p1| / 2
    assert rec["accuracy"] == pytest.approx(50 * (p0 + p1)) and rec["se"] == pytest.approx(50 * abs(p0 - p1))
    # grouped by (policy, decoding, bucket) in first-seen order, each group's rows in their order
    both = greedy + sampled
    assert group_rows(both) == {("sft", "greedy", 5): greedy, ("sft", "sampled", 5): sampled}
    assert list(group_rows(both, by=("task_id",))) == [("t0",), ("t1",)]
    # the digest: SHA-256 of the tasks' [id, question, context, answers] JSON lines
    assert digest == hashlib.sha256(b'["t0", "q", "c", ["a"]]\n["t1", "q", "c", ["a"]]\n').hexdigest()
    # written as they are made: greedy then sampled, appended to the file
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(x) for x in lines] == greedy + sampled
    with pytest.raises(ValueError, match="task t0 has 2 rows, not 1"):
        eval_record(sampled, 1, 1.0)


@pytest.mark.parametrize("method", ["memact", "context"])
def test_one_bucket_evaluations_label_their_rows_all(tmp_path, method):
    """MemAct's and the context family's held-out evaluations have one bucket (no lengths): their rows say
    "all" (memrl.eval.evaluator.ROW_COLUMNS), the name the tables give a single or pooled bucket
    (memrl.recipes.tables.nested, the look-back demo's pooled summary), not 0, which reads as a length."""
    from memrl.eval.fields import summary_rows
    from memrl.recipes.context import FIELDS as context_fields
    from memrl.recipes.memact import FIELDS as memact_fields
    from memrl.recipes.summaries import evaluate_context, evaluate_memact
    from memrl.types import Task, Trajectory
    from memrl.workflows import WorkflowSpec
    from memrl.workflows.fold import FoldConfig
    from memrl.workflows.memact_config import MemActConfig

    async def run(task, engine, cfg, rng):
        return Trajectory(task.task_id, "", [], metrics={"peak_context_tokens": 7.0}, info={"draw": rng.random()})

    cfg_cls, evaluate = (MemActConfig, evaluate_memact) if method == "memact" else (FoldConfig, evaluate_context)
    FIELDS = memact_fields if method == "memact" else context_fields  # noqa: N806
    spec = WorkflowSpec("draw", run, cfg_cls, lambda task, traj: float(traj.info["draw"] >= 0.5))
    tasks = [Task(f"t{i}", "q", "c", ["a"]) for i in range(2)]
    path = tmp_path / "rows.jsonl"
    res = evaluate(EngineRollout(None, spec), cfg_cls(), tasks, 1.0, 9, policy="rl", heldout_sha256="d",
                   rows_to=path)
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert rows == res
    assert [(r["task_id"], r["policy"], r["decoding"], r["bucket"], r["seed"]) for r in rows] == [
        ("t0", "rl", "greedy", "all", 9), ("t1", "rl", "greedy", "all", 9),
        ("t0", "rl", "sampled", "all", 9), ("t1", "rl", "sampled", "all", 9)]
    summary = summary_rows(res, FIELDS)
    assert [(s["decoding"], s["bucket"], s["num_tasks"], s["peak_context_tokens"]) for s in summary] == [
        ("greedy", "all", 2.0, 7.0), ("sampled", "all", 2.0, 7.0)]
