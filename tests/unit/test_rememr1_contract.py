"""Contract tests: the ReMemR1 workflow against a scripted engine with a character tokenizer.

One token per character, so chunk boundaries and prompts are written out by hand.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.runtime import rollout_once
from memrl.types import Task
from memrl.workflows import get_workflow
from memrl.workflows.rememr1 import ReMemR1Config, parse_step, run, step_rewards
from memrl.workflows.templates import TemplateError

MEM_TPL = "P:{problem}|R:{recalled_memory}|M:{memory}|C:{chunk}"
FIN_TPL = "P:{problem}|R:{recalled_memory}|M:{memory}|answer:"
NO_RECALL = "No memory was recalled."


def cfg(**kw) -> ReMemR1Config:
    base = dict(chunk_tokens=4, max_memory_tokens=200, max_final_tokens=50, temperature=0.0,
                memory_template=MEM_TPL, final_template=FIN_TPL, scorer="word_overlap")
    base.update(kw)
    return ReMemR1Config(**base)


def user(text: str) -> str:
    return f"<user>{text}</user><assistant>"


def run_one(task: Task, engine: ScriptedEngine, c: ReMemR1Config):
    return asyncio.run(run(task, engine, c, random.Random(0)))


def test_exact_prompts_recalled_memory_goes_into_the_next_prompt():
    # context "abcdefghij" -> chunks "abcd", "efgh", "ij": 3 memory steps + final
    task = Task("t1", "Q?", "abcdefghij", ["red"])
    engine = ScriptedEngine([
        "<thinking>t0</thinking><update>red apple</update><recall>apple</recall>",  # no past memory yet
        "<thinking>t1</thinking><update>green pear</update><recall>apple</recall>",  # hits step 0
        "<update>blue plum</update>",  # no recall
        r"so \boxed{red}",
    ])
    traj = run_one(task, engine, cfg())
    assert [c.prompt_text for c in engine.calls] == [
        user(f"P:Q?|R:{NO_RECALL}|M:No previous memory|C:abcd"),
        user(f"P:Q?|R:{NO_RECALL}|M:red apple|C:efgh"),
        user("P:Q?|R:red apple|M:green pear|C:ij"),  # step 1's recall, shown at step 2
        user(f"P:Q?|R:{NO_RECALL}|M:blue plum|answer:"),
    ]
    mem = traj.segments[:3]
    assert [s.info["memory"] for s in mem] == ["red apple", "green pear", "blue plum"]
    assert [s.info["previous_memory"] for s in mem] == ["No previous memory", "red apple", "green pear"]
    assert [s.info["recall_query"] for s in mem] == ["apple", "apple", None]
    assert [s.info["recalled_memory"] for s in mem] == [None, "red apple", None]
    assert [s.info["recalled_step"] for s in mem] == [None, 0, None]
    assert [s.info["recall_hit"] for s in mem] == [False, True, False]
    assert [s.info["callback_hit"] for s in mem] == [False, True, False]  # "red apple" holds gold "red"
    assert [s.info["shown_recalled_memory"] for s in mem] == [NO_RECALL, NO_RECALL, "red apple"]
    assert all(s.info["format_ok"] for s in mem)
    final = traj.segments[-1]
    assert final.info["kind"] == "final" and final.step == 3
    assert final.info["prediction"] == "red" and traj.final_answer == "red"
    # token in, token out
    tok = CharTokenizer()
    assert traj.segments[1].response_ids == tok.encode(engine.calls[1].reply) + [tok.eos_token_id]
    assert traj.segments[1].prompt_ids == tok.encode(engine.calls[1].prompt_text)
    m = traj.metrics
    assert m["recalls"] == 2.0 and m["recall_rate"] == pytest.approx(2 / 3)
    assert m["recall_retrieved"] == 1.0 and m["callback_hits"] == 1.0 and m["callback_hit_rate"] == 0.5
    assert m["format_errors"] == 0.0 and m["num_chunks"] == 3.0
    assert [c.sampling.max_tokens for c in engine.calls] == [200, 200, 200, 50]


def test_recall_disabled_retrieves_nothing_but_counts_the_queries():
    # The same replies as above with workflow.recall=false: same prompts except the recalled block.
    task = Task("t1", "Q?", "abcdefghij", ["red"])
    replies = [
        "<thinking>t0</thinking><update>red apple</update><recall>apple</recall>",
        "<thinking>t1</thinking><update>green pear</update><recall>apple</recall>",  # would hit step 0
        "<update>blue plum</update>",
        r"so \boxed{red}",
    ]
    engine = ScriptedEngine(list(replies))
    traj = run_one(task, engine, cfg(recall=False))
    assert [c.prompt_text for c in engine.calls] == [
        user(f"P:Q?|R:{NO_RECALL}|M:No previous memory|C:abcd"),
        user(f"P:Q?|R:{NO_RECALL}|M:red apple|C:efgh"),
        user(f"P:Q?|R:{NO_RECALL}|M:green pear|C:ij"),  # recall on: "R:red apple"
        user(f"P:Q?|R:{NO_RECALL}|M:blue plum|answer:"),
    ]
    mem = traj.segments[:3]
    assert [s.info["recall_query"] for s in mem] == ["apple", "apple", None]
    assert [s.info["recalled_memory"] for s in mem] == [None, None, None]
    assert [s.info["callback_hit"] for s in mem] == [False, False, False]
    m = traj.metrics
    assert m["recalls"] == 2.0 and m["recalls_blocked"] == 2.0 and m["recall_rate"] == pytest.approx(2 / 3)
    assert m["recall_retrieved"] == 0.0 and m["callback_hits"] == 0.0 and m["callback_hit_rate"] == 0.0
    # format 1 + memory gain: 1 + (1 - 0), 1 + (0 - 1), 1 + 0; no callback term without a retrieval
    assert step_rewards(task, traj)[:3] == [2.0, 0.0, 1.0]
    on = run_one(task, ScriptedEngine(list(replies)), cfg())
    assert on.metrics["recalls_blocked"] == 0.0 and on.metrics["recall_retrieved"] == 1.0
    with pytest.raises(ValueError, match="recall"):
        ReMemR1Config(recall="no")  # type: ignore[arg-type]


def test_last_steps_recall_is_shown_in_the_final_prompt():
    task = Task("t1", "Q?", "abcdefgh", ["x"])
    engine = ScriptedEngine(["<update>cat</update>", "<update>dog</update><recall>cat</recall>", r"\boxed{x}"])
    run_one(task, engine, cfg())
    assert engine.calls[2].prompt_text == user("P:Q?|R:cat|M:dog|answer:")


def test_retrieval_never_sees_the_current_or_future_memories():
    # Each step asks for words that appear only in its own new memory or in later ones.
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # 3 chunks
    engine = ScriptedEngine([
        "<update>alpha</update><recall>alpha beta gamma</recall>",  # history empty
        "<update>beta</update><recall>beta gamma</recall>",  # history {alpha}: no overlap
        "<update>gamma</update><recall>gamma alpha</recall>",  # history {alpha, beta}: only alpha can hit
        r"\boxed{x}",
    ])
    for scorer in ("tfidf", "word_overlap", "bm25"):
        engine.calls.clear()
        traj = run_one(task, engine, cfg(scorer=scorer))
        got = [(s.info["recalled_memory"], s.info["recalled_step"]) for s in traj.segments[:3]]
        assert got == [(None, None), (None, None), ("alpha", 0)], scorer


def test_garbage_outputs_follow_the_documented_rules_and_are_counted():
    task = Task("t1", "Q?", "a" * 24, ["x"])  # 6 chunks
    engine = ScriptedEngine([
        "I forgot the tags",  # missing_update: keep "No previous memory"
        "<update>first</update> and <update>second</update>",  # multiple_updates: first
        "<update>   </update>",  # empty_update: keep "first"
        "<thinking>hm</thinking><update>open to the end <recall>q</recall> tail",  # unclosed_update
        "<update>m5</update><recall>unclosed",  # unclosed_recall: no query
        "<update>m6</update><recall>first</recall><recall>m5</recall><recall></recall>",  # multiple_recalls
        r"\boxed{x}",
    ])
    traj = run_one(task, engine, cfg())
    mem = traj.segments[:6]
    assert [s.info["memory"] for s in mem] == [
        "No previous memory", "first", "first", "open to the end  tail", "m5", "m6"]
    assert [s.info["format_flags"] for s in mem] == [
        ["missing_update"], ["multiple_updates"], ["empty_update"], ["unclosed_update"],
        ["unclosed_recall"], ["multiple_recalls"]]
    assert [s.info["format_ok"] for s in mem] == [False, False, False, False, True, True]
    assert mem[3].info["recall_query"] == "q"  # a recall inside an unclosed update still counts
    assert mem[5].info["recall_query"] == "first"  # the first recall wins
    assert mem[5].info["recalled_memory"] == "first"
    m = traj.metrics
    assert (m["missing_update"], m["multiple_updates"], m["empty_update"], m["unclosed_update"]) == (1, 1, 1, 1)
    assert (m["unclosed_recall"], m["multiple_recalls"], m["format_errors"]) == (1, 1, 4)


def test_multiline_memory_and_query_are_parsed():
    p = parse_step("<thinking>a\nb</thinking>\n<update>line one\nline two\n</update>\n<recall>who\nwas it</recall>")
    assert p.memory == "line one\nline two" and p.query == "who\nwas it" and p.well_formed


def test_truncated_response_keeps_the_text_after_the_open_tag():
    task = Task("t1", "Q?", "abcd", ["x"])
    engine = ScriptedEngine(["<update>0123456789", r"\boxed{x}"])
    traj = run_one(task, engine, cfg(max_memory_tokens=12))  # "<update>0123" then cut
    assert traj.segments[0].info["memory"] == "0123"
    assert traj.segments[0].info["finish_reason"] == "length"
    assert traj.segments[0].info["format_flags"] == ["unclosed_update"]


def test_renamed_tags_are_parsed_and_named_in_the_default_prompt():
    p = parse_step("<mem>m</mem><ask>q</ask>", update_tag="mem", recall_tag="ask")
    assert (p.memory, p.query) == ("m", "q")
    c = ReMemR1Config(update_tag="mem", recall_tag="ask")
    mem_tpl, _ = c.templates()
    assert "<mem>" in mem_tpl.text and "<ask>" in mem_tpl.text and "<update>" not in mem_tpl.text
    with pytest.raises(ValueError, match="tags must differ"):
        ReMemR1Config(update_tag="x", recall_tag="x")
    with pytest.raises(ValueError, match="update_tag must be a tag name"):
        ReMemR1Config(update_tag="<update>")
    with pytest.raises(ValueError, match="scorer must be one of"):
        ReMemR1Config(scorer="dense")


def test_default_templates_keep_the_published_tags_and_lengths():
    c = ReMemR1Config()
    assert (c.max_memory_tokens, c.max_final_tokens, c.chunk_tokens) == (2048, 2048, 5000)
    mem, fin = c.templates()
    text = mem.render(problem="Q", recalled_memory="R", memory="M", chunk="C")
    for tag in ("<problem>\nQ\n</problem>", "<recalled_memory>\nR\n</recalled_memory>",
                "<memory>\nM\n</memory>", "<section>\nC\n</section>", "<update>", "<recall>", "<thinking>"):
        assert tag in text
    assert "\\boxed{}" in fin.render(problem="Q", recalled_memory="R", memory="M")


def test_template_file_overrides_and_missing_placeholder_is_named(tmp_path):
    f = tmp_path / "fin.txt"
    f.write_text("FIN {problem} {memory} {recalled_memory}\n")
    task = Task("t1", "Q?", "", ["x"])
    engine = ScriptedEngine([r"\boxed{x}"])
    run_one(task, engine, cfg(final_template=None, final_template_file=str(f)))
    assert engine.calls[0].prompt_text == user(f"FIN Q? No previous memory {NO_RECALL}\n")  # the file's text exactly
    bad = tmp_path / "mem.txt"
    bad.write_text("{problem} {memory} {chunk}\n")
    with pytest.raises(TemplateError, match=r"missing placeholder\(s\) \{recalled_memory\}"):
        ReMemR1Config(memory_template_file=str(bad)).templates()


def test_rollout_reward_is_boxed_em_and_step_rewards_are_written():
    # gold "red apple"; words {red, apple}; chunks of 4 characters: "abcd", "efgh", "ijkl"
    task = Task("t1", "Q?", "abcdefghijkl", ["red apple", "crimson"])
    engine = ScriptedEngine([
        "<update>red</update>",  # format 1 + gain (1/2 - 0) = 1.5; no recall
        "<update>pear</update>",  # 1 + (0 - 1/2) = 0.5
        # recall "red" returns m_0 "red"; held = m_1 "pear" + chunk "ijkl": 0 -> with "red" 1/2:
        # 1 + (0 - 0) + 0.5 = 1.5
        "<update>pear</update><recall>red</recall>",
        r"\boxed{Red Apple}",  # final: format 1
    ])
    spec = get_workflow("rememr1")
    groups = rollout_once([task], spec, engine, cfg(), n=1)
    traj = groups[0].trajectories[0]
    assert traj.reward == 1.0
    assert traj.segments[2].info["recalled_memory"] == "red"
    assert [s.step_reward for s in traj.segments] == pytest.approx([1.5, 0.5, 1.5, 1.0])
    # other weights: w_f = 0, w_m = 2, w_c = 3 -> 2*0.5 = 1.0; 2*(-0.5) = -1.0; 3*0.5 = 1.5; final 0
    got = step_rewards(task, traj, cfg(format_weight=0.0, memory_weight=2.0, callback_weight=3.0))
    assert got == pytest.approx([1.0, -1.0, 1.5, 0.0])
    # pure: the segments keep the values the rollout's score stage wrote
    assert [s.step_reward for s in traj.segments] == pytest.approx([1.5, 0.5, 1.5, 1.0])


def test_a_recall_of_what_the_chunk_already_says_earns_nothing():
    """The callback bug: the old rule credited max(0, recall(m_t + recalled) - recall(m_t)) = 1/2 here
    (step 2 = 1.5) although the chunk being read already says "red"."""
    task = Task("t1", "Q?", "abcdefghred ", ["red apple"])  # chunks "abcd", "efgh", "red "
    engine = ScriptedEngine([
        "<update>red</update>",  # 1 + 1/2
        "<update>pear</update>",  # 1 - 1/2
        # held = m_1 "pear" + chunk "red ": 1/2; with the recalled "red" still 1/2 -> callback 0: 1 + 0 + 0
        "<update>pear</update><recall>red</recall>",
        r"\boxed{red apple}",
    ])
    traj = rollout_once([task], get_workflow("rememr1"), engine, cfg(), n=1)[0].trajectories[0]
    assert traj.segments[2].info["recalled_memory"] == "red"
    assert [s.step_reward for s in traj.segments] == pytest.approx([1.5, 0.5, 1.0, 1.0])


def test_released_callback_rule_reads_the_whole_step_prompt():
    """callback_rule=released (verl/trainer/ppo/metric_utils.py:compute_action_rewards): R(text) = mean over
    golds of the fraction of raw gold words that are case-sensitive substrings of text; callback =
    max(0, R(recalled + " " + prompt) - R(prompt)); the memory term stays memrl's."""
    task = Task("t1", "Q?", "abcdefghijkl", ["red apple", "crimson"])
    replies = ["<update>red</update>", "<update>pear</update>", "<update>pear</update><recall>red</recall>",
               r"\boxed{red apple}"]
    traj = rollout_once([task], get_workflow("rememr1"), ScriptedEngine(replies),
                               cfg(callback_rule="released"), n=1)[0].trajectories[0]
    # step 2's prompt "P:Q?|R:No memory was recalled.|M:pear|C:ijkl" holds neither "red" nor "apple" nor
    # "crimson": R = (0/2 + 0/1) / 2 = 0; with "red" prepended: (1/2 + 0) / 2 = 1/4 -> callback 0.25
    # (memrl's paper rule: max over golds, 1/2). Steps 0 and 1 recall nothing: the released code then
    # prepends "No memory was recalled.", which holds no gold word -> 0.
    assert [s.step_reward for s in traj.segments] == pytest.approx([1.5, 0.5, 1.25, 1.0])
    # a gold word in the QUESTION counts as held by the released rule: question "red?" -> R(prompt) =
    # (1/2 + 0) / 2 = 1/4 both with and without the recall -> gain 0, step 2 = 1 + 0 + 0
    task2 = Task("t2", "red?", "abcdefghijkl", ["red apple", "crimson"])
    traj2 = rollout_once([task2], get_workflow("rememr1"), ScriptedEngine(replies),
                                cfg(callback_rule="released"), n=1)[0].trajectories[0]
    assert traj2.segments[2].step_reward == pytest.approx(1.0)
    with pytest.raises(ValueError, match="callback_rule must be one of paper, released"):
        cfg(callback_rule="old")


