"""MemAct data on the real shared HotpotQA / 2Wiki files: the paragraph corpus and multi-objective tasks."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from memrl.cli import main
from memrl.data.corpus import build_corpus, join_sentences, load_corpus, paragraph_id, write_corpus
from memrl.data.io import DataError, detect_kind, load_tasks
from memrl.data.multiobjective import build_multiobjective, load_multiobjective, write_multiobjective
from memrl.workflows.memact import default_prompt

DATA = Path("/work/shared/data")
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
TWOWIKI = DATA / "2wikimultihopqa_dev_500.json.xz"
pytestmark = pytest.mark.skipif(not HOTPOT.exists() or not TWOWIKI.exists(), reason="shared data not present")


@pytest.fixture(scope="module")
def pool():
    return load_tasks(HOTPOT) + load_tasks(TWOWIKI)


def test_join_sentences_hotpot_keeps_spaces_2wiki_gets_them():
    assert join_sentences(["Ed Wood is a film.", " It stars Depp."]) == "Ed Wood is a film. It stars Depp."
    assert join_sentences(["Daigo's reign spanned the years from 897 through 930.",
                           "He is named after his place of burial."]) == (
        "Daigo's reign spanned the years from 897 through 930. He is named after his place of burial.")


def test_corpus_from_hotpotqa_is_deduplicated_with_stable_ids(pool, tmp_path):
    hotpot = [t for t in pool if t.meta["dataset"] == "hotpotqa"]
    docs = build_corpus(hotpot)
    assert len(docs) == 11195  # of 11389 paragraphs in 1143 questions
    assert len({d.id for d in docs}) == len(docs)
    first = docs[0]
    assert first.title == "Ed Wood (film)"
    assert first.text.startswith("Ed Wood is a 1994 American biographical period comedy-drama film directed")
    assert first.id == hashlib.sha1(f"{first.title}\0{first.text}".encode()).hexdigest()[:16] == "c5c91e9acf5757d5"
    # same corpus whatever the question order: ids hash the content
    assert {d.id for d in build_corpus(list(reversed(hotpot)))} == {d.id for d in docs}
    out = tmp_path / "c.jsonl"
    assert write_corpus(out, docs) == 11195
    assert load_corpus(out) == docs


def test_corpus_cli_2wiki(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    assert main(["data", "corpus", "--source", "2wiki", str(TWOWIKI), "--out", str(out)]) == 0
    assert "wrote 3306 unique paragraphs of 5000 from 500 questions" in capsys.readouterr().out
    docs = {d.title: d for d in load_corpus(out)}
    d = docs["Emperor Daigo"]
    assert d.text == "Daigo's reign spanned the years from 897 through 930. He is named after his place of burial."
    assert d.id == paragraph_id(d.title, d.text)


def test_load_corpus_names_bad_lines(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"id": "a", "title": "A", "text": "x"}\n\n{"id": "b", "title": "B"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl: line 3: field 'text' must be a non-empty string"):
        load_corpus(p)
    p.write_text('{"id": "a", "title": "A", "text": "x"}\n{"id": "a", "title": "A", "text": "y"}\n')
    with pytest.raises(DataError, match=r"line 2: duplicate id 'a' \(first at line 1\)"):
        load_corpus(p)
    p.write_text('{"id": "a", "text": "x"\n')
    with pytest.raises(DataError, match=r"line 1: not valid JSON"):
        load_corpus(p)


def test_multiobjective_is_deterministic_and_hand_checked(pool):
    tasks = build_multiobjective(pool, 20, seed=42)
    assert tasks == build_multiobjective(pool, 20, seed=42)
    assert [t.answers for t in tasks] != [t.answers for t in build_multiobjective(pool, 20, seed=7)]
    assert sorted(len(t.answers) for t in tasks) == [2] * 8 + [3] * 12
    used = [i for t in tasks for i in t.meta["source_ids"]]
    assert len(used) == len(set(used))  # no question twice
    t = tasks[0]
    # checked by hand against the source files: the three ids are these questions with these answers
    assert t.task_id == "memact_multiobjective-0"
    assert t.context == ""
    assert t.meta["source_ids"] == ["5ac26d4d55429951e9e685b7", "5ae5429355429908b63265c5",
                                    "f23fe16c0baf11ebab90acde48001122"]
    assert t.meta["sub_questions"] == [
        "when did the black Angolan was one of the earliest African-American landowners in what would become "
        "the United States.acieved his freedom",
        "In what year was the aviator in whose honour the Quai d'Auteuil was renamed born?",
        "Who is Henry James Fitzroy, Earl Of Euston's paternal grandfather?",
    ]
    assert t.answers == ["in the early 17th-century", "1872", "Henry FitzRoy, 5th Duke of Grafton"]
    assert t.meta["sub_answers"] == [["in the early 17th-century"], ["1872"], ["Henry FitzRoy, 5th Duke of Grafton"]]
    assert t.meta["source"] == "2wikimultihopqa+hotpotqa"
    assert t.question == "Answer the following 3 questions.\n1. " + "\n".join(
        [t.meta["sub_questions"][0], "2. " + t.meta["sub_questions"][1], "3. " + t.meta["sub_questions"][2]])


def test_multiobjective_too_small_pool_is_an_error(pool):
    with pytest.raises(ValueError, match="makes only 1 of the 2 tasks"):
        build_multiobjective(pool[:4], 2, seed=0, sizes=(3,))


def _same_task(a, b):
    keys = ("sub_questions", "sub_answers", "source", "source_ids", "index")
    return (a.task_id, a.question, a.context, a.answers, {k: a.meta[k] for k in keys}) == (
        b.task_id, b.question, b.context, b.answers, {k: b.meta[k] for k in keys})


def test_multiobjective_parquet_round_trip_and_layout(pool, tmp_path):
    tasks = build_multiobjective(pool, 12, seed=3)
    p = tmp_path / "mo.parquet"
    assert write_multiobjective(p, tasks, prompt=default_prompt) == 12
    assert detect_kind(p) == "multiobjective"
    back = load_tasks(p)
    assert all(_same_task(a, b) for a, b in zip(back, tasks, strict=True))
    # the rows read back write the same rows again (the reader keeps the prompt and ground-truth text)
    write_multiobjective(tmp_path / "again.parquet", back)
    assert pq.read_table(tmp_path / "again.parquet").to_pylist() == pq.read_table(p).to_pylist()
    row = pq.read_table(p).to_pylist()[0]
    # the published layout: prompt [system, user], ground truth a JSON object keyed Q1..Qk
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert tasks[0].question in row["prompt"][1]["content"]
    assert row["agent_name"] == "mem_agent" and row["data_source"] == "memact_multiobjective"
    keyed = {f"Q{i}": a for i, a in enumerate(tasks[0].answers, start=1)}
    assert json.loads(row["reward_model"]["ground_truth"]) == keyed
    ex = row["extra_info"]
    assert ex["question"] == tasks[0].question and json.loads(ex["ground_truth"]) == keyed
    assert ex["source_ids"] == tasks[0].meta["source_ids"]
    # JSONL rows read the same; an older file's list ground truth (not JSON text) is accepted too
    j = tmp_path / "mo.jsonl"
    write_multiobjective(j, tasks, prompt=default_prompt)
    assert all(_same_task(a, b) for a, b in zip(load_tasks(j), tasks, strict=True))
    rec = json.loads(j.read_text().splitlines()[0])
    rec["reward_model"]["ground_truth"] = tasks[0].answers
    rec["extra_info"]["sub_questions"] = tasks[0].meta["sub_questions"][:1]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(rec) + "\n")
    with pytest.raises(DataError, match=r"bad.jsonl: row 0: 1 sub_questions but 3 answers"):
        load_multiobjective(bad)


def test_data_build_multiobjective_cli(tmp_path, capsys):
    out = tmp_path / "mo.parquet"
    argv = ["data", "build", "--kind", "multiobjective", "--source", str(HOTPOT), str(TWOWIKI),
            "--out", str(out), "--num-questions", "20", "--seed", "42"]
    assert main(argv) == 0
    assert "wrote 20 multi-objective tasks (sub-questions: {2: 8, 3: 12}, seed 42)" in capsys.readouterr().out
    tasks = load_tasks(out)
    assert tasks[0].answers == ["in the early 17th-century", "1872", "Henry FitzRoy, 5th Duke of Grafton"]
