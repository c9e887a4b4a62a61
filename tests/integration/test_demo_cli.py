"""`memrl demo` end to end at a toy budget: every output is written and the table matches results.json."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main

pytestmark = pytest.mark.slow


def test_demo_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "demo"
    rc = main(["demo", "--out", str(out), "sft.num_tasks=40", "sft.epochs=1", "eval.num_tasks=8",
               "eval.multipliers=[1,2]", "train.trainer.steps=2", "train.trainer.batch_size=2",
               "train.algorithm.n=2", "train.trainer.progress=false", "train.trainer.tensorboard=false"])
    assert rc == 0
    for name in ("results.md", "results.json", "accuracy_vs_length.png", "rl_reward.png", "demo_config.yaml",
                 "sft/config.json", "rl/metrics.jsonl", "rl/checkpoints/step_000002/model.safetensors"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    assert sorted(res["sft"]) == ["2", "4"] and len(res["rl_reward"]) == 2
    table = (out / "results.md").read_text()
    assert table in capsys.readouterr().out
    for n in ("2", "4"):
        s, r = res["sft"][n]["accuracy"], res["rl"][n]["accuracy"]
        # 8 tasks per length: every accuracy is a multiple of 12.5 points
        assert (s / 12.5).is_integer() and (r / 12.5).is_integer()
        assert f"| {s:.1f}% | {r:.1f}% | {r - s:+.1f} |" in table
        sft, rl = res["sft"][n], res["rl"][n]
        # a memory that ends with the answer held it at some call
        assert sft["answer_kept"] <= sft["answer_seen"] and rl["answer_kept"] <= rl["answer_seen"]
        assert (f"| {n} | {sft['answer_seen']:.1f}% | {sft['answer_kept']:.1f}% | {rl['answer_seen']:.1f}% | "
                f"{rl['answer_kept']:.1f}% |") in table
    png = (out / "accuracy_vs_length.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_refuses_unknown_override_before_work(tmp_path, capsys):
    rc = main(["demo", "--out", str(tmp_path / "d"), "sft.epoch=1"])
    assert rc != 0
    assert "sft.epoch" in capsys.readouterr().err
    assert not (tmp_path / "d" / "sft").exists()


def test_reading_rows_answer_from_the_whole_document(tmp_path):
    from memrl.commands.demo import reading_segments
    from memrl.data.synthetic import SyntheticConfig, corpus_text, make_tasks
    from memrl.models.tiny import train_tokenizer
    from memrl.workflows.templates import load_template

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_text(num_docs=50), encoding="utf-8")
    tok = train_tokenizer([corpus], 1024)
    fin = load_template("final", ("problem", "memory"), None, "Q: {problem}\nM: {memory}\nA:")
    tasks = make_tasks(SyntheticConfig(num_chunks=2, chunk_words=8, fact_position="start"), 3, seed=5)
    segs = reading_segments(tasks, tok, fin)
    assert len(segs) == 3
    for t, s in zip(tasks, segs, strict=True):
        prompt = tok.decode(s.prompt_ids)
        assert f"Q: {t.question}\nM: {t.context.strip()}\nA:" in prompt  # the whole document, no memory
        assert tok.decode(s.response_ids) == f"\\boxed{{ {t.answers[0]}}}<|im_end|>"
        assert s.loss_mask == [1] * len(s.response_ids) and s.info["kind"] == "reading"
