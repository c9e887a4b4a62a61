"""The demos, `memrl eval` and in-training validation share one evaluator (memrl.eval.evaluator): the same
tasks, the same scripted policy and the same seeds give the same per-task scores and the same mean and
standard error over tasks through all three, and each caller's rollout is the injected `Rollout`."""

from __future__ import annotations

import math

import pytest

from memrl.config import load_config
from memrl.data.synthetic import SyntheticConfig, corpus_text, make_tasks
from memrl.data.tasks_jsonl import write_tasks
from memrl.demonstrators import RecentFactsDemonstrator, ScriptedEngine
from memrl.eval import evaluator
from memrl.eval.report import summarize
from memrl.eval.runner import EvalConfig, evaluate, read_results, workflow_config
from memrl.models.tiny import train_tokenizer
from memrl.training.config import TrainConfig
from memrl.training.step.validation import run_validation

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"
WORKFLOW = {"name": "memagent", "chunk_tokens": 8, "max_memory_tokens": 10, "max_final_tokens": 6,
            "memory_template": MT, "final_template": FT}
SEED, SAMPLES = 5, 2


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("one")
    (root / "corpus.txt").write_text(corpus_text(extra=(MT, FT, "No previous memory", "\\boxed{ red}") * 50),
                                     encoding="utf-8")
    tok = train_tokenizer([root / "corpus.txt"], 2048)
    tasks = make_tasks(SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start"), 30, seed=11)
    for t in tasks:
        t.meta.update(dataset="syn", num_docs=3)
    write_tasks(root / "syn.jsonl", tasks)
    # right exactly when the asked fact sits in the last piece (the question-blind rule keeps the newest)
    right = [1.0 if list(t.meta["fact_chunks"].values()) == [2] else 0.0 for t in tasks]
    return root, tok, tasks, right


def engine(tok):
    return ScriptedEngine(RecentFactsDemonstrator(MT, FT, skip_prob=0.0), tokenizer=tok)


def by_task(rows, key):
    out: dict[str, list[float]] = {}
    for r in sorted(rows, key=lambda r: r["sample"]):
        out.setdefault(str(r["task_id"]), []).append(float(r[key]))
    return out


def test_demo_eval_and_validation_give_the_same_scores(setup):
    root, tok, tasks, right = setup
    k = sum(right)
    assert 0 < k < len(tasks)

    # the demos' path
    spec, wf = workflow_config(EvalConfig(workflow=WORKFLOW))
    calls: list[tuple[int, int, int]] = []

    class Counting(evaluator.EngineRollout):  # the injected rollout: every caller goes through one
        def __call__(self, tasks, wf_cfg, n=1, seed=0, **kw):
            calls.append((len(tasks), n, kw.get("first_sample", 0)))
            return super().__call__(tasks, wf_cfg, n, seed, **kw)

    demo_rows = evaluator.evaluate_rows(Counting(engine(tok), spec), wf, tasks, SAMPLES, 1.0, SEED)
    assert calls == [(30, SAMPLES, 0)]
    demo = evaluator.eval_record(demo_rows, SAMPLES, 1.0)
    assert demo["per_task"] == right
    p = k / len(tasks)  # by hand: 0/1 task means, ddof 1 over the 30 tasks
    assert demo["accuracy"] == pytest.approx(100 * p)
    assert demo["se"] == pytest.approx(100 * math.sqrt(p * (1 - p) * 30 / 29 / 30))

    # `memrl eval` (sample k of a task is the demo's k-th trajectory), through an injected rollout
    calls.clear()
    ecfg = EvalConfig(workflow={**WORKFLOW, "temperature": 1.0}, samples=SAMPLES, seed=SEED, progress=False)
    rows = evaluate([root / "syn.jsonl"], root / "eval", ecfg, rollout=Counting(engine(tok), spec))
    assert calls == [(30, 1, 0), (30, 1, 1)]
    assert all(r["reward"] == r["sub_em"] for r in rows)
    rewards = by_task(rows, "reward")
    per_task = evaluator.task_means(rewards[t.task_id] for t in tasks)
    assert per_task == demo["per_task"]
    mean, se = evaluator.mean_and_se(per_task)
    assert (100 * mean, 100 * se) == (demo["accuracy"], demo["se"])
    (s,) = summarize(rows, "eval")
    assert (s.samples, s.questions) == (SAMPLES, 30)
    assert (s.mean_at_k, s.mean_at_k_se) == (demo["accuracy"], demo["se"])

    # in-training validation: memrl.eval.runner.evaluate on the trainer's runtime, its rows summarized
    tcfg = load_config(TrainConfig, ["workflow=memagent", *(f"workflow.{k}={v}" for k, v in WORKFLOW.items()
                                                           if k != "name" and "template" not in k),
                                     f"val.files=[{root / 'syn.jsonl'}]", f"val.samples={SAMPLES}",
                                     "val.temperature=1.0", f"trainer.seed={SEED}", "trainer.val_every=1"])
    tcfg.workflow.update(memory_template=MT, final_template=FT)
    from memrl.runtime import RolloutRuntime

    eng = engine(tok)
    with RolloutRuntime(eng, close_engine=False) as runtime:  # the trainer's run-long runtime
        val = run_validation(tcfg, root / "train", 3, engine=eng, runtime=runtime)
    assert val["val/syn/3/mean_at_k"] == demo["accuracy"] and val["val/mean_accuracy"] == demo["accuracy"]
    val_rows = read_results(root / "train" / "val" / "step_3" / "results.jsonl")
    assert by_task(val_rows, "reward") == rewards
