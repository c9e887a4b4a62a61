"""End to end on real questions: a tiny local model runs MemAgent over a 20-question, 50-document set built
from the shared HotpotQA subset; the table, CSV and PNG agree with the JSONL, and a killed-then-resumed run
gives the same final table as the uninterrupted one (greedy decoding, engine batch size 1 so a request's
numbers never depend on its batch mates).

Small chunk / memory / answer budgets (and max_chunks=2) keep it to about a minute on 2 CPU cores.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data.hotpotqa import load_hotpotqa
from memrl.data.longctx import build_eval_sets
from memrl.eval.report import TABLE_COLUMNS, summarize
from memrl.eval.runner import RESULTS_FILE, read_results

pytestmark = pytest.mark.slow

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
OVERRIDES = [
    "workflow.chunk_tokens=256", "workflow.max_chunks=2", "workflow.max_memory_tokens=4",
    "workflow.max_final_tokens=4", "engine.max_batch_size=1", "concurrency=4",
]
TIME_COLUMNS = ("seconds_per_question", "mean_latency_seconds")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    if not HOTPOT.exists():
        pytest.skip(f"shared real data not found at {DATA.resolve()}")
    from memrl.models.tiny import cached_tiny_model

    root = tmp_path_factory.mktemp("eval_tiny")
    build_eval_sets(load_hotpotqa(HOTPOT), root / "data", (50,), num_questions=20, seed=5)
    model = cached_tiny_model("tiny")
    out = root / "full"
    rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", "--name", "tiny",
               str(root / "data" / "eval_50.json"), *OVERRIDES])
    assert rc == 0
    return root, model, out


def _table(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


def test_outputs_match_the_jsonl(setup):
    _, _, out = setup
    rows = read_results(out / RESULTS_FILE)
    assert len(rows) == 20 and len({r["task_id"] for r in rows}) == 20
    for r in rows:
        assert r["num_docs"] == 50 and r["model_calls"] == 3 and len(r["memory_trace"]) == 2
        assert r["tokens_read"] == 512 < r["context_tokens"] and r["generated_tokens"] <= 12
    for name in ("summary.md", "summary.csv", "accuracy.png", "eval_config.json"):
        assert (out / name).stat().st_size > 0, name
    assert (out / "accuracy.png").read_bytes()[:4] == b"\x89PNG"
    [row] = _table(out / "summary.csv")
    n = len(rows)
    recomputed = {
        "em": 100 * sum(r["em"] for r in rows) / n,
        "accuracy": 100 * sum(r["sub_em"] for r in rows) / n,
        "f1": 100 * sum(r["f1"] for r in rows) / n,
        "mean_tokens_read": sum(r["tokens_read"] for r in rows) / n,
        "mean_context_tokens": sum(r["context_tokens"] for r in rows) / n,
        "mean_generated_tokens": sum(r["generated_tokens"] for r in rows) / n,
        "mean_latency_seconds": sum(r["seconds"] for r in rows) / n,
        "seconds_per_question": (max(r["finished"] for r in rows) - min(r["started"] for r in rows)) / n,
    }
    assert row["run"] == "tiny" and int(row["num_docs"]) == 50 and int(row["questions"]) == 20
    assert row["dataset"] == "hotpotqa"  # the built set's rows carry source = hotpotqa
    for k, v in recomputed.items():
        assert float(row[k]) == pytest.approx(v, abs=1e-6), k
    md = (out / "summary.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith("| tiny |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[1] == "hotpotqa"  # the dataset column
    assert cells[4:7] == [f"{recomputed[k]:.2f}" for k in ("em", "accuracy", "f1")]
    assert cells[8] == f"{recomputed['mean_tokens_read']:.0f}"


def test_killed_then_restarted_run_gives_the_same_table(setup):
    root, model, out = setup
    resumed = root / "resumed"
    resumed.mkdir()
    shutil.copy(out / "eval_config.json", resumed / "eval_config.json")
    lines = (out / RESULTS_FILE).read_text().splitlines(keepends=True)
    # a kill after 9 rows, half-way through writing the 10th
    (resumed / RESULTS_FILE).write_text("".join(lines[:9]) + lines[9][: len(lines[9]) // 2])
    rc = main(["eval", "--model", str(model), "--out", str(resumed), "--no-progress", "--name", "tiny",
               str(root / "data" / "eval_50.json"), *OVERRIDES])
    assert rc == 0
    a, b = read_results(out / RESULTS_FILE), read_results(resumed / RESULTS_FILE)
    assert len(b) == 20
    pred = lambda rows: {r["task_id"]: (r["answer_text"], r["memory_trace"]) for r in rows}  # noqa: E731
    assert pred(a) == pred(b)
    ta, tb = _table(out / "summary.csv"), _table(resumed / "summary.csv")
    keep = [c for c in TABLE_COLUMNS if c not in TIME_COLUMNS]
    assert [{k: r[k] for k in keep} for r in ta] == [{k: r[k] for k in keep} for r in tb]
    sa, sb = summarize(a, "x")[0], summarize(b, "x")[0]
    assert (sa.em, sa.accuracy, sa.f1) == (sb.em, sb.accuracy, sb.f1)
    assert json.loads((resumed / "eval_config.json").read_text())["workflow"] == "memagent"


def test_rememr1_evaluates_the_real_set_and_counts_garbage(setup):
    root, model, _ = setup
    out = root / "rememr1"
    rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", "--name", "r1",
               str(root / "data" / "eval_50.json"), "workflow=rememr1", *OVERRIDES])
    assert rc == 0
    rows = read_results(out / RESULTS_FILE)
    assert len(rows) == 20
    for r in rows:
        assert r["num_docs"] == 50 and r["model_calls"] == 3 and len(r["memory_trace"]) == 2
        m = r["metrics"]
        # a random model writes no tags within 4 tokens: every memory step is a counted format error
        assert m["missing_update"] + m["unclosed_update"] + m["empty_update"] == m["format_errors"] == 2
        assert m["recalls"] == m["recall_rate"] == 0
    assert json.loads((out / "eval_config.json").read_text())["workflow"] == "rememr1"
    [row] = _table(out / "summary.csv")
    assert row["run"] == "r1" and int(row["questions"]) == 20
