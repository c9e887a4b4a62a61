"""Parity of memrl's scoring with the published code, every expected value derived by hand from reading:

- the training verifier of MemAgent and ReMemR1, `verl/utils/reward_score/hotpotqa.py:compute_score`
  (vime's `examples/mem_agent/rollout.py:reward_func` is the same rule but lowercases only the answer,
  after finding the box), here `verl_hotpotqa`;
- MemAgent's evaluation, `taskutils/memory_eval/utils/__init__.py` (extract_solution, extract_answer) and
  `ruler_hqa.py:get_pred` (scores item["answers"][0]; ReMemR1's `run_eval.py`/`test_qa.py` do the same);
- RULER's metrics, `scripts/eval/synthetic/constants.py` and `scripts/eval/evaluate.py:postprocess_pred`.

The published verifier, in steps (V1-V5), as the comments below cite them:
 V1 window = the last 300 characters of the response, lowercased;
 V2 if the window contains "\\boxed " (with a space): answer = text after the LAST "\\boxed " up to the
    first "$" after it; this wins over any \\boxed{...};
 V3 else from the last "\\boxed" count braces until the count returns to 0; none closing -> no answer;
    a box that is not "\\boxed{" (e.g. \\fbox{}) -> 0;
 V4 strip_string on answer and lowercased gold: drop "\\n", "\\!", "\\left", "\\right", "^{\\circ}", "\\$",
    "\\%"; "\\\\" -> "\\"; tfrac/dfrac -> frac; " ." -> " 0."; "{." -> "{0."; then remove all spaces;
    equal strings score 1 (no article or punctuation rule);
 V5 max over the gold list.
memrl's `boxed_em` (B): the last closed \\boxed{} (also "\\boxed {x}") of the whole text, SQuAD
normalization (lowercase, drop punctuation and a/an/the, collapse spaces), best over golds.
"""

from __future__ import annotations

import pytest

from memrl.rewards.eval_metrics import get_metric, metric_names, string_match_all, string_match_part
from memrl.rewards.extract import extract_answer_is, extract_prediction
from memrl.rewards.verifiers import get_verifier, verifier_names

verl = get_verifier("verl_hotpotqa")
boxed_em = get_verifier("boxed_em")

PAD = "x" * 300  # 300 filler characters: pushes anything before it out of the published window


