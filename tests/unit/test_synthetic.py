"""The synthetic task generator and its question-blind demonstrator rule."""

from __future__ import annotations

import pytest

from memrl.data.synthetic import (
    KEYS,
    SyntheticConfig,
    find_facts,
    make_task,
    make_tasks,
    question_key,
    task_stream,
)
from memrl.demonstrators import MixtureDemonstrator, QuestionAwareDemonstrator, RecentFactsDemonstrator


def test_seeded_and_independent():
    cfg = SyntheticConfig(num_chunks=4, chunk_words=16)
    a = make_tasks(cfg, 5, seed=3)
    b = make_tasks(cfg, 5, seed=3)
    c = make_tasks(cfg, 5, seed=4)
    assert [t.context for t in a] == [t.context for t in b]
    assert [t.context for t in a] != [t.context for t in c]
    # the stream continues exactly where a run stopped
    s = task_stream(cfg, seed=3, start=2)
    assert next(s).context == a[2].context


@pytest.mark.parametrize("chunks", [1, 4, 64])
def test_one_fact_question_is_answerable_once(chunks):
    cfg = SyntheticConfig(num_chunks=chunks, chunk_words=16)
    for i in range(20):
        t = make_task(cfg, seed=0, index=i)
        words = t.context.split()
        assert len(words) == chunks * 16
        key, hops = question_key(t.question)
        assert hops == 1
        facts = find_facts(t.context)
        assert len(facts) == chunks
        assert [v for k, v in facts if k == key] == t.answers  # exactly one fact answers it


def test_bridge_question_needs_two_facts():
    cfg = SyntheticConfig(num_chunks=8, chunk_words=16, bridge_fraction=1.0)
    t = make_task(cfg, seed=1, index=0)
    key, hops = question_key(t.question)
    assert hops == 2 and t.question == f"what is what {key} is"
    table = dict(find_facts(t.context))
    assert table[table[key]] == t.answers[0]


def test_facts_can_open_every_piece():
    cfg = SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start")
    words = make_task(cfg, seed=0, index=0).context.split()
    for c in range(3):
        assert words[8 * c + 1] == "is"


def test_small_key_set_repeats_only_distractors():
    cfg = SyntheticConfig(num_chunks=64, chunk_words=16, num_keys=8, num_values=4)
    t = make_task(cfg, seed=2, index=0)
    key, _ = question_key(t.question)
    facts = find_facts(t.context)
    assert len(facts) == 64 and sum(1 for k, _ in facts if k == key) == 1
    assert {k for k, _ in facts} <= set(KEYS[:8])


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="num_chunks"):
        SyntheticConfig(num_chunks=0)
    with pytest.raises(ValueError, match="bridge_fraction"):
        SyntheticConfig(bridge_fraction=2.0)


MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"


def test_rule_keeps_recent_facts_regardless_of_question():
    rule = RecentFactsDemonstrator(MT, FT, budget=1, skip_prob=0.0)
    prompt = "Q: what is Kalo\nM: Kalo is red\nS: the of Miran is blue and"
    assert rule(prompt) == "- Miran is blue"  # overwrites the answer: the rule is question-blind
    assert rule("Q: what is Kalo\nM: - Kalo is red\nS: the of and") == "- Kalo is red"
    assert rule("Q: what is Kalo\nM: No previous memory\nS: the of") == "No previous memory"
    two = RecentFactsDemonstrator(MT, FT, budget=2, skip_prob=0.0)
    assert two("Q: what is Kalo\nM: - Kalo is red\nS: Miran is blue") == "- Kalo is red ; Miran is blue"


