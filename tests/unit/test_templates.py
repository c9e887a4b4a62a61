"""Templates in the published style (template_style, {prompt}, template_strip) and the published-setup
switches of the chunked workflows: truncation, empty_memory, ReMemR1's memory_rule.

The character tokenizer wraps a user message as "<user>...</user><assistant>", one token per character,
so every prompt below is written out by hand.
"""

from __future__ import annotations

import asyncio
import random
from importlib import resources

import pytest
from doubles import ScriptedEngine

from memrl.types import Task
from memrl.workflows.chunked import chunk_context
from memrl.workflows.memagent import MemAgentConfig
from memrl.workflows.memagent import run as run_memagent
from memrl.workflows.rememr1 import ReMemR1Config, strip_recall_memory
from memrl.workflows.rememr1 import run as run_rememr1
from memrl.workflows.templates import Template, TemplateError, load_template

MEM3 = ("problem", "memory", "chunk")


def user(text: str) -> str:
    return f"<user>{text}</user><assistant>"


# --- str_format style ------------------------------------------------------------------------------

def test_str_format_honours_escapes_and_the_prompt_alias():
    # "{{}}" is a literal "{}" under str.format; {prompt} is the question
    t = Template("Q={prompt} M={memory} C={chunk} \\boxed{{}}", MEM3, "(t)", "str_format")
    assert t.render(problem="why?", memory="m", chunk="c") == "Q=why? M=m C=c \\boxed{}"


def test_str_format_value_braces_are_never_substituted_again():
    t = Template("{problem}|{memory}|{chunk}", MEM3, "(t)", "str_format")
    assert t.render(problem="{memory}", memory="{{x}}", chunk="{chunk}") == "{memory}|{{x}}|{chunk}"


def test_memrl_style_keeps_braces_literal_and_takes_the_prompt_alias():
    # memrl style (and MemAgent's synchronous TokenTemplate): "{{}}" stays as written
    t = Template("Q={prompt} M={memory} C={chunk} \\boxed{{}}", MEM3, "(t)")
    assert t.render(problem="why?", memory="m", chunk="c") == "Q=why? M=m C=c \\boxed{{}}"


@pytest.mark.parametrize("text, message", [
    ("{prompt} {memory} {chunk} {question}", r"mem\.txt has unknown placeholder \{question\}"),
    ("{prompt} {memory} {chunk} {}", r"mem\.txt has unknown placeholder a positional placeholder \{\}"),
    ("{prompt} {memory}", r"mem\.txt is missing placeholder\(s\) \{chunk\}"),
    ("{memory} {chunk}", r"mem\.txt is missing placeholder\(s\) \{problem\} or \{prompt\}"),
    ("{prompt} {memory} {chunk} \\boxed{}", r"mem\.txt has unknown placeholder a positional placeholder"),
    ("{prompt} {memory} {chunk} }", r"mem\.txt is not a valid str\.format string: Single '\}'"),
    ("{prompt} {memory!r} {chunk}", r"mem\.txt: placeholder \{memory\} has a format spec or conversion"),
])
def test_str_format_errors_name_the_file_and_placeholder(tmp_path, text, message):
    f = tmp_path / "mem.txt"
    f.write_text(text)
    with pytest.raises(TemplateError, match=message):
        MemAgentConfig(memory_template_file=str(f), template_style="str_format").templates()


def test_memrl_style_names_the_missing_placeholder_with_its_alias(tmp_path):
    f = tmp_path / "fin.txt"
    f.write_text("{memory} only")
    with pytest.raises(TemplateError, match=r"fin\.txt is missing placeholder\(s\) \{problem\} or \{prompt\}"):
        MemAgentConfig(final_template_file=str(f)).templates()


# --- file bytes -----------------------------------------------------------------------------------

def test_template_file_text_is_kept_exactly_unless_template_strip(tmp_path):
    f = tmp_path / "fin.txt"
    f.write_bytes(b"A {prompt} \r\n{memory}  \n")  # a trailing space, a CRLF and a final newline
    kept = load_template("memagent_final", ("problem", "memory"), str(f), style="str_format", strip=False)
    assert kept.render(problem="Q", memory="M") == "A Q \r\nM  \n"
    # strip: memrl's former reading (universal newlines, one final newline dropped); inner spaces stay
    old = load_template("memagent_final", ("problem", "memory"), str(f), style="str_format", strip=True)
    assert old.render(problem="Q", memory="M") == "A Q \nM  "


