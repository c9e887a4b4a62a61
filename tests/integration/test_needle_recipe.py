"""benchmarks/needle_recipe.py at its smoke size (a tiny model, lengths of 1-2K tokens): every stage runs, a
killed run resumes without redoing a finished stage, the held-out set is recorded by id and digest, and a
held-out set that differs from a recorded one is refused before anything trains."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).parents[2] / "benchmarks" / "needle_recipe.py"
TEXT = ("The mill stood by the river for a hundred years. Its wheel turned slowly through every season. Farmers "
        "brought their grain from the hills, and the miller weighed each sack twice before he paid. ")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), "--size", "smoke", *args], capture_output=True, text=True,
                          check=False, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})


def test_the_smoke_size_runs_every_stage_and_resumes(tmp_path):
    from memrl.models.tiny import cached_tiny_model

    model, out, hay = str(cached_tiny_model("tiny")), tmp_path / "needle", tmp_path / "haystack.txt"
    hay.write_text(TEXT * 40)
    common = ("--model", model, "--haystack", str(hay), "--out", str(out))
    first = _run(*common, "--stages", "model,data,sft")  # a run stopped after the SFT stage
    assert first.returncode == 0, first.stderr[-2000:]
    record = json.loads((out / "heldout.json").read_text())
    tasks = ("niah_multikey_2", "niah_single_1", "niah_single_2", "vt")
    assert record["ids"] == [f"{t}@{n}#0" for n in (1536, 2048) for t in tasks]
    assert record["rows"] == {"1536": 1, "2048": 1} and len(record["files"]) == 8 and len(record["sha256"]) == 64
    train = [json.loads(ln) for ln in (out / "train.jsonl").read_text().splitlines()]
    assert sorted(r["task_id"] for r in train) == sorted(f"{t}@1024#{i}" for t in tasks for i in range(2))
    assert (out / "sft.jsonl").read_text() == (out / "train.jsonl").read_text()  # 8 rows, the SFT model reads 8
    weights = out / "sft" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns

    done = _run(*common)  # every stage: model, data and sft are kept, rl / eval / table run
    assert done.returncode == 0, done.stderr[-2000:]
    assert weights.stat().st_mtime_ns == stamp
    assert "train-sft" not in done.stdout and "data build" not in done.stdout
    table = [ln for ln in (out / "results.md").read_text().splitlines() if ln.startswith("| ") and "greedy" in ln]
    assert [ln.split(" | ")[:4] for ln in table] == [
        ["| " + m, "greedy", str(n), "4"] for n in (1536, 2048) for m in ("zero-shot", "full context", "sft", "rl seed 0")]
    assert (out / "curve.png").is_file()
    # evaluation reads the whole document: no training cap on the chunks (the RL run keeps the preset's 8)
    evals = {p.parent.parent.name: json.loads(p.read_text()) for p in (out / "eval").glob("*/greedy/eval_config.json")}
    assert sorted(evals) == ["full_context", "rl_seed_0", "sft", "zero-shot"]
    assert [evals[m]["workflow_config"]["max_chunks"] for m in ("rl_seed_0", "sft", "zero-shot")] == [0, 0, 0]

    # a recorded held-out set that differs: refused in one line by the data stage
    bad = tmp_path / "record.json"
    bad.write_text(json.dumps({**record, "sha256": "0" * 64,
                               "files": {**record["files"], "1536/1536/data/vt/validation.jsonl": "0" * 64}}))
    refused = _run(*common, "--stages", "data", "--heldout-record", str(bad))
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == (
        f"data: the held-out set built here ({record['sha256'][:12]}) is not the recorded one {bad} (000000000000); "
        "first differing file: 1536/1536/data/vt/validation.jsonl (same tokenizer, haystack and builder?)")