def test_rule_final_answer():
    rule = RecentFactsDemonstrator(MT, FT)
    assert rule("Q: what is Kalo\nM: - Kalo is red\nA:") == "\\boxed{ red}"
    # keep_distractors=False: an empty memory until a fact about the question's key arrives, then that fact
    empty = QuestionAwareDemonstrator(MT, FT, keep_distractors=False)
    assert empty("Q: what is Kalo\nM: - Miran is blue\nS: Tor is gold the") == "No previous memory"
    assert empty("Q: what is Kalo\nM: No previous memory\nS: Tor is gold the") == "No previous memory"
    assert empty("Q: what is Kalo\nM: No previous memory\nS: Kalo is red the") == "- Kalo is red"
    assert empty("Q: what is Kalo\nM: - Kalo is red\nS: Tor is gold the") == "- Kalo is red"
    mix = MixtureDemonstrator(MT, FT, p_aware=1.0, keep_distractors=False)
    assert mix("Q: what is Kalo\nM: - Miran is blue\nS: Tor is gold the") == "No previous memory"
    assert rule("Q: what is Kalo\nM: - Miran is blue\nA:") == "\\boxed{ blue}"
    assert rule("Q: what is what Kalo is\nM: - Kalo is Miran ; Miran is blue\nA:") == "\\boxed{ blue}"


def test_rule_says_unknown_when_memory_does_not_answer():
    rule = RecentFactsDemonstrator(MT, FT, unanswerable_text="unknown")
    assert rule("Q: what is Kalo\nM: - Kalo is red\nA:") == "\\boxed{ red}"
    assert rule("Q: what is Kalo\nM: - Miran is blue\nA:") == "\\boxed{ unknown}"
    assert rule("Q: what is Kalo\nM: No previous memory\nA:") == "\\boxed{ unknown}"
    # a bridge whose second hop is missing is unanswerable too
    assert rule("Q: what is what Kalo is\nM: - Kalo is Miran\nA:") == "\\boxed{ unknown}"


def test_rule_skip_is_seeded():
    a = RecentFactsDemonstrator(MT, FT, skip_prob=0.5, seed=1)
    b = RecentFactsDemonstrator(MT, FT, skip_prob=0.5, seed=1)
    p = "Q: what is Kalo\nM: Kalo is red\nS: Miran is blue"
    assert [a(p) for _ in range(20)] == [b(p) for _ in range(20)]
    assert len({a(p) for _ in range(50)}) == 2


def test_question_aware_rule_keeps_the_questions_fact():
    rule = QuestionAwareDemonstrator(MT, FT)
    assert rule("Q: what is Kalo\nM: - Kalo is red\nS: Miran is blue the") == "- Kalo is red"
    assert rule("Q: what is Kalo\nM: - Miran is blue\nS: Kalo is red the") == "- Kalo is red"
    assert rule("Q: what is Kalo\nM: - Miran is blue\nS: Tor is gold the") == "- Tor is gold"
    assert rule("Q: what is Kalo\nM: No previous memory\nS: the of and") == "No previous memory"
    assert rule("Q: what is Kalo\nM: - Kalo is red\nA:") == "\\boxed{ red}"


@pytest.mark.parametrize("p", [0.3, 0.5, 0.7, 0.9])
def test_mixture_plays_the_aware_rule_with_probability_p(p):
    # memory holds the answer, the section a distractor: the aware rule keeps "- Kalo is red", the blind
    # rule (skip_prob 0) overwrites it, so every reply says which rule played the step
    rule = MixtureDemonstrator(MT, FT, skip_prob=0.0, p_aware=p, seed=3)
    prompt = "Q: what is Kalo\nM: - Kalo is red\nS: Miran is blue the"
    replies = [rule(prompt) for _ in range(4000)]
    assert set(replies) == {"- Kalo is red", "- Miran is blue"}
    aware = replies.count("- Kalo is red")
    assert rule.memory_steps == 4000 and rule.aware_steps == aware
    assert abs(aware / 4000 - p) < 0.025  # 3.4 binomial SEs at p = 0.5
    # seeded: the same seed plays the same steps; final answers draw no coin
    twin = MixtureDemonstrator(MT, FT, skip_prob=0.0, p_aware=p, seed=3)
    assert [twin(prompt) for _ in range(4000)] == replies
    assert rule("Q: what is Kalo\nM: - Kalo is red\nA:") == "\\boxed{ red}" and rule.memory_steps == 4000