@pytest.mark.parametrize("strip", [False, True])
def test_packaged_templates_render_as_before_whatever_template_strip(strip):
    # the packaged files end with one newline that is not part of the prompt, under both settings
    for name, cfg_cls, placeholders in (
        ("memagent_memory", MemAgentConfig, MEM3),
        ("rememr1_final", ReMemR1Config, ("problem", "recalled_memory", "memory")),
    ):
        body = resources.files("memrl").joinpath("templates", f"{name}.txt").read_text(encoding="utf-8")
        assert body.endswith(":\n")
        mem, fin = cfg_cls(template_strip=strip, template_style="str_format").templates()
        tpl = mem if name.endswith("memory") else fin
        assert tpl.text == body[:-1] and tpl.style == "memrl"
        assert tpl.placeholders == placeholders


def test_unreadable_or_non_utf8_template_file_is_one_line(tmp_path):
    f = tmp_path / "bin.txt"
    f.write_bytes(b"{prompt} \xff {memory}")
    with pytest.raises(TemplateError, match=r"template file .*bin\.txt is not UTF-8 text"):
        MemAgentConfig(final_template_file=str(f)).templates()


# --- config validation ----------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("template_style", "jinja"), ("truncation", "tail"), ("empty_memory", "none"),
])
def test_bad_switch_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=rf"MemAgentConfig\.{field} must be one of .*got '{value}'"):
        MemAgentConfig(**{field: value})
    with pytest.raises(ValueError, match=r"ReMemR1Config\.memory_rule must be one of update_tag, strip_recall"):
        ReMemR1Config(memory_rule="whole")


# --- truncation -----------------------------------------------------------------------------------

def test_head_and_centre_truncation_keep_different_chunks():
    # 10 chunks of 2 tokens: chunk k = [2k, 2k + 1]; cap 4 chunks (8 tokens)
    ids = list(range(20))
    centre, cut_c = chunk_context(ids, 2, 4, "centre")
    head, cut_h = chunk_context(ids, 2, 4, "head")
    # centre: first 4 tokens (chunks 0, 1) + last 4 tokens (chunks 8, 9)
    assert centre == [[0, 1], [2, 3], [16, 17], [18, 19]] and cut_c
    # head (vime's chunks[:MAX_CHUNKS]): chunks 0..3
    assert head == [[0, 1], [2, 3], [4, 5], [6, 7]] and cut_h
    # an odd cap: centre keeps ceil(6/2) = 3 head tokens + 3 tail tokens, then chunks them [0 1][2 17][18 19]
    assert chunk_context(ids, 2, 3, "centre")[0] == [[0, 1], [2, 17], [18, 19]]
    assert chunk_context(ids, 2, 3, "head")[0] == [[0, 1], [2, 3], [4, 5]]
    # under the cap nothing is cut
    assert chunk_context(ids[:5], 2, 4, "head") == ([[0, 1], [2, 3], [4]], False)


def test_head_truncation_through_the_workflow():
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # 12 tokens, chunks of 4, cap 2 -> "abcd", "efgh"
    engine = ScriptedEngine(["m1", "m2", r"\boxed{x}"])
    c = MemAgentConfig(chunk_tokens=4, max_chunks=2, truncation="head", temperature=0.0,
                       memory_template="P:{problem}|M:{memory}|C:{chunk}", final_template="P:{problem}|M:{memory}|A:")
    traj = asyncio.run(run_memagent(task, engine, c, random.Random(0)))
    assert [x.prompt_text for x in engine.calls[:2]] == [
        user("P:Q?|M:No previous memory|C:abcd"), user("P:Q?|M:m1|C:efgh")]
    assert traj.metrics["truncated"] == 1.0 and traj.metrics["tokens_read"] == 8.0


# --- empty memory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("rule, second, final", [
    # "" then "  \n" (whitespace only is empty after the trim): the memory shown next
    ("placeholder", "No previous memory", "No previous memory"),
    ("keep_previous", "m1", "m1"),
    ("empty", "", ""),
])
def test_empty_output_rule_through_the_memagent_workflow(rule, second, final):
    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # chunks "abcd", "efgh", "ijkl"
    engine = ScriptedEngine(["m1", "", "  \n", r"\boxed{x}"])
    c = MemAgentConfig(chunk_tokens=4, empty_memory=rule, temperature=0.0,
                       memory_template="P:{problem}|M:{memory}|C:{chunk}", final_template="P:{problem}|M:{memory}|A:")
    traj = asyncio.run(run_memagent(task, engine, c, random.Random(0)))
    assert [x.prompt_text for x in engine.calls] == [
        user("P:Q?|M:No previous memory|C:abcd"),
        user("P:Q?|M:m1|C:efgh"),
        user(f"P:Q?|M:{second}|C:ijkl"),
        user(f"P:Q?|M:{final}|A:"),
    ]
    assert traj.metrics["empty_memories"] == 2.0
    assert [s.info["memory"] for s in traj.segments] == ["m1", second, final, final]


