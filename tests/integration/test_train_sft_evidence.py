"""`memrl train-sft demonstrator.name=evidence` on a HotpotQA task file built by `memrl data build`: the
evidence reader's trajectories (memory = the supporting sentences shown, final = the boxed gold answer)
become SFT rows, trained in bfloat16 compute over float32 weights where the CPU allows it."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.precision import cpu_has_bf16

pytestmark = pytest.mark.slow


def _record(i: int) -> dict:
    return {"_id": f"id{i}", "question": f"Where was person {i} born?", "answer": f"Town{i}", "type": "bridge",
            "level": "easy",
            "context": [[f"Person {i}", [f"Person {i} is a writer.", f" Person {i} was born in Town{i}."]],
                        [f"Town{i}", [f"Town{i} is a town.", " It has a river."]]],
            "supporting_facts": [[f"Person {i}", 1], [f"Town{i}", 0]]}


def _files(tmp_path):
    raw = tmp_path / "hotpot_dev.json"
    raw.write_text(json.dumps([_record(i) for i in range(3)]))
    assert main(["data", "build", "--kind", "hotpotqa", "--source", str(raw), "--out", str(tmp_path / "built"),
                 "--docs", "2", "--num-questions", "0", "--seed", "0"]) == 0
    return raw, tmp_path / "built" / "eval_2.json"


def _one_line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_train_sft_on_the_evidence_readers_trajectories(tmp_path, capsys):
    from memrl.models.tiny import cached_tiny_model

    raw, built = _files(tmp_path)
    mixed = ["model.compute_dtype=bfloat16"] if cpu_has_bf16() else []
    out = tmp_path / "sft"
    assert main(["train-sft", f"model.path={cached_tiny_model('tiny')}", "data.name=file", f"data.path={built}",
                 "demonstrator.name=evidence", f"demonstrator.source={raw}", "workflow.chunk_tokens=4096",
                 "workflow.max_memory_tokens=64", "sft.batch_rows=2", "sft.warmup_steps=0", f"out_dir={out}",
                 *mixed]) == 0
    said = capsys.readouterr().out
    # 3 tasks x (1 memory call over the one chunk + the final call) = 6 rows, 3 optimizer steps
    assert "SFT on 6 rows of 3 tasks" in said
    steps = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines() if ln.strip()]
    assert len(steps) == 3 and all(s["sft/loss"] > 0 for s in steps)
    assert (out / "model.safetensors").is_file()


def test_the_evidence_demonstrator_refuses_what_it_cannot_read(tmp_path, capsys):
    from memrl.models.tiny import cached_tiny_model

    raw, built = _files(tmp_path)
    model = f"model.path={cached_tiny_model('tiny')}"
    base = ["train-sft", model, "demonstrator.name=evidence", f"out_dir={tmp_path / 'o'}"]
    assert main([*base, f"demonstrator.source={raw}"]) == 2
    assert _one_line(capsys) == ("memrl train-sft: error: demonstrator.name=evidence reads a HotpotQA / 2Wiki task "
                                 "file: set data.name=file and data.path")
    assert main([*base, "data.name=file", f"data.path={built}", f"demonstrator.source={tmp_path / 'no.json'}"]) == 2
    assert _one_line(capsys) == (f"memrl train-sft: error: demonstrator.source: '{tmp_path / 'no.json'}' is not a file "
                                 "(demonstrator.name=evidence needs the original HotpotQA / 2Wiki file, with its "
                                 "supporting_facts)")
    assert main([*base, "data.name=file", f"data.path={built}", f"demonstrator.source={raw}",
                 "workflow.name=rememr1"]) == 2
    assert _one_line(capsys) == ("memrl train-sft: error: demonstrator.name=evidence plays the memagent workflow, "
                                 "got workflow.name='rememr1'")
    other = tmp_path / "other.json"
    other.write_text(json.dumps([_record(7)]))
    assert main([*base, "data.name=file", f"data.path={built}", f"demonstrator.source={other}"]) == 2
    assert _one_line(capsys) == (f"memrl train-sft: error: demonstrator.source {other}: 3 task(s) have no supporting "
                                 "facts in the source file (first: task id 'id0'): demonstrator.source must be the "
                                 "HotpotQA / 2Wiki file the tasks were built from")