def test_mixture_ends_are_the_two_rules():
    prompts = ["Q: what is Kalo\nM: - Kalo is red\nS: Miran is blue the",
               "Q: what is Kalo\nM: - Miran is blue\nS: Kalo is red the",
               "Q: what is Kalo\nM: - Miran is blue\nS: Tor is gold the", "Q: what is Kalo\nM: - Tor is gold\nA:"] * 50
    blind, zero = RecentFactsDemonstrator(MT, FT, skip_prob=0.4, seed=2), MixtureDemonstrator(MT, FT, skip_prob=0.4, p_aware=0.0, seed=2)
    assert [zero(q) for q in prompts] == [blind(q) for q in prompts] and zero.aware_steps == 0
    aware, one = QuestionAwareDemonstrator(MT, FT, seed=2), MixtureDemonstrator(MT, FT, skip_prob=0.4, p_aware=1.0, seed=2)
    assert [one(q) for q in prompts] == [aware(q) for q in prompts] and one.aware_steps == one.memory_steps == 150
    with pytest.raises(ValueError, match="p_aware"):
        MixtureDemonstrator(MT, FT, p_aware=1.5)


def test_rule_restates_the_questions_key():
    rule = RecentFactsDemonstrator(MT, FT, skip_prob=0.0, restate_key=True)
    # the memory opens with the question's key, the kept fact is still the newest (question-blind)
    assert rule("Q: what is Kalo\nM: - Kalo : Kalo is red\nS: Miran is blue the") == "- Kalo : Miran is blue"
    assert rule("Q: what is Kalo\nM: No previous memory\nS: the of and") == "No previous memory"
    # the restated key is not read as a fact, so the final answer is unchanged
    assert find_facts("- Kalo : Miran is blue") == [("Miran", "blue")]
    assert rule("Q: what is Kalo\nM: - Kalo : Kalo is red\nA:") == "\\boxed{ red}"
    bare = RecentFactsDemonstrator(MT, FT, skip_prob=0.0, restate_key=True, restate_sep="")
    assert bare("Q: what is Kalo\nM: No previous memory\nS: Miran is blue the") == "- Kalo Miran is blue"
    oracle = QuestionAwareDemonstrator(MT, FT, restate_key=True)
    assert oracle("Q: what is Kalo\nM: - Kalo : Kalo is red\nS: Miran is blue the") == "- Kalo : Kalo is red"
    with pytest.raises(ValueError, match="restate_key needs a fact separator"):
        RecentFactsDemonstrator(MT, FT, restate_key=True, fact_sep=None)


def test_facts_without_separator():
    cfg = SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start", fact_sep=None)
    t = make_task(cfg, seed=0, index=0)
    words = t.context.split()
    assert len(words) == 24 and all(words[8 * c] in KEYS for c in range(3))
    facts = find_facts(t.context, None)
    key, _ = question_key(t.question)
    assert [(k, v) for k, v in facts if k == key] == [(key, t.answers[0])] and len(facts) == 3
    assert find_facts("No previous memory", None) == []
    rule = QuestionAwareDemonstrator(MT, FT, fact_sep=None)
    k0, k1 = KEYS[0], KEYS[1]
    assert rule(f"Q: what is {k0}\nM: - {k0} red\nS: {k1} blue the") == f"- {k0} red"
    assert rule(f"Q: what is {k0}\nM: No previous memory\nS: {k1} blue the") == f"- {k1} blue"
    assert rule(f"Q: what is {k0}\nM: - {k0} red\nA:") == "\\boxed{ red}"