@pytest.mark.parametrize(
    "text, golds, published, memrl",
    [
        # articles COUNT there: V4 "the beatles" -> "thebeatles" != "beatles" -> 0; B drops "the" -> 1
        (r"\boxed{The Beatles}", ["Beatles"], 0.0, 1.0),
        # spaces do NOT count there: V4 "newyork" == "new york" -> "newyork" -> 1; B "newyork" != "new york"
        (r"\boxed{NewYork}", ["New York"], 1.0, 0.0),
        # punctuation counts there: "paris." != "paris" -> 0; B drops "." -> 1
        (r"\boxed{Paris.}", ["Paris"], 0.0, 1.0),
        # V4 " ." -> " 0.": "st . louis" -> "st0.louis" vs "st.louis" -> 0; B: both "st louis" -> 1
        (r"\boxed{St . Louis}", ["St. Louis"], 0.0, 1.0),
        # case: V1 lowercases both sides -> 1; B lowercases -> 1
        (r"The answer: \boxed{PARIS}", ["paris"], 1.0, 1.0),
        # V1 lowercases the window BEFORE looking for the box: "\BOXED{" becomes "\boxed{" -> 1;
        # B's box pattern is case-sensitive -> no box -> 0
        (r"\BOXED{Paris}", ["Paris"], 1.0, 0.0),
        # LaTeX: V4 dfrac -> frac on the gold: "\frac{1}{2}" == "\frac{1}{2}" -> 1;
        # B: "frac12" vs "dfrac12" -> 0
        (r"\boxed{\frac{1}{2}}", [r"\dfrac{1}{2}"], 1.0, 0.0),
        # LaTeX: V4 drops \left and \right and spaces: "(1,2)" == "(1,2)" -> 1; B: "left1 2right" vs "12" -> 0
        (r"\boxed{\left(1, 2\right)}", ["(1,2)"], 1.0, 0.0),
        # \text{} is NOT removed by V4: "\text{paris}" != "paris" -> 0; B: "textparis" != "paris" -> 0
        (r"\boxed{\text{Paris}}", ["Paris"], 0.0, 0.0),
        # V4 drops "\%": "50" == "50" -> 1; B drops "\" and "%" -> "50" -> 1
        (r"\boxed{50\%}", ["50"], 1.0, 1.0),
        # V4 drops the newline: "newyork" == "newyork" -> 1; B: "new york" == "new york" -> 1
        ("\\boxed{New\nYork}", ["New York"], 1.0, 1.0),
        # the "\boxed ans" form, V2: answer "paris" -> 1; B needs braces -> 0
        (r"so it is \boxed Paris", ["Paris"], 1.0, 0.0),
        # V2 stops at "$": "paris" -> 1; B -> 0
        (r"$\boxed Paris$ done", ["Paris"], 1.0, 0.0),
        # V2 keeps trailing punctuation: "paris." != "paris" -> 0
        (r"\boxed Paris.", ["Paris"], 0.0, 0.0),
        # "\boxed {Paris}" has "\boxed " -> V2 answer "{paris}" != "paris" -> 0; B accepts the space -> 1
        (r"\boxed {Paris}", ["Paris"], 0.0, 1.0),
        # V2 wins over a later braced box: answer "x then \boxed{paris}" -> "xthen\boxed{paris}" -> 0;
        # B takes the last box "Paris" -> 1
        (r"\boxed x then \boxed{Paris}", ["Paris"], 0.0, 1.0),
        # multiple boxes: V3 and B both read the LAST one
        (r"\boxed{London}, no: \boxed{Paris}", ["Paris"], 1.0, 1.0),
        (r"\boxed{London}, no: \boxed{Paris}", ["London"], 0.0, 0.0),
        # nested braces are kept: V3 "a{b}c" == "a{b}c" -> 1; B "a{b}c" -> "abc" both sides -> 1
        (r"\boxed{a{b}c}", ["a{b}c"], 1.0, 1.0),
        # the last box never closes: V3 no answer -> 0; B: last box unclosed -> 0
        (r"\boxed{Paris} or \boxed{Rome", ["Paris"], 0.0, 0.0),
        # \fbox: V3 falls back to "\fbox{paris}", which is not "\boxed{" -> 0; B: no \boxed -> 0
        (r"\fbox{Paris}", ["Paris"], 0.0, 0.0),
        # an empty box: "" != "paris" -> 0 (both)
        (r"\boxed{}", ["Paris"], 0.0, 0.0),
        # no box at all -> 0 (both)
        ("Paris", ["Paris"], 0.0, 0.0),
        # the answer beyond the last 300 characters: V1 window = the 300 x's -> no box -> 0; B reads it -> 1
        (r"\boxed{Paris}" + PAD, ["Paris"], 0.0, 1.0),
        # "\boxed{Paris}" is 13 characters; + 287 = 300: all in the window -> 1
        (r"\boxed{Paris}" + "x" * 287, ["Paris"], 1.0, 1.0),
        # + 290 = 303: the window starts 3 characters in, at "xed{paris}" -> no "\boxed" -> 0
        (r"\boxed{Paris}" + "x" * 290, ["Paris"], 0.0, 1.0),
        # multiple golds: V5 and B take the max: "nyc" matches the second gold -> 1
        (r"\boxed{NYC}", ["New York City", "NYC"], 1.0, 1.0),
        # articles with multiple golds: V4 "thebeatles" == "the beatles" -> "thebeatles" (2nd gold) -> 1
        (r"\boxed{the Beatles}", ["Beatles", "The Beatles"], 1.0, 1.0),
    ],
)
def test_training_verifiers(text, golds, published, memrl):
    assert verl(text, golds) == published
    assert boxed_em(text, golds) == memrl


def test_verifier_registry_names_and_errors():
    assert {"boxed_em", "verl_hotpotqa"} <= set(verifier_names())
    with pytest.raises(KeyError, match="unknown reward verifier 'nope'; registered: .*boxed_em.*verl_hotpotqa"):
        get_verifier("nope")
    with pytest.raises(ValueError, match="no gold answers"):
        verl(r"\boxed{a}", [])