def test_released_format_and_memory_terms_in_a_rollout():
    """format_rule=released, memory_gain_rule=released (syr-cn/ReMemR1 @ 43e69f38,
    verl/trainer/ppo/metric_utils.py compute_format_rewards / compute_action_rewards), with the released
    memory (memory_rule=strip_recall) and callback rules, against the same preset without the two new
    rules. R(x) = mean over golds of the share of raw gold words that are substrings of x."""
    task = Task("t1", "Q?", "abcdefgh", ["red apple", "crimson"])  # chunks "abcd", "efgh"
    replies = ["<update>red apple</update>", "<update>red\napple</update>", r"\boxed{red} or \boxed{apple}"]
    base = dict(memory_rule="strip_recall", callback_rule="released")
    released = rollout_once([task], get_workflow("rememr1"), ScriptedEngine(replies),
                                   cfg(**base, format_rule="released", memory_gain_rule="released"),
                                   n=1)[0].trajectories[0]
    # step 0: one one-line block -> format 1; new "red apple": (2/2 + 0/1) / 2 = 1/2; the prompt
    #   "P:Q?|R:...|M:No previous memory|C:abcd" has no <memory> tags -> prev "" -> memory 1/2; callback:
    #   nothing recalled, no gold word in the prompt or the no-recall text -> 0. Total 1.5.
    # step 1: the block spans a line -> format 0, new "" -> memory 0; callback: the prompt now shows step 0's
    #   memory "<update>red apple</update>" (strip_recall), R = 1/2 with and without the no-recall text -> 0.
    # final: greedy one-line box -> one match "red} or \boxed{apple" -> format 1.
    assert [s.step_reward for s in released.segments] == pytest.approx([1.5, 0.0, 1.0])
    paper = rollout_once([task], get_workflow("rememr1"), ScriptedEngine(replies), cfg(**base),
                                n=1)[0].trajectories[0]
    # memrl's rules on the same replies: the strip_recall memory keeps the tags, which normalization glues to
    # the words ("updatered appleupdate"): recall 0 at both steps, so memory 0; format 1 at both (across
    # lines); final: two boxes opened -> 0.
    assert [s.step_reward for s in paper.segments] == pytest.approx([1.0, 1.0, 0.0])

    # The previous memory is read from the prompt's first one-line <memory>...</memory>; step 1 answers
    # "<update>apple</update>": new R = (1/2 + 0) / 2 = 1/4.
    replies2 = ["<update>red apple</update>", "<update>apple</update>", r"\boxed{red}"]
    one_line = "P:{problem}|R:{recalled_memory}|<memory>{memory}</memory>|C:{chunk}"
    own_lines = "P:{problem}|R:{recalled_memory}|<memory>\n{memory}\n</memory>|C:{chunk}"
    got = {}
    for name, tpl in (("one_line", one_line), ("own_lines", own_lines)):
        c = cfg(**base, format_rule="released", memory_gain_rule="released", memory_template=tpl)
        traj = rollout_once([task], get_workflow("rememr1"), ScriptedEngine(replies2), c, n=1)
        got[name] = [s.step_reward for s in traj[0].trajectories[0].segments]
    # one line: step 1's prompt holds "<memory><update>red apple</update></memory>" -> prev "<update>red
    #   apple</update>", R = 1/2 -> memory 1/4 - 1/2 = -1/4; format 1 -> 0.75. Step 0's prev "No previous
    #   memory" has no gold word -> 1 + 1/2.
    # own lines (the published layout): prev "" -> memory 1/4 -> 1.25.
    assert got == {"one_line": pytest.approx([1.5, 0.75, 1.0]), "own_lines": pytest.approx([1.5, 1.25, 1.0])}
    with pytest.raises(ValueError, match="format_rule must be one of paper, released"):
        cfg(format_rule="line")


