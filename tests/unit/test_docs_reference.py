"""The generated reference pages (docs/reference/{cli,config,presets,registries}.md) are the code's: regenerated
and diffed, so a changed default, option, preset or registered name without `python -m memrl.docs_gen` fails."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

from memrl import docs_gen
from memrl.training.config import OptimSection, TrainConfig

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_reference_pages_are_current():
    # A fresh process: tests that register plugin workflows or estimators must not leak into the pages.
    r = subprocess.run([sys.executable, "-m", "memrl.docs_gen", "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr.strip().splitlines()[-1] if r.stderr.strip() else r.stdout


def test_a_changed_config_default_is_detected_without_regenerating(tmp_path, monkeypatch):
    ref = tmp_path / "reference"
    assert docs_gen.main(["--out", str(ref)]) == 0  # the pages as this process renders them now
    assert docs_gen.main(["--check", "--out", str(ref)]) == 0
    optim = next(f for f in dataclasses.fields(TrainConfig) if f.name == "optim")
    monkeypatch.setattr(optim, "default_factory", lambda: OptimSection(lr=2e-6))  # a new default lr
    assert docs_gen.stale(ref, docs_gen.render_all()) == ["config"]
    assert "| `optim.lr` | `float` | `2e-06` |" in docs_gen.render_config()


def test_the_check_names_the_page_and_the_command(tmp_path, capsys):
    ref = tmp_path / "reference"
    docs_gen.main(["--out", str(ref)])
    page = ref / "presets.md"
    page.write_text(page.read_text().replace("verl_hotpotqa", "boxed_em"))
    assert docs_gen.main(["--check", "--out", str(ref)]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "presets.md" in err and "python -m memrl.docs_gen" in err


def test_every_train_field_and_preset_has_a_row():
    config, presets = docs_gen.render_config(), docs_gen.render_presets()
    for section in ("model", "data", "algorithm", "optim", "trainer", "val", "rollout", "ray"):
        cls = type(getattr(TrainConfig(), section))
        for f in dataclasses.fields(cls):
            if not dataclasses.is_dataclass(getattr(cls(), f.name)):
                assert f"| `{section}.{f.name}` |" in config, f"{section}.{f.name} has no row"
    assert "| `trainer.mini_batch_ranks` | `32` | NNODES=4 x NGPUS_PER_NODE=8" in presets  # the upstream comment


def test_preset_comments_join_continuation_lines():
    text = ("# header line\n\nalgorithm:\n  grpo:\n    norm_by_std: true   # first part\n"
            "                        # second part\n  # a note on its own\n  n: 8\n")
    header, comments, notes = docs_gen.preset_comments(text)
    assert header == "header line"
    assert comments == {"algorithm.grpo.norm_by_std": "first part second part"}
    assert notes == [("algorithm", "a note on its own")]
