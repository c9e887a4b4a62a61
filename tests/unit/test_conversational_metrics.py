"""LoCoMo's official QA score, its Porter stemmer, and LongMemEval's rule score, abstention rule and judge prompts,
on values computed by hand (each case says how)."""

from __future__ import annotations

from pathlib import Path

import pytest

from memrl.data.io import load_tasks
from memrl.rewards import longmemeval as lme
from memrl.rewards.eval_metrics import metric_value
from memrl.rewards.locomo import locomo_f1, locomo_score, normalize, stemmed_f1
from memrl.rewards.porter import stem

DATA = Path(__file__).parents[1] / "data" / "conversational"
LOCOMO = DATA / "locomo_tiny.json"
LME = DATA / "longmemeval_s_tiny.json"

# Porter's paper's examples and NLTK's default-mode departures (ties, skies, dying, cried, generalli)
STEMS = {"caresses": "caress", "ponies": "poni", "ties": "tie", "cats": "cat", "agreed": "agre",
         "plastered": "plaster", "motoring": "motor", "sing": "sing", "conflated": "conflat", "hopping": "hop",
         "falling": "fall", "filing": "file", "happy": "happi", "sky": "sky", "skies": "sky", "relational": "relat",
         "generalization": "gener", "running": "run", "dying": "die", "marathons": "marathon", "yes": "ye",
         "called": "call", "likely": "like", "cried": "cri", "generalli": "gener", "hopeful": "hope", "is": "is",
         "Running": "run"}


@pytest.mark.parametrize("word, expected", sorted(STEMS.items()))
def test_porter_stems(word, expected):
    assert stem(word) == expected


def test_locomo_normalization_drops_commas_punctuation_articles_and_and():
    assert normalize("The cat, a dog and AN owl!") == "cat dog owl"
    assert normalize("March 3, 2023") == "march 3 2023"


@pytest.mark.parametrize("prediction, gold, category, expected", [
    # 1 multi-hop: gold parts "violin" (best 0) and "guitar" (pred tokens [guitar, piano]: P 1/2, R 1 -> 2/3)
    ("guitar and piano", "violin, guitar", 1, (0 + 2 / 3) / 2),
    # 1 multi-hop, both parts named in one comma-separated answer: 1 each
    ("guitar, violin", "violin, guitar", 1, 1.0),
    # 2 temporal: [in, march, 2023] vs [week, befor, 3, march, 2023]: 2 shared, P 2/3, R 2/5 -> 1/2
    ("in March 2023", "The week before 3 March 2023", 2, 0.5),
    # 2: the comma goes, the article goes: the same multiset -> 1
    ("the week before March 3, 2023", "The week before 3 March 2023", 2, 1.0),
    # 3 open-domain: against "Likely yes" only: [he, would, like, enjoy, it] vs [like, ye]: P 1/5, R 1/2 -> 2/7
    ("He would likely enjoy it", "Likely yes; he trains for marathons", 3, 2 / 7),
    # 4 single-hop: [her, cat, is, call, miso] vs [miso]: P 1/5, R 1 -> 1/3
    ("Her cat is called Miso.", "Miso", 4, 1 / 3),
    # 4: stemming makes "running marathons" and "marathon running" the same tokens
    ("running marathons", "marathon running", 4, 1.0),
    # 4: "and" is dropped like an article
    ("guitar violin", "violin and guitar", 4, 1.0),
    (" ", "Miso", 4, 0.0),
    # 5 adversarial: only saying it is not mentioned / not available scores
    ("Not mentioned in the conversation", "not mentioned", 5, 1.0),
    ("No information available.", "not mentioned", 5, 1.0),
    ("Miso", "not mentioned", 5, 0.0),
    ("I don't know", "not mentioned", 5, 0.0),
])
def test_locomo_score_by_category(prediction, gold, category, expected):
    assert locomo_score(prediction, gold, category) == pytest.approx(expected, abs=1e-12)


def test_locomo_open_domain_scores_only_the_part_before_the_semicolon():
    # against the whole gold: [he, would, like, enjoy, it] vs [like, ye, he, train, for, marathon]: 2 shared,
    # P 2/5, R 2/6 -> 4/11; the official score reads "Likely yes" only -> 2/7
    assert stemmed_f1("He would likely enjoy it", "Likely yes; he trains for marathons") == pytest.approx(4 / 11)
    assert locomo_score("He would likely enjoy it", "Likely yes; he trains for marathons", 3) == pytest.approx(2 / 7)


