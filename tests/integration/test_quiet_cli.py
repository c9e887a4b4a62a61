"""`memrl train` and `memrl eval` print no library noise: no FutureWarning (transformers' past_key_values
rename), no "Loading weights" / "Writing model shards" progress bars, no "Token indices sequence length"
line for a document longer than the tokenizer's model_max_length (memrl chunks it on purpose).

Real CLI runs in subprocesses (the warnings and bars go to the process's stderr) on the tiny model:
a 2-step training run that saves a checkpoint, and an evaluation of two tasks whose document is 20,000
tokens (the tiny tokenizer's model_max_length is 16,384). About 25 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).parents[2]
NOISE = ("FutureWarning", "DeprecationWarning", "Loading weights", "Writing model shards",
         "Token indices sequence length", "it/s]")


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _memrl(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    env.pop("PYTHONWARNINGS", None)  # the defaults a user sees
    return subprocess.run([sys.executable, "-m", "memrl.cli", *args], capture_output=True, text=True,
                          env=env, timeout=600, cwd=ROOT)


def _assert_quiet(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = [n for n in NOISE if n in proc.stderr]
    assert found == [], proc.stderr[-3000:]


def test_train_two_steps_is_quiet(tiny_path, tmp_path):
    proc = _memrl(
        "train", f"model.path={tiny_path}", f"out_dir={tmp_path / 'run'}", "trainer.steps=2", "workflow=memagent",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "trainer.save_every=2", "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf",
    )
    _assert_quiet(proc)
    assert (tmp_path / "run" / "checkpoints" / "step_000002" / "model.safetensors").is_file()  # a save happened


def test_eval_of_a_document_longer_than_model_max_length_is_quiet(tiny_path, tmp_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    words = ("the river city film album band team game party state school book people war history ".split()
             * 1400)[:20000]
    doc = " ".join(words)
    n = len(tok.encode(doc, add_special_tokens=False, verbose=False))
    assert n > tok.model_max_length == 16384  # the document really is over the tokenizer's maximum
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"task_id": f"t{i}", "question": "Which city?", "answers": ["city"],
                                        "context": doc}) + "\n" for i in range(2)), encoding="utf-8")
    proc = _memrl("eval", "--model", tiny_path, "--out", str(tmp_path / "eval"), "--no-progress", str(data),
                  "workflow.chunk_tokens=256", "workflow.max_chunks=2", "workflow.max_memory_tokens=4",
                  "workflow.max_final_tokens=4")
    _assert_quiet(proc)
    rows = (tmp_path / "eval" / "results.jsonl").read_text().splitlines()
    assert len(rows) == 2