class CharPieces(CharTokenizer):
    """The character tokenizer with `tokenize` (one piece per character), for recall_scoring=released."""

    def tokenize(self, text: str) -> list[str]:
        return list(text)


def test_released_recall_scoring_recalls_an_empty_memory_on_a_tie():
    """recall_scoring=released (syr-cn/ReMemR1 @ 43e69f38: memory_revisit.py adds every parsed memory to a
    set, tf_idf_retriever.py top1_retrieve returns the argsort's last at any score)."""
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # chunks "abcd", "efgh", "ijkl"
    replies = ["m", "<recall>z</recall>", "<recall>z</recall>", r"\boxed{x}"]
    base = dict(memory_rule="strip_recall", empty_memory="empty", query_rule="greedy_line", scorer="tfidf",
                min_recall_score=-1.0)
    got = {}
    for rule in ("memrl", "released"):
        engine = ScriptedEngine(list(replies), tokenizer=CharPieces())
        run_one(task, engine, cfg(**base, recall_scoring=rule))
        got[rule] = [c.prompt_text for c in engine.calls]
    # step 0 writes "m"; steps 1 and 2 write "" (the reply minus its recall block) and ask "z", a term no
    # memory has: every score 0, recalled because min_recall_score is below 0.
    # step 1: the one candidate "m" either way -> shown at step 2.
    # step 2: memrl's candidates are "m" only (an empty memory is never one) -> "m" again; released: "m"
    # and "" (step 1's memory), tied at 0; SHA-256 order: "m" 62c66a7a... before "" e3b0c442..., the last
    # tied one wins -> "" is recalled and the final prompt shows an empty recalled block.
    common = [user(f"P:Q?|R:{NO_RECALL}|M:No previous memory|C:abcd"), user(f"P:Q?|R:{NO_RECALL}|M:m|C:efgh"),
              user("P:Q?|R:m|M:|C:ijkl")]
    assert got == {"memrl": [*common, user("P:Q?|R:m|M:|answer:")],
                   "released": [*common, user("P:Q?|R:|M:|answer:")]}
    with pytest.raises(ValueError, match="recall_scoring=released .* needs scorer=tfidf, got 'bm25'"):
        cfg(recall_scoring="released", scorer="bm25")
    with pytest.raises(ValueError, match="recall_scoring must be one of memrl, released"):
        cfg(recall_scoring="sklearn")