@pytest.mark.parametrize(
    "text, expected",
    [
        # "*" removed, text after the last "the answer is", strip, strip(".") -> "Paris"
        ("I checked. Therefore, the answer is **Paris**.", "Paris"),
        # case-sensitive phrase: "The answer is" alone is not found -> no prediction
        ("The answer is Paris", None),
        # the LAST occurrence; "Rome..." -> strip(".") -> "Rome"
        ("the answer is Paris. Hmm, the answer is Rome...", "Rome"),
        # after the last </think> only: the thinking's "the answer is London" is ignored
        ("<think>the answer is London</think>Therefore, the answer is Paris", "Paris"),
        # nothing after </think>: the published code falls back to the whole response, so the answer
        # keeps the tag: "Lyon</think>"
        ("reasoning: the answer is Lyon</think>", "Lyon</think>"),
        # only dots after the phrase: "" (scored as no prediction)
        ("so the answer is ...", ""),
        # DeepSeek's end marker is removed
        ("the answer is Oslo<｜end▁of▁sentence｜>", "Oslo"),
        # inner punctuation and case stay (the metric normalizes them)
        ("the answer is St. Louis, Missouri.", "St. Louis, Missouri"),
    ],
)
def test_answer_is_extraction(text, expected):
    assert extract_answer_is(text) == expected
    assert extract_prediction(text, "answer_is") == (expected or "")


def test_extract_modes():
    text = "  I think \\boxed{Paris}, so the answer is Paris.  "
    assert extract_prediction(text, "boxed") == "Paris"
    assert extract_prediction(text, "answer_is") == "Paris"
    assert extract_prediction(text, "raw") == "I think \\boxed{Paris}, so the answer is Paris."
    assert extract_prediction(text, "boxed_published") == "Paris"
    # the published box reader: whole text (no 300-character window), case kept, "\boxed ans" up to "$"
    assert extract_prediction("\\boxed{Paris}" + PAD, "boxed_published") == "Paris"
    assert extract_prediction("It is \\boxed New York$.", "boxed_published") == "New York"
    # "\boxed {x}" is the space form there: "{x}" (memrl's boxed reads "x")
    assert extract_prediction("\\boxed {Oslo}", "boxed_published") == "{Oslo}"
    assert extract_prediction("\\boxed {Oslo}", "boxed") == "Oslo"
    # \fbox fails the original's assertion: no prediction
    assert extract_prediction("\\fbox{Oslo}", "boxed_published") == ""
    # vime's reader: the published box reader over the LAST 300 characters only, case kept, no </think> step
    assert extract_prediction("\\boxed{Paris}" + PAD, "boxed_last300") == ""
    assert extract_prediction("\\boxed{Paris}" + "x" * 287, "boxed_last300") == "Paris"  # 13 + 287 = 300
    assert extract_prediction("\\boxed{Paris}" + "x" * 288, "boxed_last300") == ""  # "\" falls out
    assert extract_prediction("\\BOXED{Paris}", "boxed_last300") == ""  # not lowercased (verl_hotpotqa: 1)
    assert extract_prediction("\\boxed{ Oslo } </think> none", "boxed_last300") == "Oslo"  # stripped
    assert extract_prediction("It is \\boxed New York$.", "boxed_last300") == "New York"
    with pytest.raises(ValueError, match="extract must be one of boxed, answer_is, boxed_published, boxed_last300, raw"):
        extract_prediction(text, "last_line")


@pytest.mark.parametrize(
    "pred, refs, all_, part",
    [
        # 2 of 3 references found: all = 2/3; part = 1
        ("The keys are 123 and 456.", ["123", "456", "789"], 2 / 3, 1.0),
        # case-insensitive substring: "apple" in "apple pie" -> 1
        ("APPLE pie", ["apple"], 1.0, 1.0),
        # none found -> 0, 0
        ("nothing here", ["123", "456"], 0.0, 0.0),
        # substring, not word: "12" is found inside "123"
        ("code 123", ["12"], 1.0, 1.0),
        # postprocess: the tab becomes a newline, so "12\t3" is no longer found -> 0
        ("12\t3", ["12\t3"], 0.0, 0.0),
    ],
)
def test_ruler_string_match(pred, refs, all_, part):
    assert string_match_all(pred, refs) == pytest.approx(all_)
    assert string_match_part(pred, refs) == part
    assert get_metric("string_match_all") is string_match_all
    assert {"string_match_all", "string_match_part"} <= set(metric_names())


# ------------------------------------------------------------------ eval rows and report tables


def _traj(answer_text: str, task_id: str = "q"):
    from memrl.rewards.qa import extract_boxed
    from memrl.types import Trajectory

    return Trajectory(task_id, "", [], final_answer=extract_boxed(answer_text) or "",
                      info={"answer_text": answer_text, "memories": []})


