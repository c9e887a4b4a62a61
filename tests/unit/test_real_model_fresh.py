"""benchmarks/real_model_rl.py's fresh question set: built from the real HotpotQA dev file, it is the 96 ids
committed in docs/results/hotpot_fresh.json (in order, digest checked), disjoint from the 48 held-out questions
and the 480-question training pool, at 2 and 8 documents; a set with other ids is refused in one line."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOTPOT = ROOT.parent / "shared" / "data" / "hotpotqa_dev_distractor_1143.json.xz"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("real_model_rl", ROOT / "benchmarks" / "real_model_rl.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["real_model_rl"] = mod
    spec.loader.exec_module(mod)
    return mod


def test_the_record_is_its_own_digest(bench):
    rec = json.loads(bench.FRESH_RECORD.read_text())
    assert rec["questions"] == len(rec["ids"]) == len(set(rec["ids"])) == 96
    assert bench.ids_sha256(rec["ids"]) == rec["sha256"]
    assert bench.ids_sha256(["a", "b"]) == "911169ddaaf146aff539f58c26c489af3b892dff0fe283c1c264c65ae5aa59a2"  # sha256 of "a\nb\n"


@pytest.mark.skipif(not HOTPOT.is_file(), reason="needs the HotpotQA dev file beside the repository")
def test_fresh_set_is_built_from_the_dev_file_and_checked(bench, tmp_path, monkeypatch):
    args = argparse.Namespace(hotpot=str(HOTPOT), cold_start_questions=400)
    bench.data(args, tmp_path)
    rec = json.loads(bench.FRESH_RECORD.read_text())
    held = {r["id"] for r in json.loads((tmp_path / "eval" / "eval_2.json").read_text())}
    pool = {r["id"] for r in json.loads((tmp_path / "pool" / "eval_2.json").read_text())}
    rows = {n: json.loads((tmp_path / "fresh" / f"eval_{n}.json").read_text()) for n in (2, 8)}
    assert [r["id"] for r in rows[2]] == [r["id"] for r in rows[8]] == rec["ids"]
    assert {r["num_docs"] for r in rows[2]} == {2} and {r["num_docs"] for r in rows[8]} == {8}
    assert (len(held), len(pool), set(rec["ids"]) & (held | pool)) == (48, 480, set())
    # docs/results/real_model.md: nine of the 96 golds are yes or no, 5 yes and 4 no
    golds = [r["answers"][0].strip().lower() for r in rows[2]]
    assert (golds.count("yes"), golds.count("no")) == (5, 4)

    other = tmp_path / "record.json"
    other.write_text(json.dumps({**rec, "ids": rec["ids"][1:] + rec["ids"][:1]}))
    monkeypatch.setattr(bench, "FRESH_RECORD", other)
    with pytest.raises(SystemExit, match="record.json: the fresh set built from .* has other ids"):
        bench.data(args, tmp_path)
