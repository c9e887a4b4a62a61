"""benchmarks/infomem_effect.py's table (memrl.recipes.seeds.arm_cells and paired), hand-checked on fabricated runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("infomem_effect", ROOT / "benchmarks" / "infomem_effect.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["infomem_effect"] = mod
    spec.loader.exec_module(mod)
    return mod


def _run(out: Path, arm: str, seed: int, greedy: float, sampled: float, rl_s: float, reward_s: float) -> None:
    d = out / arm / f"seed{seed}"
    d.mkdir(parents=True)
    rl = {"8": {"greedy": {"accuracy": greedy}, "sampled": {"accuracy": sampled}}}
    (d / "result.json").write_text(json.dumps({"arm": arm, "seed": seed, "data_seed": 7 + seed, "trainer_seed": seed,
                                               "rl": rl, "rl_s": rl_s, "model_reward_s": reward_s}))


def test_table_by_hand(tmp_path):
    """outcome greedy 80, 90: 85 +- 5 (sd 5 sqrt(2) / sqrt(2)); infomem 85, 99: 92 +- 7; paired 5, 9: 7 +- 2.
    Seed 2 has only outcome: left out of the pairs. RL s: the mean over each arm's seeds."""
    b = _bench()
    for seed, (g, s) in enumerate(((80.0, 50.0), (90.0, 60.0), (70.0, 40.0))):
        _run(tmp_path, "outcome", seed, g, s, 100.0 + seed, 0.0)
    for seed, (g, s) in enumerate(((85.0, 52.0), (99.0, 60.0))):
        _run(tmp_path, "infomem", seed, g, s, 130.0 + 10 * seed, 8.0 + seed)
    text = b.aggregate(tmp_path, None)
    assert "(mean ± s.e. over seeds outcome: [0, 1, 2], infomem: [0, 1])" in text
    assert "| outcome | 8 | 80.0 ± 5.8 | 50.0 ± 5.8 | 101 | 0.0 |" in text  # 80, 90, 70: sd 10 / sqrt(3)
    assert "| infomem | 8 | 92.0 ± 7.0 | 56.0 ± 4.0 | 135 | 8.5 |" in text
    assert "paired difference infomem - outcome over seeds [0, 1]" in text
    assert "| 8 | 7.0 ± 2.0 | 1.0 ± 1.0 |" in text  # unsigned, as before
    assert "- infomem seed 1 (data.seed 8, trainer.seed 1): 8: 99.0 / 60.0" in text
    assert (tmp_path / "results.md").read_text() == text


def test_one_seed_prints_the_mean_alone(tmp_path):
    b = _bench()
    _run(tmp_path, "outcome", 0, 80.0, 50.0, 100.0, 0.0)
    _run(tmp_path, "infomem", 1, 85.0, 52.0, 130.0, 8.0)
    text = b.aggregate(tmp_path, None)
    assert "| outcome | 8 | 80.0 | 50.0 | 100 | 0.0 |" in text
    assert "over seeds [], percentage points" in text and "| 8 | | |" in text  # no seed has both arms


def test_the_start_row_is_the_from_demos_sft_summary(tmp_path):
    """--from: the demo's results.json (the one layout) gives the SFT row, its summary rows of policy sft at the
    run's lengths; a results.json of the old layout is refused in one line."""
    import pytest

    b = _bench()
    _run(tmp_path / "out", "outcome", 0, 80.0, 50.0, 100.0, 0.0)
    src = tmp_path / "demo"
    src.mkdir()
    summary = [{"policy": p, "decoding": m, "bucket": n, "accuracy": acc}
               for p, n, m, acc in (("sft", "8", "greedy", 62.5), ("sft", "8", "sampled", 41.25),
                                    ("rl", "8", "greedy", 99.0), ("sft", "16", "greedy", 3.0))]
    (src / "results.json").write_text(json.dumps({"summary": summary}))
    text = b.aggregate(tmp_path / "out", src)
    assert "| SFT (start, from --from) | 8 | 62.5 | 41.2 | | |" in text
    (src / "results.json").write_text(json.dumps({"stages": {"sft": {}}}))
    with pytest.raises(SystemExit, match="results.json has no summary rows"):
        b.aggregate(tmp_path / "out", src)