def test_locomo_metric_reads_the_task_category():
    tasks = {t.task_id: t for t in load_tasks(LOCOMO)}
    assert metric_value("locomo_f1", "guitar and piano", tasks["conv-1_q0"].answers,
                        tasks["conv-1_q0"].meta) == pytest.approx(1 / 3)
    assert metric_value("locomo_f1", "It was not mentioned.", tasks["conv-1_q4"].answers, tasks["conv-1_q4"].meta) == 1.0
    assert metric_value("locomo_f1", "Miso", tasks["conv-1_q4"].answers, tasks["conv-1_q4"].meta) == 0.0
    assert metric_value("locomo_f1", "in 2021", tasks["conv-2_q0"].answers, tasks["conv-2_q0"].meta) == \
        pytest.approx(2 / 3)  # [in, 2021] vs [2021]: P 1/2, R 1
    with pytest.raises(ValueError, match="meta\\['category'\\]"):
        locomo_f1("x", ["y"], {})


@pytest.mark.parametrize("task_id, prediction, expected", [
    ("q_ssu_1", "It is a golden retriever.", 1.0),   # normalized gold "golden retriever" is in the reply
    ("q_ssu_1", "a retriever", 0.0),
    ("q_tr_2", "18 days", 1.0),
    ("q_tr_2", "19 days ago", 1.0),                   # off by one day still counts (the judge's allowance)
    ("q_tr_2", "20 days", 0.0),
    ("q_tr_2", "19 weeks", 0.0),                      # the unit must match
    ("q_ms_5", "You have 3 pets.", 1.0),
    ("q_ms_5", "You have 13 pets.", 0.0),             # whole words only
    ("q_ku_3_abs", "You never mentioned where your sister works.", 1.0),
    ("q_ku_3_abs", "That information is not available in our chats.", 1.0),
    ("q_ku_3_abs", "I don't know.", 1.0),
    ("q_ku_3_abs", "She works in Leeds.", 0.0),
    ("q_pref_4", "Go hiking with your dog.", 0.0),    # a rubric is rarely met word for word: the rule's limit
    ("q_ssu_1", "", 0.0),
])
def test_longmemeval_rule(task_id, prediction, expected):
    task = {t.task_id: t for t in load_tasks(LME)}[task_id]
    assert metric_value("longmemeval_rule", prediction, task.answers, task.meta) == expected


@pytest.mark.parametrize("text, expected", [
    ("The information is not provided.", True), ("You didn't mention that.", True),
    ("You didn\u2019t say.", True), ("I cannot determine that from our conversation.", True),
    ("There is no record of it.", True), ("Leeds", False), ("It is mentioned twice: Leeds.", False),
])
def test_abstains(text, expected):
    assert lme.abstains(text) is expected


def test_judge_prompt_kind_by_question_type():
    kinds = {t.task_id: lme.prompt_kind(t.meta["question_type"], t.meta["abstention"]) for t in load_tasks(LME)}
    assert kinds == {"q_ssu_1": "answer", "q_tr_2": "temporal", "q_ku_3_abs": "abstention", "q_pref_4": "preference",
                     "q_ms_5": "answer"}
    assert lme.prompt_kind("single-session-assistant", False) == "answer"
    assert lme.prompt_kind("knowledge-update", False) == "update"
    with pytest.raises(ValueError, match="unknown LongMemEval question_type 'trivia'"):
        lme.prompt_kind("trivia", False)


def test_judge_prompts_fill_named_or_positional_slots(tmp_path):
    assert lme.render_prompt("Q={question} G={gold} P={prediction} {x}", "q", "g", "p") == "Q=q G=g P=p {x}"
    assert lme.render_prompt("Q: {}\nA: {}\nR: {}\nok?", "q", "g", "p") == "Q: q\nA: g\nR: p\nok?"
    for kind, text in lme.PROMPTS.items():  # memrl's own prompts name every slot
        assert lme.check_prompt(text, kind) == text
    with pytest.raises(ValueError, match="missing temporal.txt, update.txt, preference.txt, abstention.txt"):
        (tmp_path / "answer.txt").write_text("{question} {gold} {prediction}")
        lme.load_prompts(str(tmp_path))
    for k in lme.PROMPT_KINDS:
        (tmp_path / f"{k}.txt").write_text(f"{k}: {{}} / {{}} / {{}}")
    assert lme.load_prompts(str(tmp_path))["update"] == "update: {} / {} / {}"
    (tmp_path / "update.txt").write_text("only {question}")
    with pytest.raises(ValueError, match=r"update.txt: a judge prompt needs the slots"):
        lme.load_prompts(str(tmp_path))


@pytest.mark.parametrize("reply, expected", [
    ("Yes", True), ("yes.", True), ("No", False), ("no, it says yesterday", True),  # "yes" anywhere, as published
    ("<think>yes?</think>No", False), ("", False),
])
def test_verdict_reads_yes_as_published(reply, expected):
    assert lme.verdict_yes(reply) is expected
