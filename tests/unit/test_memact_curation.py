"""The MemAct demo's `variant=curation` (issue 33: context curation) and benchmarks/memact_curation.py's table.

The variant's promises, checked exactly on the demo's own tokenizer: the budget fits the search-only agent on
every task under either system prompt (so overflow never separates the arms), and the pruning scripted agent's
mean working context is shorter by the hand-derived amount (R: one search turn and its result; each prune
leaves its own turn, holding the memory note, and its acknowledgement, which the next prune deletes)."""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from memrl.config import ConfigError
from memrl.recipes.pipeline import load_recipe

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("memact_curation", ROOT / "benchmarks" / "memact_curation.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["memact_curation"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_variant_overrides_go_first_so_explicit_ones_win():
    from memrl.recipes.memact import VARIANTS, expand_variant

    assert expand_variant(["sft.epochs=1"]) == ["sft.epochs=1"]
    got = expand_variant(["variant=curation", "sft.late_prob=0.5"])
    assert got == [*VARIANTS["curation"], "variant=curation", "sft.late_prob=0.5"]
    with pytest.raises(ConfigError, match="variant must be one of curation"):
        expand_variant(["variant=nope"])


def test_bad_budget_rule_names_the_field(tmp_path):
    from memrl.recipes.memact import RECIPE

    with pytest.raises(ConfigError, match="budget='all' is not allowed: must be one of prune, search_only"):
        load_recipe(RECIPE, ["budget=all"], tmp_path / "o")


@pytest.fixture(scope="module")
def curation(tmp_path_factory):
    import torch

    from memrl.recipes import memact as demo

    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("curation")
    run = load_recipe(demo.RECIPE, ["variant=curation", "sft.num_tasks=60", "rl_tasks=2", "eval.num_tasks=2"], out)
    cfg, out, wf = run.cfg, run.out, (run.spec, run.wf_cfg)
    data = demo.write_data(cfg, out / "data")
    tok, _ = demo.init_model(cfg, wf[1], data.sft_tasks, out)
    budget = demo.context_budget(cfg, tok, wf[1], data.sft_tasks)
    return cfg, replace(wf[1], max_context_tokens=budget), tok, data.sft_tasks


def _play(tasks, tok, wf, late, keep, prune_tool):
    from memrl.demonstrators.stages import memact_demonstrations

    return [g.trajectories[0] for g in memact_demonstrations(tasks, tok, wf, late, 0, 4, keep, prune_tool=prune_tool)]


def _sizes(tok, traj):
    """Token count of each transcript message's text."""
    return [len(tok.encode(m["text"], add_special_tokens=False)) for m in traj.info["transcript"]]


def test_the_variant_is_8_questions_with_4_facts_per_result(curation):
    cfg, wf, _, tasks = curation
    assert cfg.task.sub_questions == [8] and cfg.task.entities_per_task == 8 and cfg.sft.search_topk == 4
    assert cfg.budget == "search_only" and cfg.sft.keep_results == 2 and cfg.sft.late_prob == 0.25
    assert wf.max_assistant_turns == 14 and wf.system_noprune_template == "Search, answer."
    assert all(len(t.meta["sub_questions"]) == 8 for t in tasks)


def test_search_only_fits_the_budget_on_every_task_under_either_prompt(curation):
    _, wf, tok, tasks = curation
    for offered in (False, True):
        trajs = _play(tasks, tok, wf, 1.0, 2, offered)
        assert all(t.metrics["stop_answer"] == 1.0 and t.reward == 1.0 and t.metrics["prunes"] == 0 for t in trajs)
        assert all(t.metrics["searches"] == 8 and t.metrics["turns"] == 9 for t in trajs)
        assert max(t.metrics["peak_context_tokens"] for t in trajs) <= wf.max_context_tokens
    # the budget is exactly the largest of them: the offered prompt's never-pruning agent
    assert max(t.metrics["peak_context_tokens"] for t in _play(tasks, tok, wf, 1.0, 2, True)) == wf.max_context_tokens
    # the pruning agent (3 prunes, 12 turns) answers every task within the turn limit
    trajs = _play(tasks, tok, wf, 0.0, 2, True)
    assert all(t.reward == 1.0 and t.metrics["prunes"] == 3 and t.metrics["turns"] == 12 for t in trajs)


def test_pruning_shortens_the_mean_context_by_the_derived_amount(curation):
    """Search-only (9 turns): contexts P, P+R, .., P+8R, mean P+4R, peak P+8R. Prune-every-2 (12 turns, 4 blocks
    of 3): block b's turns hold P+X_b, P+X_b+R, P+X_b+2R (its third prunes, or answers in block 4), so the mean
    is P+R+(X_1+..+X_4)/4. X_1 = 0; what a prune leaves is its own turn A_i (the memory note) and its
    acknowledgement K_i, and the next prune deletes K_i with the 2 results: X_2 = A1+K1, X_3 = A1+A2+K2,
    X_4 = A1+A2+A3+K3. Same prompt (prune tool offered) for both."""
    _, wf, tok, tasks = curation
    task = tasks[:1]
    (never,) = _play(task, tok, wf, 1.0, 2, True)
    (prunes,) = _play(task, tok, wf, 0.0, 2, True)
    assert prunes.metrics["prunes"] == 3 and prunes.metrics["turns"] == 12 and prunes.reward == 1.0
    tr = prunes.info["transcript"]
    # what stays: head, the 3 prune turns, the last acknowledgement, the last two searches and results, the answer
    assert [m["kind"] for m in tr] == ["head", "assistant", "assistant", "assistant", "tool",
                                       "assistant", "tool", "assistant", "tool", "assistant"]
    assert tr[4]["text"].startswith("[r9] Removed r6, r7, r8.")  # the 2nd and 3rd prunes also deleted r3 and r6
    r = (never.metrics["peak_context_tokens"] - never.metrics["mean_context_tokens"]) / 4  # (P+8R) - (P+4R)
    p = never.metrics["mean_context_tokens"] - 4 * r
    s = _sizes(tok, never)
    # R: a search turn and its result, each inside its chat markers (header/end tokens; the same for all eight)
    assert r == r // 1 and all(s[i] + s[i + 1] < r < s[i] + s[i + 1] + 12 for i in range(1, 17, 2))
    x = 4 * (prunes.metrics["mean_context_tokens"] - p - r)
    n = _sizes(tok, prunes)
    ack = tr[4]["text"]
    k1 = ack.replace("[r9] Removed r6, r7, r8.", "[r3] Removed r1, r2.")
    k2 = ack.replace("[r9] Removed r6, r7, r8.", "[r6] Removed r3, r4, r5.")
    k = [len(tok.encode(t, add_special_tokens=False)) for t in (k1, k2)]
    texts = 3 * n[1] + 2 * n[2] + n[3] + k[0] + k[1] + n[4]  # 3A1 + 2A2 + A3 + K1 + K2 + K3, text only
    assert texts < x < texts + 9 * 6  # plus each of those 9 messages' chat markers
    # the figures docs/concepts/memact.md quotes (the seed-0 tokenizer): P' = 86, R = 76; withheld prompt P = 82
    assert (p, r, wf.max_context_tokens) == (86, 76, 694)
    assert prunes.metrics["mean_context_tokens"] == 252.25 and prunes.metrics["peak_context_tokens"] == 409.0
    (withheld,) = _play(task, tok, wf, 1.0, 2, False)
    assert (withheld.metrics["mean_context_tokens"], withheld.metrics["peak_context_tokens"]) == (386.0, 690.0)
    # the best a policy can do here (docs/concepts/memact.md): 34.7% below the search-only arm's mean context
    assert round(100 * (1 - prunes.metrics["mean_context_tokens"] / withheld.metrics["mean_context_tokens"]), 1) == 34.7


def test_aggregate_mean_sd_and_goal_hand_checked():
    b = _bench()

    def res(acc, se, ctx, peak, prunes):
        e = {"accuracy": acc, "accuracy_se": se, "mean_context_tokens": ctx, "peak_context_tokens": peak,
             "prunes_per_task": prunes, "overflow": 0.0}
        return {"summary": [{"policy": "rl", "decoding": d, "bucket": "all", **e} for d in ("greedy", "sampled")],
                "facts": {}, "heldout_sha256": ["x"]}

    results = {0: {"dcpo": res(50.0, 3.0, 140.0, 250.0, 1.0), "withheld": res(52.0, 4.0, 200.0, 360.0, 0.0)},
               1: {"dcpo": res(54.0, 4.0, 120.0, 230.0, 1.5), "withheld": res(50.0, 3.0, 200.0, 360.0, 0.0)},
               2: {"dcpo": res(10.0, 1.0, 100.0, 100.0, 0.0)}}  # seed 2 lacks an arm: left out
    agg = b.aggregate(results)
    assert agg["seeds"] == [0, 1]
    d = agg["table"]["dcpo/greedy"]
    assert d["accuracy"]["mean"] == 52.0 and math.isclose(d["accuracy"]["sd"], math.sqrt(8.0))  # (4+4)/1
    assert d["mean_context_tokens"]["mean"] == 130.0 and math.isclose(d["mean_context_tokens"]["sd"], math.sqrt(200))
    assert agg["table"]["withheld/sampled"]["prunes_per_task"] == {"mean": 0.0, "sd": 0.0, "se": 0.0, "n": 2, "values": [0, 0]}
    g = agg["goal"]["greedy"]
    assert g["accuracy_diff"] == 1.0  # 52 - 51
    assert math.isclose(g["accuracy_diff_se"], math.sqrt(9 + 16 + 16 + 9) / 2)  # sqrt(50)/2 = 3.54
    assert g["equal_accuracy"] and math.isclose(g["context_reduction"], 0.35) and g["met"]
    text = b.markdown(agg)
    assert "| DCPO (prune tool) | greedy | 52.0 ± 2.8 | 3.5 ± 0.7 | 130.0 ± 14.1 | 240.0 ± 14.1 | 1.25 ± 0.35 |" in text
    assert "mean context 35.0% shorter (goal 30%): goal met" in text
    assert "| 1 | dcpo | sampled | 54.0 ± 4.0 | – | 120.0 | 230.0 | 1.50 | 0.0 | – | – |" in text  # per seed
    assert len(agg["per_seed"]) == 2 * 2 * 2 and "| 2 |" not in text


def test_aggregate_refuses_different_heldout_tasks():
    b = _bench()
    e = {"accuracy": 1.0, "accuracy_se": 1.0, "mean_context_tokens": 1.0, "peak_context_tokens": 1.0,
         "prunes_per_task": 0.0, "overflow": 0.0}
    rows = [{"policy": "rl", "decoding": d, "bucket": "all", **e} for d in ("greedy", "sampled")]
    results = {0: {"dcpo": {"summary": rows, "facts": {}, "heldout_sha256": ["a"]},
                   "withheld": {"summary": rows, "facts": {}, "heldout_sha256": ["b"]}}}
    with pytest.raises(ValueError, match="different task sets"):
        b.aggregate(results)


def test_arm_overrides_shift_training_seeds_not_the_eval_seed():
    b = _bench()
    ov = b.arm_overrides("withheld", 2, ["sft.epochs=1"])
    assert ov[:6] == ["variant=curation", "sft.epochs=1", "workflow.prune_tool=false", "sft.batch_rows=4",
                      "sft.epochs=4", "sft.copy_warmup_rows=32"]
    assert ov[6:] == ["seed=2", "sft.seed=502", "rl_task_seed=102", "train.data.seed=9", "train.trainer.seed=2"]
    assert b.arm_overrides("withheld", 0, ["sft.epochs=2"], ("sft.epochs=8",))[6] == "sft.epochs=8"  # --set: last
    assert b.arm_overrides("dcpo", 0, []) == ["variant=curation", "seed=0", "sft.seed=500", "rl_task_seed=100",
                                              "train.data.seed=7", "train.trainer.seed=0"]


def test_the_arms_cold_starts_take_as_many_steps_over_as_many_tokens(curation, tmp_path):
    """The withheld arm's SFT overrides (4 rows x 4 epochs against the dcpo arm's 8 x 2 of the runs' command
    line) match the cold starts in optimizer steps and tokens, and keep the dcpo arm's copy warm-up. On the
    fixture's 60 tasks: the search-only agent gives one 742-token row per task (44,520 tokens), the pruning
    one 223 rows of 85,713 tokens; steps = ceil(rows / batch) x epochs."""
    from memrl.demonstrators.stages import memact_demonstrations
    from memrl.recipes import memact as demo
    from memrl.training.sft import SFTConfig

    b = _bench()
    cfg, tok, wf, tasks = curation[0], curation[2], curation[1], curation[3]
    sft = {}
    for arm in ("dcpo", "withheld"):
        ov = ["variant=curation", "sft.num_tasks=60", "sft.epochs=2", *b.ARMS[arm]]
        sft[arm] = load_recipe(demo.RECIPE, ov, tmp_path / arm).cfg
    assert sft["dcpo"].sft.warmup_rows() == sft["withheld"].sft.warmup_rows() == 32
    rows = {}
    for arm, offered in (("dcpo", True), ("withheld", False)):
        groups = memact_demonstrations(tasks, tok, wf, cfg.sft.late_prob, cfg.sft.seed, 4, 2, prune_tool=offered)
        rows[arm] = [s for g in groups for s in g.trajectories[0].segments]
    size = {arm: sum(len(s.prompt_ids) + len(s.response_ids) for s in r) for arm, r in rows.items()}
    assert (len(rows["withheld"]), size["withheld"]) == (60, 60 * 742)
    assert (len(rows["dcpo"]), size["dcpo"]) == (223, 85713)
    steps = {arm: SFTConfig(epochs=sft[arm].sft.epochs, batch_rows=sft[arm].sft.batch_rows).total_steps(len(rows[arm]))
             for arm in rows}
    assert steps == {"dcpo": 28 * 2, "withheld": 15 * 4}
    assert (size["dcpo"] * 2, size["withheld"] * 4) == (171426, 178080)  # tokens over the epochs: within 4%