# --- ReMemR1 memory rule --------------------------------------------------------------------------

def test_strip_recall_memory_on_hand_made_responses():
    # closed recall blocks go (non-greedy, across lines); thinking, update tags and other text stay
    r = "<thinking>t</thinking>\n<update>a</update>\n<recall>who\nis x</recall> tail <recall>y</recall>"
    assert strip_recall_memory(r) == "<thinking>t</thinking>\n<update>a</update>\n tail"
    assert strip_recall_memory("  <update>m</update>  ") == "<update>m</update>"  # whitespace-trimmed
    assert strip_recall_memory("m <recall>open") == "m <recall>open"  # an unclosed recall stays
    assert strip_recall_memory("<recall>q</recall>") == ""
    assert strip_recall_memory("a<ask>q</ask>b", recall_tag="ask") == "ab"


def test_memory_rule_through_the_rememr1_workflow():
    task = Task("t1", "Q?", "abcdefgh", ["x"])  # two chunks
    replies = ["<thinking>t</thinking><update>m1</update><recall>q</recall>", "<recall>only</recall>", r"\boxed{x}"]
    tpl = dict(memory_template="M:{memory}|C:{chunk}|R:{recalled_memory}|P:{problem}",
               final_template="M:{memory}|R:{recalled_memory}|P:{problem}")

    def run(**kw):
        engine = ScriptedEngine(list(replies))
        c = ReMemR1Config(chunk_tokens=4, temperature=0.0, scorer="word_overlap", **tpl, **kw)
        return asyncio.run(run_rememr1(task, engine, c, random.Random(0))), engine

    paper, _ = run()
    # update_tag: m1, then no <update> -> keep m1 (missing_update)
    assert [s.info["memory"] for s in paper.segments] == ["m1", "m1", "m1"]
    released, engine = run(memory_rule="strip_recall", empty_memory="empty")
    # strip_recall: the response minus its recall block; step 2 is only a recall -> "" (released code)
    assert [s.info["memory"] for s in released.segments] == ["<thinking>t</thinking><update>m1</update>", "", ""]
    assert engine.calls[1].prompt_text == user(
        "M:<thinking>t</thinking><update>m1</update>|C:efgh|R:No memory was recalled.|P:Q?")
    # step 2's query "only" matches nothing in m_0..m_1 -> nothing recalled; the final prompt shows ""
    assert engine.calls[2].prompt_text == user("M:|R:No memory was recalled.|P:Q?")
    assert released.metrics["missing_update"] == 1.0  # the flags still read the tags


def test_greedy_line_query_on_hand_made_responses():
    from memrl.workflows.rememr1 import greedy_line_query

    # one line, greedy: from the first <recall> to the last </recall> on the line, untrimmed
    assert greedy_line_query("<recall> a </recall> x <recall>b</recall>") == " a </recall> x <recall>b"
    assert greedy_line_query("<recall>a\nb</recall>") is None  # "." does not cross a newline
    assert greedy_line_query("x\n<recall>q</recall>\n<recall>r</recall>") == "q"  # first line that matches
    assert greedy_line_query("<recall></recall>") is None and greedy_line_query("no tags") is None


def test_query_rule_through_the_rememr1_workflow():
    task = Task("t1", "Q?", "abcdefgh", ["x"])
    replies = ["<update>red fox</update>", "<update>m2</update><recall>\nfox\n</recall>", r"\boxed{x}"]

    def run(**kw):
        engine = ScriptedEngine(list(replies))
        c = ReMemR1Config(chunk_tokens=4, temperature=0.0, scorer="word_overlap",
                          memory_template="M:{memory}|C:{chunk}|R:{recalled_memory}|P:{problem}",
                          final_template="M:{memory}|R:{recalled_memory}|P:{problem}", **kw)
        return asyncio.run(run_rememr1(task, engine, c, random.Random(0)))

    # first_block: the multi-line query "fox" finds m_0 "red fox"; greedy_line: no query at all
    first = run()
    assert first.segments[1].info["recall_query"] == "fox" and first.segments[1].info["recalled_memory"] == "red fox"
    greedy = run(query_rule="greedy_line")
    assert greedy.segments[1].info["recall_query"] is None and greedy.metrics["recalls"] == 0.0
    with pytest.raises(ValueError, match=r"ReMemR1Config\.query_rule must be one of first_block, greedy_line"):
        ReMemR1Config(query_rule="x")