def test_golds_first_vs_any():
    from memrl.eval.runner import score_prediction
    from memrl.types import Task

    task = Task("q", "Where?", "", ["NYC", "New York City"])
    traj = _traj(r"\boxed{New York City}")
    # any: best over golds -> EM 1 against the second gold
    assert score_prediction(task, traj, "any", "boxed")[1] == {"em": 1.0, "sub_em": 1.0, "f1": 1.0}
    # first (the public evaluations): answers[0] = "NYC" only: "nyc" vs "new york city": EM 0, neither
    # contains the other, no shared token -> 0, 0
    assert score_prediction(task, traj, "first", "boxed")[1] == {"em": 0.0, "sub_em": 0.0, "f1": 0.0}


def test_answer_is_protocol_scores_the_text_after_the_phrase():
    from memrl.eval.runner import score_prediction
    from memrl.types import Task

    task = Task("q", "Where?", "", ["Paris"])
    traj = _traj("Paris is large. Therefore, the answer is Paris.")
    # boxed: no box -> empty prediction -> 0; answer_is: "Paris" -> 1
    assert score_prediction(task, traj, "any", "boxed") == ("", {"em": 0.0, "sub_em": 0.0, "f1": 0.0})
    assert score_prediction(task, traj, "first", "answer_is") == ("Paris", {"em": 1.0, "sub_em": 1.0, "f1": 1.0})
    # raw: the whole text: EM 0; sub-EM: "paris" in the normalized text -> 1; F1: 2 "paris" tokens in
    # normalize = "paris is large therefore answer is paris" (7 tokens): P = 1/7, R = 1 -> 2/8 = 0.25
    pred, m = score_prediction(task, traj, "any", "raw")
    assert pred == "Paris is large. Therefore, the answer is Paris."
    assert (m["em"], m["sub_em"]) == (0.0, 1.0) and m["f1"] == pytest.approx(0.25)


def test_task_metric_goes_into_rows_and_tables():
    from memrl.eval.report import markdown_table, summarize
    from memrl.eval.runner import result_row
    from memrl.types import Task

    refs = ["123", "456", "789"]
    rows = []
    # RULER niah-style: two questions, prediction = whole final text (extract=raw)
    for i, text in enumerate(["keys: 123, 456", "keys: 789"]):
        task = Task(f"q{i}", "keys?", "", refs, meta={"metric": "string_match_all", "num_docs": 8})
        rows.append(result_row(task, _traj(text, f"q{i}"), 8, "niah.jsonl", 0.0, 1.0, extract="raw"))
    assert [r["string_match_all"] for r in rows] == pytest.approx([2 / 3, 1 / 3])
    (s,) = summarize(rows, "run")
    # mean (2/3 + 1/3) / 2 = 1/2 -> 50 %
    assert s.string_match_all == pytest.approx(50.0) and s.string_match_part is None
    md = markdown_table([s])
    assert "| F1 | string_match_all | context tokens |" in md and "| 50.00 |" in md
    # a plain QA run keeps the old table (no metric column)
    plain = result_row(Task("p", "?", "", ["Paris"]), _traj(r"\boxed{Paris}"), 8, "qa.json", 0.0, 1.0)
    assert "string_match_all" not in plain
    assert "string_match" not in markdown_table(summarize([plain], "qa"))


def test_unknown_task_metric_is_named():
    from memrl.errors import UserError
    from memrl.eval.runner import result_row
    from memrl.types import Task

    task = Task("q7", "?", "", ["a"], meta={"metric": "rouge"})
    with pytest.raises(UserError, match="task q7: meta\\['metric'\\]: unknown eval metric 'rouge'; registered: "):
        result_row(task, _traj("a"), 1, "f.json", 0.0, 1.0)


def test_report_csv_leaves_an_absent_metric_empty(tmp_path):
    import csv

    from memrl.eval.report import summarize, write_csv
    from memrl.eval.runner import result_row
    from memrl.types import Task

    task = Task("q", "?", "", ["123", "456"], meta={"metric": "string_match_part"})
    # "456" found -> part = 1
    row = result_row(task, _traj("it is 456"), 4, "qa.jsonl", 0.0, 1.0, extract="raw")
    write_csv(tmp_path / "s.csv", summarize([row], "r"))
    (line,) = list(csv.DictReader(open(tmp_path / "s.csv")))
    assert float(line["string_match_part"]) == 100.0 and line["string_match_all"] == ""


# ------------------------------------------------------------------ configuration


