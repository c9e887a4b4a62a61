"""LoCoMo and LongMemEval loaders on hand-written fixtures in their published layouts (tests/data/conversational):
the exact Tasks (context with dated sessions and speakers, question, answers, meta), detection by load_tasks,
and one-line errors naming file, row and field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.data.errors import DataError
from memrl.data.io import detect_kind, load_tasks
from memrl.data.locomo import CATEGORIES
from memrl.data.longmemeval import dataset_name
from memrl.types import Task

DATA = Path(__file__).parents[1] / "data" / "conversational"
LOCOMO = DATA / "locomo_tiny.json"
LME = DATA / "longmemeval_s_tiny.json"

CONV1 = ("A conversation between Ana and Ben.\n\n"
         "[Session 1, 9:00 am on 3 March, 2023]\n"
         "Ana: I adopted a cat named Miso last week.\n"
         "Ben: Lovely! I am training for the Lisbon marathon. [shares an image: a photo of running shoes]\n\n"
         "[Session 2, 6:30 pm on 20 April, 2023]\n"
         "Ana: Miso knocked over my violin and guitar.\n"
         "Ben: The marathon went well, I ran it in Lisbon on Sunday.")
CONV2 = ("A conversation between Cy and Dee.\n\n"
         "[Session 1, 8:15 pm on 5 June, 2023]\n"
         "Cy: I moved to Porto in 2021.\n"
         "Dee: Nice, I still live in Oslo.")


def _locomo_meta(category: int, evidence: list[str], sample: str = "conv-1", speakers=("Ana", "Ben"),
                 sessions: int = 2, **extra) -> dict:
    return {"dataset": "locomo", "layout": "locomo", "category": category, "question_type": CATEGORIES[category],
            "evidence": evidence, "sample_id": sample, "speakers": list(speakers), "sessions": sessions,
            "metric": "locomo_f1", **extra}


def test_category_names_follow_the_published_numbering():
    assert CATEGORIES == {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


def test_locomo_tasks_are_exact():
    assert detect_kind(LOCOMO) == "locomo"
    tasks = load_tasks(LOCOMO)
    assert tasks == [
        Task("conv-1_q0", "What instruments does Ana play?", CONV1, ["violin, guitar"], _locomo_meta(1, ["D2:1"])),
        Task("conv-1_q1", "When did Ana adopt Miso?", CONV1, ["The week before 3 March 2023"],
             _locomo_meta(2, ["D1:1"])),
        Task("conv-1_q2", "Would Ben enjoy a running club?", CONV1, ["Likely yes; he trains for marathons"],
             _locomo_meta(3, ["D1:2"])),
        Task("conv-1_q3", "What is the name of Ana's cat?", CONV1, ["Miso"], _locomo_meta(4, ["D1:1"])),
        # adversarial: no answer in the file; the gold is what the official score accepts, the bait is kept
        Task("conv-1_q4", "What is the name of Ben's cat?", CONV1, ["not mentioned"],
             _locomo_meta(5, ["D1:1"], adversarial_answer="Miso")),
        # a numeric answer becomes its text; a conversation's tasks share its context
        Task("conv-2_q0", "When did Cy move to Porto?", CONV2, ["2021"],
             _locomo_meta(2, ["D1:1"], sample="conv-2", speakers=("Cy", "Dee"), sessions=1)),
    ]
    assert tasks[0].context is tasks[4].context  # one string per conversation, not one per question


def test_locomo_limit_counts_questions():
    assert [t.task_id for t in load_tasks(LOCOMO, limit=2)] == ["conv-1_q0", "conv-1_q1"]


def test_longmemeval_tasks_are_exact():
    assert detect_kind(LME) == "longmemeval"
    tasks = load_tasks(LME)
    assert [t.task_id for t in tasks] == ["q_ssu_1", "q_tr_2", "q_ku_3_abs", "q_pref_4", "q_ms_5"]
    base = {"dataset": "longmemeval_s", "layout": "longmemeval", "metric": "longmemeval_rule", "judge": "longmemeval"}
    assert tasks[0] == Task(
        "q_ssu_1", "(Current date: 2023/05/30 (Tue) 23:40) What breed is my dog?",
        "[Session 1, 2023/05/20 (Sat) 02:21]\nuser: Any tips for walking my Golden Retriever?\n"
        "assistant: Keep walks regular.\n\n[Session 2, 2023/05/25 (Thu) 10:05]\nuser: Suggest a pasta recipe.\n"
        "assistant: Try cacio e pepe.",
        ["Golden Retriever"],
        {**base, "question_type": "single-session-user", "abstention": False, "question": "What breed is my dog?",
         "question_date": "2023/05/30 (Tue) 23:40", "answer_session_ids": ["s_a"], "sessions": 2,
         "evidence_turns": [[0, 0]]})
    assert tasks[2] == Task(
        "q_ku_3_abs", "(Current date: 2023/07/01 (Sat) 08:00) Where does my sister work now?",
        "[Session 1, 2023/06/28 (Wed) 19:30]\nuser: My sister started school in Leeds.\nassistant: Good luck to her!",
        ["The history mentions the sister's school, not where she works."],
        {**base, "question_type": "knowledge-update", "abstention": True,
         "question": "Where does my sister work now?", "question_date": "2023/07/01 (Sat) 08:00",
         "answer_session_ids": [], "sessions": 1, "evidence_turns": []})
    # a numeric answer becomes its text; evidence turns over two sessions
    assert tasks[4].answers == ["3"] and tasks[4].meta["evidence_turns"] == [[0, 0], [1, 0]]
    assert [t.meta["question_type"] for t in tasks] == [
        "single-session-user", "temporal-reasoning", "knowledge-update", "single-session-preference", "multi-session"]


@pytest.mark.parametrize("name, expected", [
    ("longmemeval_s_cleaned.json", "longmemeval_s"), ("longmemeval_m.json", "longmemeval_m"),
    ("longmemeval_oracle.json", "longmemeval_oracle"), ("my_history.json", "longmemeval"),
    ("longmemeval_sample.json", "longmemeval"),
])
def test_longmemeval_dataset_comes_from_the_file_name(name, expected):
    assert dataset_name(name) == expected


def _write(tmp_path: Path, name: str, records) -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(records), encoding="utf-8")
    return p


def test_locomo_errors_name_row_and_field(tmp_path):
    good = json.loads(LOCOMO.read_text())
    no_date = json.loads(json.dumps(good))
    del no_date[1]["conversation"]["session_1_date_time"]
    with pytest.raises(DataError, match=r"row 1: conversation.session_1_date_time \(the session's date\) is missing"):
        load_tasks(_write(tmp_path, "a.json", no_date), kind="locomo")
    bad_cat = json.loads(json.dumps(good))
    bad_cat[0]["qa"][2]["category"] = 7
    with pytest.raises(DataError, match=r"row 0: qa\[2\]: field 'category' must be one of 1-5"):
        load_tasks(_write(tmp_path, "b.json", bad_cat))
    # skip_bad drops the malformed conversation whole, keeps the other
    assert [t.task_id for t in load_tasks(_write(tmp_path, "c.json", bad_cat), skip_bad=True)] == ["conv-2_q0"]
    no_answer = json.loads(json.dumps(good))
    del no_answer[1]["qa"][0]["answer"]
    with pytest.raises(DataError, match=r"row 1: qa\[0\]: field 'answer' must be a string or a number"):
        load_tasks(_write(tmp_path, "d.json", no_answer))


def test_longmemeval_errors_name_row_and_field(tmp_path):
    good = json.loads(LME.read_text())
    bad = json.loads(json.dumps(good))
    bad[1]["question_type"] = "trivia"
    with pytest.raises(DataError, match=r"row 1: field 'question_type' must be one of single-session-user"):
        load_tasks(_write(tmp_path, "longmemeval_s.json", bad))
    bad = json.loads(json.dumps(good))
    bad[0]["haystack_dates"] = bad[0]["haystack_dates"][:1]
    with pytest.raises(DataError, match=r"row 0: haystack_dates has 1 dates for 2 haystack_sessions"):
        load_tasks(_write(tmp_path, "longmemeval_s.json", bad))
    bad = json.loads(json.dumps(good))
    del bad[3]["haystack_sessions"][0][0]["content"]
    with pytest.raises(DataError, match=r"row 3: haystack_sessions\[0\]\[0\]: missing field 'content'"):
        load_tasks(_write(tmp_path, "longmemeval_s.json", bad))
