"""Both demos' evaluation paths give the numbers the code before the one evaluator (memrl.eval.evaluator)
gave: values computed once with the old demos/evaluation.py and demos/memact.py on a tiny model and a
few tasks, hard-coded here (bit for bit, seconds aside), and checked by hand where noted.

The MemAgent setup: the demo's own configs at a toy size (2-chunk training documents, held-out lengths 2
and 4, 6 tasks each, 3 samples), a 1-layer random model; the MemAct setup: the demo's configs, 10-12
held-out tasks, the working-context budget the demo calibrates (181 tokens)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import pytest

from memrl.eval.evaluator import EngineRollout, evaluate_rows, model_engine
from memrl.recipes.parts import engine_eval
from memrl.recipes.pipeline import load_recipe
from memrl.recipes.summaries import evaluate_memact

pytestmark = pytest.mark.slow

T3, T23 = 1 / 3, 2 / 3


@pytest.fixture(scope="module")
def memagent(tmp_path_factory):
    import torch

    from memrl.recipes import memagent as ma

    torch.set_num_threads(1)
    run = load_recipe(ma.RECIPE,
        ["hidden_size=32", "num_layers=1", "num_heads=2", "num_kv_heads=1", "vocab_size=800", "eval.num_tasks=6",
         "eval.multipliers=[1,2]", "eval.samples=3", "sft.p_aware=0.5", "train.data.synthetic.num_chunks=2",
         "train.data.synthetic.min_chunks=0"], tmp_path_factory.mktemp("ma"))
    ma.RECIPE.init(run)
    return ma, run, run.cfg, run.tcfg, run.out, run.spec, run.wf_cfg, run.extra["tasks"], run.tokenizer, run.model


def _strip(res):
    for row in res.values():
        for r in row.values():
            r.pop("seconds")
    return res


def test_memagent_demonstrator_numbers_unchanged(memagent):
    ma, run, *_, tasks, _, _ = memagent
    got = _strip(ma.evaluate_demonstrator(run, tasks))
    # length 2: per-task means 2/3, 2/3, 1, 1/3, 1/3, 1 -> mean 2/3; deviations 0, 0, +-1/3 (x4):
    # variance (4/9) / 5, SE = sqrt(4/45 / 6) = 0.12172 (by hand)
    assert got == {
        "2": {"sampled": {"accuracy": 66.66666666666666, "se": 12.171612389003693, "num_tasks": 6, "samples": 3,
                          "temperature": 1.0, "per_task": [T23, T23, 1.0, T3, T3, 1.0],
                          "metrics": {"context_tokens": 20.166666666666668, "no_box": 0.0,
                                      "answer_seen": 72.22222222222221, "answer_kept": 55.55555555555556}}},
        "4": {"sampled": {"accuracy": 33.33333333333333, "se": 14.9071198499986, "num_tasks": 6, "samples": 3,
                          "temperature": 1.0, "per_task": [T3, T3, 0.0, T3, 0.0, 1.0],
                          "metrics": {"context_tokens": 39.5, "no_box": 0.0, "answer_seen": 77.77777777777779,
                                      "answer_kept": 27.77777777777778}}},
    }


def test_memagent_model_numbers_and_sampled_trajectories_unchanged(memagent):
    ma, run, cfg, tcfg, out, spec, wf, tasks, tok, model = memagent
    got = _strip(engine_eval(ma.evaluate_lengths, run, model, out / "init", tasks, cfg.eval, log=print))
    for n, ctx in (("2", 20.166666666666668), ("4", 39.5)):
        for mode, samples, temp in (("greedy", 1, 0.0), ("sampled", 3, 1.0)):
            assert got[n][mode] == {"accuracy": 0.0, "se": 0.0, "num_tasks": 6, "samples": samples,
                                    "temperature": temp, "per_task": [0.0] * 6,
                                    "metrics": {"context_tokens": ctx, "no_box": 100.0, "answer_seen": 0.0,
                                                "answer_kept": 0.0}}
    # the sampled trajectories themselves (same seeds per (seed, task, sample)): their token ids' digest
    seen = {}
    with model_engine(model, tok, tcfg.engine) as engine:
        evaluate_rows(EngineRollout(engine, spec), wf, tasks[2], 3, 1.0, 987654,
                      on_trajectory=lambda t, tr: seen.__setitem__(tr.trajectory_id,
                                                                   [s.response_ids for s in tr.segments]))
    assert len(seen) == 18 and len({json.dumps(v) for v in seen.values()}) == 18
    digest = hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()
    assert digest == SAMPLED_DIGEST


SAMPLED_DIGEST = "5ea084163d09cf5ed445b81814aa85708f9b75f84a870c3e441e19eae8ce6085"


@pytest.mark.parametrize("deterministic", [True, False])
def test_memagent_sampled_trajectories_unchanged_with_the_slots_cache(memagent, deterministic):
    """engine.hf.kv_cache=slots (issue 47) samples the same tokens as the padded cache on the demo's
    evaluation path: the digest above, in wave and in continuous batching."""
    ma, run, cfg, tcfg, out, spec, wf, tasks, tok, model = memagent
    ecfg = replace(tcfg.engine, hf=replace(tcfg.engine.hf, kv_cache="slots", deterministic=deterministic))
    seen = {}
    with model_engine(model, tok, ecfg) as engine:
        evaluate_rows(EngineRollout(engine, spec), wf, tasks[2], 3, 1.0, 987654,
                      on_trajectory=lambda t, tr: seen.__setitem__(tr.trajectory_id,
                                                                   [s.response_ids for s in tr.segments]))
        assert engine.kv_cache == "slots"
    digest = hashlib.sha256(json.dumps(sorted(seen.items())).encode()).hexdigest()
    assert digest == SAMPLED_DIGEST


@pytest.fixture(scope="module")
def memact(tmp_path_factory):
    import torch

    from memrl.recipes import memact as mc

    torch.set_num_threads(1)
    run = load_recipe(mc.RECIPE,
        ["model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
         "sft.num_tasks=80", "rl_tasks=4", "eval.num_tasks=10"], tmp_path_factory.mktemp("mc"))
    cfg, tcfg, out, wf = run.cfg, run.tcfg, run.out, run.wf_cfg
    data = mc.write_data(cfg, out / "data")
    tok, model = mc.init_model(cfg, wf, data.sft_tasks, out)
    return mc, cfg, tcfg, out, wf, data, tok, model


SCRIPTED = {"accuracy": 75.0, "accuracy_se": 12.5, "subq_accuracy": 75.0, "mean_context_tokens": 112.25,
            "peak_context_tokens": 166.75, "max_context_tokens": 181.0, "prunes_per_task": 0.25,
            "failed_prunes_per_task": 0.0, "overflow": 25.0, "turns": 3.5, "num_tasks": 12.0,
            "accuracy_2q": 100.0, "accuracy_3q": 50.0}


def test_memact_numbers_unchanged(memact):
    from memrl.demonstrators import ScriptedEngine
    from memrl.demonstrators.memact import MemActDemonstrator
    from memrl.demonstrators.stages import calibrate_budget, memact_demonstrations
    from memrl.eval.evaluator import evaluation_rows
    from memrl.eval.fields import summary_rows
    from memrl.recipes.memact import fields_for
    from memrl.recipes.pipeline import RecipeRun
    from memrl.workflows import get_workflow

    def memact_summary(rows):  # the demo's summary of one (policy, decoding, bucket) group, without its labels
        (s,) = summary_rows(rows, fields_for(cfg.task.sub_questions))
        return {k: v for k, v in s.items() if k not in ("policy", "decoding", "bucket")}

    mc, cfg, tcfg, out, wf, data, tok, model = memact
    budget = calibrate_budget(data.sft_tasks[:40], tok, wf, cfg.sft.search_topk)
    assert budget == 181
    wf = replace(wf, max_context_tokens=budget)
    # the cold start's statistics of the scripted agent (binomial SE: sqrt(0.7 * 0.3 / 10) = 0.144914)
    stats = memact_summary(evaluation_rows(memact_demonstrations(data.eval_tasks, tok, wf, 0.5, 3, cfg.sft.search_topk),
                                           bucket="all"))
    assert stats == {"accuracy": 70.0, "accuracy_se": 14.491376746189438, "subq_accuracy": 70.0,
                     "mean_context_tokens": 111.4, "peak_context_tokens": 166.0, "max_context_tokens": 181.0,
                     "prunes_per_task": 0.2, "failed_prunes_per_task": 0.0, "overflow": 30.0, "turns": 3.4,
                     "num_tasks": 10.0, "accuracy_2q": 100.0, "accuracy_3q": 40.0}
    # the held-out protocol (greedy, then one sample per task) through a scripted agent on 12 tasks:
    # p = 0.75, binomial SE sqrt(0.75 * 0.25 / 12) = 0.125 (by hand)
    from memrl.data.synthetic_memact import make_tasks

    tasks12 = make_tasks(cfg.task, 12, cfg.eval.seed, prefix="heldout")
    engine = ScriptedEngine(MemActDemonstrator(late_prob=0.5, seed=4, topk=cfg.sft.search_topk), tokenizer=tok)
    res = evaluate_memact(EngineRollout(engine, get_workflow("memact")), wf, tasks12, 1.0, cfg.eval.seed)
    assert [r["decoding"] for r in res] == ["greedy"] * 12 + ["sampled"] * 12
    assert [memact_summary(res[:12]), memact_summary(res[12:])] == [SCRIPTED, SCRIPTED]
    # the demo's own evaluation of a (random) model through the HF engine
    run = RecipeRun(cfg, tcfg, out, get_workflow("memact"), wf, tok)
    got = engine_eval(evaluate_memact, run, model, out / "init", data.eval_tasks, prune_tool=wf.prune_tool)
    zero = {"accuracy": 0.0, "accuracy_se": 0.0, "subq_accuracy": 0.0, "mean_context_tokens": 53.0,
            "peak_context_tokens": 53.0, "max_context_tokens": 56.0, "prunes_per_task": 0.0,
            "failed_prunes_per_task": 0.0, "overflow": 0.0, "turns": 1.0, "num_tasks": 10.0,
            "accuracy_2q": 0.0, "accuracy_3q": 0.0}
    assert [memact_summary(got[:10]), memact_summary(got[10:])] == [zero, zero]
