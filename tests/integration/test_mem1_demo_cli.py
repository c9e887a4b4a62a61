"""`memrl demo --agent mem1` end to end at toy sizes (tiny model, a few SFT / RL steps) for both methods:
every stage ran and results.json holds hand-derivable counts; bad settings are refused in one line."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from memrl.cli import main
from memrl.eval.fields import one
from memrl.recipes.pipeline import load_recipe

pytestmark = pytest.mark.slow

TOY = ["sft.num_tasks=6", "sft.epochs=1", "sft.batch_rows=8", "sft.copy_warmup_steps=3", "eval.num_tasks=2",
       "rl_tasks=4", "threads=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
       "model.num_kv_heads=1", "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2",
       "train.trainer.progress=false"]


@pytest.mark.parametrize("method, context", [("mem1", "latest_state"), ("full_history", "full_history")])
def test_mem1_demo_runs_every_stage(tmp_path, capsys, method, context):
    out = tmp_path / method
    rc = main(["demo", "--agent", "mem1", "--out", str(out), f"method={method}", *TOY])
    assert rc == 0
    for name in ("results.md", "results.json", "demo_config.yaml", "sft/config.json", "copy_warmup/metrics.jsonl",
                 "rl/metrics.jsonl", "rl/checkpoints/step_000002/model.safetensors", "data/train_tasks.jsonl",
                 "data/heldout_tasks.jsonl", "init/config.json"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    assert (out / "results.md").read_text() in capsys.readouterr().out
    train, cfg = res["train"], res["config"]
    assert res["method"] == method and train["workflow"]["context"] == context and train["algorithm"]["name"] == "grpo"
    assert cfg["eval"]["objectives"] == [2, 4, 8, 16] and cfg["task"]["sub_questions"] == list(range(2, 17))
    assert len(res["losses"]["copy_warmup"]) == 3 and len(res["history"]) == 2
    # 2 held-out tasks per k, k objectives each: 8 lines of data/heldout_tasks.jsonl, k = 2, 2, 4, 4, 8, 8, 16, 16
    held = [json.loads(line) for line in (out / "data" / "heldout_tasks.jsonl").read_text().splitlines()]
    assert [len(t["meta"]["sub_questions"]) for t in held] == [2, 2, 4, 4, 8, 8, 16, 16]
    # the oracle: one search per objective, then the answer, one row per turn -> k + 1 rows per task
    d = res["facts"]["cold_start"]
    ks = d["objectives_per_task"]
    assert len(ks) == 6 and set(ks) <= set(range(2, 17))
    assert d["rows_per_task"] == [k + 1 for k in ks] and d["rows"] == sum(ks) + 6
    assert d["summary"]["accuracy"] == 100.0
    assert len(res["losses"]["sft"]) == math.ceil(d["rows"] / 8)  # one epoch in batches of 8 rows
    # the summary rows in evaluation order: the scripted oracle per k, then per k greedy and sampled
    assert [(r["policy"], r["decoding"], r["bucket"]) for r in res["summary"]] == [
        ("scripted", "greedy", k) for k in ("2", "4", "8", "16")] + [
        (p, m, k) for p in ("sft", "rl") for k in ("2", "4", "8", "16") for m in ("greedy", "sampled")]
    for k in (2, 4, 8, 16):
        s = one(res["summary"], policy="scripted", bucket=str(k))
        assert (s["accuracy"], s["turns"], s["answered"], s["num_tasks"]) == (100.0, k + 1, 100.0, 2.0)
    pos = res["facts"]["positions"]
    for policy in ("sft", "rl"):
        for mode in ("greedy", "sampled"):
            for k in ("2", "4", "8", "16"):
                r = one(res["summary"], policy=policy, decoding=mode, bucket=k)
                assert r["num_tasks"] == 2.0 and (r["accuracy"] / 50).is_integer()  # 2 tasks: steps of 50 points
                # workflow.max_turns 17 (preset mem1_cpu); a context never passes the model's positions
                assert 1 <= r["turns"] <= 17 and r["peak_context_tokens"] <= pos["max_positions"]
    assert pos["max_positions"] == 1024 and pos["max_context_tokens"] == train["workflow"]["max_context_tokens"] == 928
    assert pos["full_history_scripted_prompt"] <= 928 and pos["full_history_scripted_peak"] <= 1024


def test_scripted_contexts_latest_state_vs_full_history(tmp_path):
    """On one tokenizer, the oracle replies the same under both settings (it reads the latest state and
    observation only), so with c_t the t-th call's context: latest_state c_t = c_0 + d_t (the prompt plus
    the last kept reply and observation, d_t tokens), full_history c_t = c_0 + d_1 + ... + d_t. Its peak
    context (longest prompt + reply) therefore grows with k far faster under full history."""
    from memrl.demonstrators.mem1 import mem1_demonstrations
    from memrl.recipes.mem1 import RECIPE, heldout_tasks
    from memrl.training.assemble import validate

    out = tmp_path / "run"
    assert main(["demo", "--agent", "mem1", "--out", str(out), "method=mem1", *TOY]) == 0
    tok = AutoTokenizer.from_pretrained(out / "init")
    run = load_recipe(RECIPE, ["eval.num_tasks=2"], tmp_path / "cfg")
    cfg, tcfg = run.cfg, run.tcfg
    _, wf = validate(tcfg)
    held = heldout_tasks(cfg)
    peaks = {}
    for k, tasks in held.items():
        latest = mem1_demonstrations(tasks, tok, replace(wf, context="latest_state"))
        full = mem1_demonstrations(tasks, tok, replace(wf, context="full_history"))
        for gl, gf in zip(latest, full, strict=True):
            tl, tf = gl.trajectories[0], gf.trajectories[0]
            assert [s.response_ids for s in tl.segments] == [s.response_ids for s in tf.segments]
            cl = [s.info["context_tokens"] for s in tl.segments]
            cf = [s.info["context_tokens"] for s in tf.segments]
            assert len(cl) == k + 1 and cl[0] == cf[0]
            d = [c - cl[0] for c in cl]
            assert cf == [cl[0] + sum(d[1:t + 1]) for t in range(k + 1)]
        peaks[k] = (max(g.trajectories[0].metrics["peak_context_tokens"] for g in latest),
                    max(g.trajectories[0].metrics["peak_context_tokens"] for g in full))
    for k in (4, 8, 16):  # each step of k adds at most its own state and prompt lines to MEM1 ...
        assert peaks[k][0] < peaks[k][1]
    growth_latest, growth_full = peaks[16][0] / peaks[2][0], peaks[16][1] / peaks[2][1]
    assert growth_full > 2 * growth_latest  # ... while full history keeps every turn


@pytest.mark.parametrize("override, message", [
    ("method=folding", "method"),
    ("train.workflow.context=full_history", "workflow.context is set by method"),
    ("eval.objectives=[2,32]", "eval.objectives: 32 objectives need task.entities_per_task >= 32"),
    ("sft.seed=903", "sft.seed 903 is a held-out task seed"),
    ("train.workflow.max_turns=9", "workflow.max_turns 9 < 17"),
    ("eval.objectives=[2,2]", "eval.objectives must be distinct"),
    ("workflow.max_context_tokens=1000", "workflow.max_context_tokens 1000 > model.max_positions 1024 - "
                                         "workflow.max_turn_tokens 96 = 928"),
])
def test_mem1_demo_refuses_bad_settings(tmp_path, capsys, override, message):
    rc = main(["demo", "--agent", "mem1", "--out", str(tmp_path / "d"), override])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "d" / "data").exists()


def test_mem1_demo_refuses_too_few_positions(tmp_path, capsys):
    # 300 positions - 96 turn tokens = a 204-token cap; the scripted full-history agent's prompts at 16
    # objectives pass 600 tokens
    rc = main(["demo", "--agent", "mem1", "--out", str(tmp_path / "d"), "model.max_positions=300", *TOY])
    assert rc != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("memrl demo: error: workflow.max_context_tokens 204 (model.max_positions 300 - "
                          "workflow.max_turn_tokens 96 unless set) < ")
    assert "the scripted full-history agent's largest prompt at 16 objectives" in err and len(err.splitlines()) == 1


def test_mem1_demo_caps_the_prompt_at_the_positions(tmp_path):
    from memrl.recipes.mem1 import RECIPE
    from memrl.training.assemble import validate

    tcfg = load_recipe(RECIPE, [], tmp_path / "a").tcfg
    assert validate(tcfg)[1].max_context_tokens == 1024 - 96  # model.max_positions - workflow.max_turn_tokens
    tcfg = load_recipe(RECIPE, ["workflow.max_context_tokens=800"], tmp_path / "b").tcfg
    assert validate(tcfg)[1].max_context_tokens == 800  # a lower cap is kept