def test_mixed_lengths():
    cfg = SyntheticConfig(num_chunks=6, min_chunks=2, chunk_words=8, fact_position="start")
    tasks = make_tasks(cfg, 60, seed=0)
    lengths = [len(t.context.split()) // 8 for t in tasks]
    assert set(lengths) == {2, 3, 4, 5, 6}
    assert all(t.meta["num_chunks"] == n for t, n in zip(tasks, lengths, strict=True))
    assert [t.context for t in make_tasks(cfg, 60, seed=0)] == [t.context for t in tasks]
    # min_chunks=0 keeps the fixed-length stream exactly as before
    fixed = SyntheticConfig(num_chunks=6, chunk_words=8, fact_position="start")
    assert make_task(fixed, 0, 3).task_id == "syn-s0-c6-3"
    with pytest.raises(ValueError, match="min_chunks"):
        SyntheticConfig(num_chunks=2, min_chunks=3)


def test_cloze_questions():
    cfg = SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start", question_style="cloze",
                          bridge_fraction=0.5)
    plain = SyntheticConfig(num_chunks=3, chunk_words=8, fact_position="start", bridge_fraction=0.5)
    for i in range(6):
        t, p = make_task(cfg, seed=3, index=i), make_task(plain, seed=3, index=i)
        key, hops = question_key(t.question)
        # the same task as the "what" style, only the question's wording differs
        assert (t.context, t.answers, (key, hops)) == (p.context, p.answers, question_key(p.question))
        assert t.question == (f"{key} is ? is ?" if hops == 2 else f"{key} is ?")
    assert question_key("Kalo ?") == ("Kalo", 1) and question_key("Kalo is ? is ?") == ("Kalo", 2)
    rule = QuestionAwareDemonstrator(MT, FT)
    assert rule("Q: Kalo is ?\nM: - Miran is blue\nS: Kalo is red the") == "- Kalo is red"
    with pytest.raises(ValueError, match="question_style"):
        SyntheticConfig(question_style="how")
    with pytest.raises(ValueError, match="not a synthetic question"):
        question_key("Kalo is red")


def test_answer_span_puts_the_fact_early_and_leaves_the_default_stream_alone():
    base = SyntheticConfig(num_chunks=8, min_chunks=2, chunk_words=8, fact_position="start")
    early = SyntheticConfig(num_chunks=8, min_chunks=2, chunk_words=8, fact_position="start", answer_span=0.5)
    default = make_tasks(base, 200, seed=5)
    tasks = make_tasks(early, 200, seed=5)
    spans = set()
    for d, t in zip(default, tasks, strict=True):
        n = t.meta["num_chunks"]
        assert n == d.meta["num_chunks"] and t.question == d.question and t.answers == d.answers
        (chunk,) = t.meta["fact_chunks"].values()
        assert chunk < -(-n // 2)  # ceil(n / 2): e.g. 5 chunks -> the fact is in chunk 0, 1 or 2
        spans.add((n, chunk))
        key, _ = question_key(t.question)
        facts = find_facts(t.context)
        assert len(facts) == n and [v for k, v in facts if k == key] == t.answers  # still answerable once
        assert sorted(facts) == sorted(find_facts(d.context))  # the same facts, one swap apart
    assert {c for n, c in spans if n == 8} == {0, 1, 2, 3}  # the whole span is used
    # the uniform default: the fact lands in the second half too, and answer_span=1 is the same stream
    assert any(next(iter(d.meta["fact_chunks"].values())) >= -(-d.meta["num_chunks"] // 2) for d in default)
    same = SyntheticConfig(num_chunks=8, min_chunks=2, chunk_words=8, fact_position="start", answer_span=1.0)
    assert [t.context for t in make_tasks(same, 200, seed=5)] == [d.context for d in default]
    with pytest.raises(ValueError, match="answer_span"):
        SyntheticConfig(answer_span=0.0)


def test_tasks_by_length_are_full_length_documents_with_the_fact_anywhere():
    from memrl.data.synthetic import at_length, tasks_by_length

    train = SyntheticConfig(num_chunks=4, min_chunks=2, chunk_words=8, answer_span=0.5)
    assert at_length(train, 8) == SyntheticConfig(num_chunks=8, min_chunks=0, chunk_words=8, answer_span=1.0)
    got = tasks_by_length(train, [4, 8], 3, seed=7)
    assert list(got) == [4, 8]
    for n, tasks in got.items():
        assert tasks == make_tasks(at_length(train, n), 3, seed=7)
        assert [t.meta["num_chunks"] for t in tasks] == [n] * 3