def test_step_reward_weights_travel_with_the_trajectory():
    task = Task("t1", "Q?", "abcd", ["red"])
    engine = ScriptedEngine(["<update>red</update>", r"\boxed{blue}"])
    spec = get_workflow("rememr1")
    groups = rollout_once([task], spec, engine, cfg(format_weight=0.5), n=1)
    # step 0: 0.5*1 + (1 - 0) = 1.5; final: 0.5*1
    assert [s.step_reward for s in groups[0].trajectories[0].segments] == pytest.approx([1.5, 0.5])
    assert groups[0].trajectories[0].reward == 0.0


def test_rememr1_advantage_runs_on_rollout_groups():
    from memrl.algorithms.advantages import compute_group_advantages

    task = Task("t1", "Q?", "abcd", ["red"])
    replies = iter(["<update>red</update>", r"\boxed{red}", "<update>x</update>", r"\boxed{no}"])
    engine = ScriptedEngine(lambda prompt, i: next(replies))
    spec = get_workflow("rememr1")
    groups = rollout_once([task], spec, engine, cfg(), n=2, concurrency=1)
    compute_group_advantages(groups, "rememr1", alpha=0.8)
    a, b = groups[0].trajectories
    # outcomes 1, 0 -> A_out = +0.5, -0.5; step 0 rewards 2.0 (fmt 1 + gain 1), 1.0 -> A_state +0.5, -0.5
    # final rewards 1, 1 -> A_state 0; A = 0.8*A_out + 0.2*A_state
    assert [s.advantage for s in a.segments] == pytest.approx([0.5, 0.4])
    assert [s.advantage for s in b.segments] == pytest.approx([-0.5, -0.4])


def test_empty_context_answers_with_no_recall():
    task = Task("t1", "Q?", "", ["x"])
    engine = ScriptedEngine([r"\boxed{x}"])
    traj = run_one(task, engine, cfg())
    assert engine.calls[0].prompt_text == user(f"P:Q?|R:{NO_RECALL}|M:No previous memory|answer:")
    assert traj.metrics["recall_rate"] == 0.0 and len(traj.segments) == 1


def test_renamed_update_tag_still_earns_the_format_reward():
    task = Task("t1", "Q?", "abcd", ["red"])
    engine = ScriptedEngine(["<mem>red</mem>", r"\boxed{red}"])
    spec = get_workflow("rememr1")
    groups = rollout_once([task], spec, engine, cfg(update_tag="mem"), n=1)
    # step 0: format 1 + gain (1 - 0) = 2.0; final: format 1
    assert [s.step_reward for s in groups[0].trajectories[0].segments] == pytest.approx([2.0, 1.0])
