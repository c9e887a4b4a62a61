"""Long-context builder on the real data: deterministic bytes, gold paragraphs present at every N."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
from doubles import CharTokenizer

from memrl.commands.data import context_token_stats
from memrl.data import hotpotqa, memagent_files, twowiki
from memrl.data.hotpotqa import gold_paragraph_indices, paragraph_text
from memrl.data.longctx import DocPool, build_eval_sets, build_long_task, build_train_set, min_gap
from memrl.types import Task

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
TWOWIKI = DATA / "2wikimultihopqa_dev_500.json.xz"
needs_data = pytest.mark.skipif(not HOTPOT.exists() or not TWOWIKI.exists(),
                                reason=f"shared real data not found at {DATA.resolve()}")
_DOC = re.compile(r"(?:^|\n\n)Document (\d+):\n")


@pytest.fixture(scope="module")
def hotpot():
    return hotpotqa.load_hotpotqa(HOTPOT)


def split_docs(context: str) -> list[str]:
    """The documents of a rendered context as "title\\ntext", checking they are numbered 1..N."""
    parts = _DOC.split(context)
    nums = [int(x) for x in parts[1::2]]
    assert nums == list(range(1, len(nums) + 1))
    return parts[2::2]


def check_built(src: Task, built: Task, n: int) -> None:
    docs = split_docs(built.context)
    assert len(docs) == n and built.meta["num_docs"] == n
    own = src.meta["paragraphs"]
    gold = [f"{own[i]['title']}\n{paragraph_text(own[i]['sentences'])}" for i in gold_paragraph_indices(src)]
    assert gold, src.task_id
    at = [docs[p] for p in built.meta["evidence_idx"]]
    assert sorted(at) == sorted(gold)  # every gold paragraph, exactly at the recorded positions
    own_titles = {p["title"] for p in own}
    own_texts = {f"{p['title']}\n{paragraph_text(p['sentences'])}" for p in own}
    # padding never repeats a title of the question's own paragraphs; no document appears twice
    assert all(d in own_texts for d in docs if d.split("\n", 1)[0] in own_titles)
    assert len(set(docs)) == len(docs) or len(set(own_texts)) < len(own)
    assert built.meta["min_distance"] == min_gap(built.meta["evidence_idx"])
    assert (built.question, built.answers, built.task_id) == (src.question, src.answers, src.task_id)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@needs_data
def test_build_is_deterministic_and_places_gold_everywhere(tmp_path, hotpot):
    counts = (50, 100, 200, 400)
    a = build_eval_sets(hotpot, tmp_path / "a", counts, num_questions=128, seed=7)
    b = build_eval_sets(hotpot, tmp_path / "b", counts, num_questions=128, seed=7)
    build_eval_sets(hotpot, tmp_path / "c", (50,), num_questions=128, seed=8)
    for n in counts:
        assert _sha(tmp_path / "a" / f"eval_{n}.json") == _sha(tmp_path / "b" / f"eval_{n}.json")
    assert _sha(tmp_path / "a" / "eval_50.json") != _sha(tmp_path / "c" / "eval_50.json")
    assert a.question_ids == b.question_ids and len(a.question_ids) == 128
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["seed"] == 7 and manifest["doc_counts"] == list(counts)
    by_id = {t.task_id: t for t in hotpot}
    for n in counts:
        built = memagent_files.load_eval_json(tmp_path / "a" / f"eval_{n}.json")
        assert [t.task_id for t in built] == a.question_ids  # same questions at every N
        assert [t.meta["index"] for t in built] == list(range(128))
        assert all(t.meta["seed"] == 7 for t in built)
        for t in built:
            check_built(by_id[t.task_id], t, n)


@needs_data
def test_gold_present_at_6400_docs(hotpot):
    pool = DocPool.from_tasks(hotpot)
    for pos in (0, 1):
        src = hotpot[pos * 500]
        check_built(src, build_long_task(src, pool, 6400, 3, pos), 6400)


@needs_data
def test_twowiki_builds_and_rejects_n_beyond_pool(tmp_path):
    tasks = twowiki.load_twowiki(TWOWIKI)
    pool = DocPool.from_tasks(tasks)
    for i, t in enumerate(tasks[:40]):
        check_built(t, build_long_task(t, pool, 200, 0, i), 200)
    with pytest.raises(ValueError, match="pool has only"):
        build_long_task(tasks[0], pool, len(pool) + 10, 0, 0)


def test_fewer_slots_than_own_paragraphs_keeps_gold():
    paras = [{"title": f"T{i}", "sentences": [f"text {i}."]} for i in range(6)]
    t = Task("q", "?", "", ["a"], meta={"paragraphs": paras, "supporting_facts": [["T4", 0], ["T5", 0]]})
    built = build_long_task(t, DocPool.from_tasks([t]), 3, 0, 0)
    docs = split_docs(built.context)
    assert len(docs) == 3 and {docs[p] for p in built.meta["evidence_idx"]} == {"T4\ntext 4.", "T5\ntext 5."}


def test_min_gap():
    assert min_gap([]) is None and min_gap([4]) is None and min_gap([1, 9, 12]) == 3


@needs_data
def test_train_set_parquet_and_token_stats(tmp_path, hotpot):
    out = tmp_path / "train.parquet"
    assert build_train_set(hotpot, out, num_docs=200, seed=1, num_questions=6) == 6
    rows = memagent_files.load_memagent_parquet(out)
    by_id = {t.task_id: t for t in hotpot}
    for t in rows:
        check_built(by_id[t.task_id], t, 200)
    ej = tmp_path / "eval_200.json"
    memagent_files.write_eval_json(ej, rows)
    [(n, q, toks, chars)] = context_token_stats([str(ej)], CharTokenizer())
    assert (n, q) == (200, 6) and toks == chars == sum(len(t.context) for t in rows) / 6