def _chunked_rollout(workflow: str, final_reply: str, **kw):

    from doubles import ScriptedEngine

    from memrl.runtime import rollout_once
    from memrl.types import Task
    from memrl.workflows import get_workflow

    spec = get_workflow(workflow)
    memory = "<update>note</update>" if workflow == "rememr1" else "note"
    cfg = spec.config_cls(chunk_tokens=8, max_memory_tokens=20, max_final_tokens=20, temperature=0.0, **kw)
    task = Task("t", "Who?", "abcdefgh", ["Beatles"])  # one chunk -> one memory call, then the final call
    return rollout_once([task], spec, ScriptedEngine([memory, final_reply]), cfg, n=1)[0].trajectories[0]


@pytest.mark.parametrize("workflow", ["memagent", "rememr1"])
def test_workflow_reward_selects_the_verifier(workflow):
    # "\boxed{The Beatles}" vs "Beatles": boxed_em 1 (article dropped), verl_hotpotqa 0 (article counts)
    assert _chunked_rollout(workflow, r"\boxed{The Beatles}").reward == 1.0
    assert _chunked_rollout(workflow, r"\boxed{The Beatles}", reward="verl_hotpotqa").reward == 0.0
    # "\boxed Beatles" (the space form): 0 under boxed_em, 1 under verl_hotpotqa
    assert _chunked_rollout(workflow, r"\boxed Beatles").reward == 0.0
    assert _chunked_rollout(workflow, r"\boxed Beatles", reward="verl_hotpotqa").reward == 1.0


def test_config_values_are_checked():
    from memrl.config import ConfigError, load_config
    from memrl.eval.runner import EvalConfig
    from memrl.workflows import parse_workflow

    with pytest.raises(ConfigError, match=r"MemAgentConfig.reward must be one of box_weighted_f1, boxed_em, format_f1, published_box_f1, ruler_match, verl_hotpotqa, got 'em'"):
        parse_workflow({"name": "memagent", "reward": "em"})
    with pytest.raises(ConfigError, match=r"golds='all' is not allowed: must be one of any, first"):
        load_config(EvalConfig, ["golds=all"])
    with pytest.raises(ConfigError, match=r"extract='last' is not allowed: must be one of boxed, answer_is, boxed_published, "
                                          r"boxed_last300, raw"):
        load_config(EvalConfig, ["extract=last"])
    cfg = load_config(EvalConfig, ["golds=first", "extract=answer_is"])
    assert (cfg.golds, cfg.extract) == ("first", "answer_is")


def test_evaluate_applies_the_scoring_options_and_keeps_them_apart(tmp_path):
    from doubles import ScriptedEngine

    from memrl.data.memagent_files import write_eval_json
    from memrl.errors import UserError
    from memrl.eval.runner import EvalConfig, evaluate
    from memrl.types import Task

    path = tmp_path / "eval_2.json"
    write_eval_json(path, [Task("q0", "Where?", "Document 1:\nfiller", ["NYC", "New York City"],
                                meta={"num_docs": 2})])

    def reply(prompt: str, _: int) -> str:
        return "note" if "<section>" in prompt else "It is New York City, so the answer is New York City."

    def run(out: str, **kw):
        cfg = EvalConfig(workflow={"name": "memagent", "chunk_tokens": 64}, progress=False, **kw)
        return evaluate([str(path)], tmp_path / out, cfg, engine=ScriptedEngine(reply))

    # extract=answer_is reads "New York City": against any gold EM 1, against answers[0] "NYC" EM 0
    (row,) = run("any", extract="answer_is")
    assert (row["prediction"], row["em"]) == ("New York City", 1.0)
    (row,) = run("first", golds="first", extract="answer_is")
    assert (row["prediction"], row["em"], row["f1"]) == ("New York City", 0.0, 0.0)
    # the default (boxed): no box -> empty prediction -> 0
    (row,) = run("boxed")
    assert (row["prediction"], row["em"]) == ("", 0.0)
    # rows scored one way are never mixed with rows scored another way
    with pytest.raises(UserError, match="scoring"):
        run("first", golds="any", extract="answer_is")


def test_boxed_published_reads_after_think():
    # extract_solution first: the box inside the thinking is ignored -> "Paris"
    assert extract_prediction(r"<think>\boxed{Rome}</think> so \boxed{Paris}", "boxed_published") == "Paris"
    # nothing after </think>: the whole response -> the last box "Rome"
    assert extract_prediction(r"<think>\boxed{Rome}</think>", "boxed_published") == "Rome"
