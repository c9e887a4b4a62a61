"""MemAct's published data layout and answer format.

The rows below imitate the published DCPO/data/*.parquet files' schema (field names, nesting and value
shapes as read from wiki_train_multi_object_2_3, wiki_val_multi_object_2_3 and wiki_val_512), with our
own made-up text: `prompt` [system, user], `reward_model.ground_truth` = a JSON object keyed Q1..Qk written
with json.dumps defaults (non-ASCII escaped) or, for single questions, plain text; `extra_info` =
{ground_truth, need_tools_kwargs, question, tools_kwargs}; no sub-question list. The question text
enumerates the sub-questions as "Q<n>: ..." lines separated by blank lines.

Scoring expectations come from MemAct's verl/utils/reward_score/mem_agent.py: extract_solution_str takes
the text after the LAST "FINAL_ANSWER: " (with the space), removes "<|im_end|>", strips; no such marker
gives "" and compute_score returns 0.0 without asking the judge.
"""

from __future__ import annotations

import asyncio
import json
import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from doubles import CharTokenizer, KeywordRetriever, ScriptedEngine

from memrl.data.io import DataError, ReadStats, detect_kind, load_tasks
from memrl.data.multiobjective import (
    build_multiobjective,
    load_multiobjective,
    split_sub_questions,
    write_multiobjective,
)
from memrl.rewards.multiq import published_answer_text, score
from memrl.tools.calls import tools_fallback_text
from memrl.tools.search import PRUNE_SCHEMA, SEARCH_SCHEMA, register_retriever
from memrl.types import Task
from memrl.workflows.memact import MemActConfig, default_prompt, run

SYSTEM = "You are a search agent.\n\n# Most important:\nKeep your context small with prune_context."
USER = "<developer_message>\nPrune often.\n</developer_message>\n\n<user_query>\n{q}\n</user_query>\n"
Q2 = ("\nThere are 2 questions:\n\nQ1: Which river flows through Lyon?\n\nQ2: In what year did the Eiffel Tower "
      "open?\n\nAnswer as FINAL_ANSWER: then a JSON object with keys Q1, Q2.\n\n")
Q3 = ("\nThere are 3 questions:\n\nQ1: Capital of Peru?\n\nQ2: Year of the first Moon landing?\n\nQ3: Who wrote "
      "the first program?\n\nAnswer as FINAL_ANSWER: then a JSON object.\n\n")
Q_SINGLE = "Which city hosts the Nobel Peace Prize ceremony?"
Q_NUMBER = "In what year was the cricketer born?"
ROWS_GT = [(Q2, '{"Q1": "Rh\\u00f4ne", "Q2": "1889"}'), (Q3, '{"Q1": "Lima", "Q2": "1969", "Q3": "Ada Lovelace"}'),
           (Q_SINGLE, "Oslo"), (Q_NUMBER, "1875")]

SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
    ("ability", pa.string()),
    ("agent_name", pa.string()),
    ("reward_model", pa.struct([("ground_truth", pa.string())])),
    ("extra_info", pa.struct([
        ("ground_truth", pa.string()), ("need_tools_kwargs", pa.bool_()), ("question", pa.string()),
        ("tools_kwargs", pa.struct([("search", pa.struct([("create_kwargs", pa.struct([
            ("ground_truth", pa.string())]))]))])),
    ])),
])


def published_row(question: str, gt: str) -> dict:
    return {"data_source": "memagent",
            "prompt": [{"content": SYSTEM, "role": "system"}, {"content": USER.format(q=question), "role": "user"}],
            "ability": "", "agent_name": "mem_agent", "reward_model": {"ground_truth": gt},
            "extra_info": {"ground_truth": gt, "need_tools_kwargs": True, "question": question,
                           "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ""}}}}}


def write_published(path) -> list[dict]:
    rows = [published_row(q, gt) for q, gt in ROWS_GT]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), str(path))
    return rows


def test_published_parquet_loads_every_row(tmp_path):
    p = tmp_path / "published.parquet"
    write_published(p)
    assert detect_kind(p) == "multiobjective"
    st = ReadStats(str(p))
    tasks = load_tasks(p, stats=st)  # strict: a rejected row would raise
    assert (st.rows, st.skipped, len(tasks)) == (4, 0, 4)
    t2, t3, single, number = tasks
    assert [t.task_id for t in tasks] == ["memagent-0", "memagent-1", "memagent-2", "memagent-3"]
    assert t2.answers == ["Rh\u00f4ne", "1889"] and t2.meta["answer_keys"] == ["Q1", "Q2"]
    assert t2.meta["sub_questions"] == ["Which river flows through Lyon?", "In what year did the Eiffel Tower open?"]
    assert t2.meta["sub_answers"] == [["Rh\u00f4ne"], ["1889"]]
    assert t2.question == Q2 and t2.meta["ground_truth"] == '{"Q1": "Rh\\u00f4ne", "Q2": "1889"}'
    assert t2.meta["prompt"] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(q=Q2)}]
    assert t3.answers == ["Lima", "1969", "Ada Lovelace"]
    assert t3.meta["sub_questions"] == ["Capital of Peru?", "Year of the first Moon landing?",
                                        "Who wrote the first program?"]
    # plain-text ground truths: one question, the text as its answer ("1875" is not read as a JSON number)
    assert single.answers == ["Oslo"] and single.meta["sub_questions"] == [Q_SINGLE] and "answer_keys" not in single.meta
    assert number.answers == ["1875"] and number.meta["sub_answers"] == [["1875"]]


def test_published_rows_round_trip_exactly(tmp_path):
    p = tmp_path / "published.parquet"
    rows = write_published(p)
    for out in (tmp_path / "again.parquet", tmp_path / "again.jsonl"):
        assert write_multiobjective(out, load_multiobjective(p)) == 4
        back = pq.read_table(out).to_pylist() if out.suffix == ".parquet" else [
            json.loads(line) for line in out.read_text().splitlines()]
        assert back == rows


def test_memrl_tasks_write_the_published_layout_and_read_back(tmp_path):
    pool = [Task(f"s{i}", f"question {i}?", "", [f"answer {i}", f"alias {i}"], meta={"dataset": "toy"})
            for i in range(5)]
    tasks = build_multiobjective(pool, 2, seed=1, sizes=(2,))
    p = tmp_path / "mo.parquet"
    write_multiobjective(p, tasks, prompt=default_prompt)
    row = pq.read_table(p).to_pylist()[0]
    t = tasks[0]
    gt = json.dumps({"Q1": t.answers[0], "Q2": t.answers[1]})
    assert row["reward_model"] == {"ground_truth": gt} and row["extra_info"]["ground_truth"] == gt
    assert row["agent_name"] == "mem_agent" and row["extra_info"]["question"] == t.question
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert t.question in row["prompt"][1]["content"]
    assert "sub_questions" not in row["extra_info"]  # "1. ..." lines say them already
    assert row["extra_info"]["sub_answers"] == t.meta["sub_answers"]  # the aliases: not in the ground truth
    back = load_tasks(p)
    for a, b in zip(back, tasks, strict=True):
        assert (a.task_id, a.question, a.answers) == (b.task_id, b.question, b.answers)
        assert {k: a.meta[k] for k in ("sub_questions", "sub_answers", "source", "source_ids", "index")} == \
            {k: b.meta[k] for k in ("sub_questions", "sub_answers", "source", "source_ids", "index")}
    write_multiobjective(tmp_path / "again.parquet", back)
    assert pq.read_table(tmp_path / "again.parquet").to_pylist() == pq.read_table(p).to_pylist()


def test_split_sub_questions():
    assert split_sub_questions(Q3) == ["Capital of Peru?", "Year of the first Moon landing?",
                                       "Who wrote the first program?"]
    assert split_sub_questions("Answer the following 2 questions.\n1. a?\n2. b?") == ["a?", "b?"]
    assert split_sub_questions("Q2: out of order\nQ1: x") == [] and split_sub_questions(Q_SINGLE) == []


@pytest.mark.parametrize("gt, question, error", [
    ('{"Q1": "a", "Q3": "b"}', Q2, r"row 0: field 'reward_model.ground_truth': the ground-truth keys must number "
                                   r"the sub-questions 1..2"),
    ('{"Q1": "a", "Q2": "b", "Q3": "c"}', Q2, r"row 0: 2 sub_questions but 3 answers"),
    ('{"Q1": "a", "Q2": ""}', Q2, r"the answer under 'Q2' must be non-empty text"),
    ("  ", Q_SINGLE, r"the ground truth is empty"),
])
def test_bad_ground_truths_are_named(tmp_path, gt, question, error):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(published_row(question, gt)) + "\n")
    with pytest.raises(DataError, match=error):
        load_multiobjective(p)


# ---------------------------------------------------------------------------------------------- scoring

TWO = Task("two", Q2, "", ["Rh\u00f4ne", "1889"], meta={"sub_questions": ["a", "b"],
                                                       "sub_answers": [["Rh\u00f4ne"], ["1889"]]})
THREE = Task("three", Q3, "", ["Lima", "1969", "Ada Lovelace"],
             meta={"sub_questions": ["a", "b", "c"], "sub_answers": [["Lima"], ["1969"], ["Ada Lovelace"]]})
OK = '{"Q1": "Rh\u00f4ne", "Q2": "1889"}'


@pytest.mark.parametrize("text, want", [
    (f"Summary: both found.\n\nFINAL_ANSWER: \n{OK}<|im_end|>", OK),      # after the marker, im_end cut, stripped
    ('FINAL_ANSWER: {"Q1": "x"}\nFINAL_ANSWER: ' + OK, OK),               # the last marker
    (f"FINAL_ANSWER:{OK}", ""),                                           # no space: not the marker
    (f"FINAL_ANSWER:\n{OK}", ""),
    (OK, ""),                                                             # no marker
])
def test_published_answer_text(text, want):
    assert published_answer_text(text) == want


# (text, task, require_final_answer) -> (reward, per-question EM, answer_parse_fallback, answer_unparsed,
# no_final_marker). Each by hand: the published reading (require=True) scores only the text after the last
# "FINAL_ANSWER: "; memrl's (False) reads after the last "FINAL_ANSWER:", or the whole reply.
@pytest.mark.parametrize("text, task, require, want", [
    # missing marker: published 0 (nothing answered); memrl parses the whole reply, both right
    (OK, TWO, True, (0.0, [0, 0], 0, 0, 1)),
    (OK, TWO, False, (1.0, [1, 1], 0, 0, 1)),
    # marker without the space: published finds no marker; memrl reads it
    (f"FINAL_ANSWER:{OK}", TWO, True, (0.0, [0, 0], 0, 0, 1)),
    (f"FINAL_ANSWER:{OK}", TWO, False, (1.0, [1, 1], 0, 0, 0)),
    # malformed JSON (unclosed): no JSON value can be read -> nothing answered, in both readings
    ('FINAL_ANSWER: {"Q1": "Rh\u00f4ne", "Q2": 1889', TWO, True, (0.0, [0, 0], 0, 1, 0)),
    ('FINAL_ANSWER: {"Q1": "Rh\u00f4ne", "Q2": 1889', TWO, False, (0.0, [0, 0], 0, 1, 0)),
    # partial keys: Q3 answers question 3 (not 2); Q2 missing -> [1, 0, 1], not all right
    ('FINAL_ANSWER: {"Q1": "Lima", "Q3": "Ada Lovelace"}', THREE, True, (0.0, [1, 0, 1], 0, 0, 0)),
    # keys out of order are placed by number
    ('FINAL_ANSWER: {"Q3": "Ada Lovelace", "Q1": "lima", "Q2": "1969"}', THREE, True, (1.0, [1, 1, 1], 0, 0, 0)),
    # extra text around the JSON: cut away (counted as a fallback); "the Rhone" normalizes to the gold
    ('Summary: found.\n\nFINAL_ANSWER: {"Q1": "the Rh\u00f4ne", "Q2": "1889"} I am sure.', TWO, True,
     (1.0, [1, 1], 1, 0, 0)),
    # "<|im_end|>" after the JSON: the published reading removes it (clean JSON); memrl's cuts it as extra text
    (f"FINAL_ANSWER: {OK}<|im_end|>", TWO, True, (1.0, [1, 1], 0, 0, 0)),
    (f"FINAL_ANSWER: {OK}<|im_end|>", TWO, False, (1.0, [1, 1], 1, 0, 0)),
    # a plain-text single question
    ("Summary: Oslo.\n\nFINAL_ANSWER: Oslo", Task("s", Q_SINGLE, "", ["Oslo"]), True, (1.0, [1], 0, 0, 0)),
    ("Oslo", Task("s", Q_SINGLE, "", ["Oslo"]), True, (0.0, [0], 0, 0, 1)),
])
def test_scoring_final_answer_and_q_keyed_json(text, task, require, want):
    s = score(text, task, require_final_answer=require)
    m = s["metrics"]
    assert (s["reward"], s["em"], m["answer_parse_fallback"], m["answer_unparsed"], m["no_final_marker"]) == want


# ---------------------------------------------------------------------------------------------- the workflow

TOK = CharTokenizer()
ROW_TASK = Task("r", Q_SINGLE, "", ["Oslo"], meta={
    "sub_questions": [Q_SINGLE], "sub_answers": [["Oslo"]],
    "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER.format(q=Q_SINGLE)}]})


def run_one(task, reply="Summary: x\n\nFINAL_ANSWER: Oslo", **kw):
    register_retriever("kw_pub", KeywordRetriever([]))
    base = dict(retriever_kind="kw_pub", no_prune_prob=0.0, temperature=0.0, max_turn_tokens=200)
    engine = ScriptedEngine([reply])
    traj = asyncio.run(run(task, engine, MemActConfig(**{**base, **kw}), random.Random(0)))
    return traj, engine


def test_first_prompt_from_the_rows_messages():
    # CharTokenizer's template ignores tools=: the tools block goes after the row's system message
    tools = tools_fallback_text([SEARCH_SCHEMA, PRUNE_SCHEMA])
    want = TOK.encode(f"<system>{SYSTEM}{tools}</system><user>{USER.format(q=Q_SINGLE)}</user><assistant>")
    for source in ("auto", "row"):
        _, engine = run_one(ROW_TASK, prompt_source=source)
        assert engine.calls[0].prompt_ids == want
    # template: memrl's templates around task.question; the row's messages are not used
    _, engine = run_one(ROW_TASK, prompt_source="template", system_template="S",
                        user_template="{question}|{answer_format}", answer_instruction="F")
    assert engine.calls[0].prompt_ids == TOK.encode(f"<system>S{tools}</system><user>{Q_SINGLE}|F</user><assistant>")
    # auto without messages: the templates
    plain = Task("p", "Q", "", ["Oslo"])
    _, engine = run_one(plain, system_template="S", user_template="{question}|{answer_format}", answer_instruction="F")
    assert engine.calls[0].prompt_ids == TOK.encode(f"<system>S{tools}</system><user>Q|F</user><assistant>")
    with pytest.raises(ValueError, match="workflow.prompt_source=row: task 'p' has no prompt messages"):
        run_one(plain, prompt_source="row")
    # through the rollout runner (memrl train / eval) it stays a one-line data error, not a RolloutError
    from memrl.runtime import rollout_once
    from memrl.workflows import get_workflow

    with pytest.raises(DataError, match="^workflow.prompt_source=row: task 'p' has no prompt messages"):
        rollout_once([plain], get_workflow("memact"), ScriptedEngine(["x"]),
                     MemActConfig(prompt_source="row", retriever_kind="kw_pub"), n=1)
    with pytest.raises(ValueError, match="prompt_source must be auto, row or template"):
        MemActConfig(prompt_source="rows")


def test_row_prompt_without_the_prune_tool_drops_the_pruning_instructions():
    # the published loop: system up to "# Most important:", user after "</developer_message>\n\n", search only
    _, engine = run_one(ROW_TASK, prune_tool=False)
    tools = tools_fallback_text([SEARCH_SCHEMA])
    user = f"<user_query>\n{Q_SINGLE}\n</user_query>\n"
    assert engine.calls[0].prompt_ids == TOK.encode(
        f"<system>You are a search agent.\n\n{tools}</system><user>{user}</user><assistant>")


def test_require_final_answer_through_the_workflow():
    from memrl.rewards.multiq import outcome_reward as reward

    traj, _ = run_one(ROW_TASK, reply="It is Oslo.", require_final_answer=True)
    assert reward(ROW_TASK, traj) == 0.0 and traj.final_answer == "" and traj.metrics["no_final_marker"] == 1.0
    traj, _ = run_one(ROW_TASK, reply="It is Oslo.")  # memrl: the whole reply, its first line
    assert reward(ROW_TASK, traj) == 0.0  # "It is Oslo." is not an exact match
    traj, _ = run_one(ROW_TASK, reply="Oslo")
    assert reward(ROW_TASK, traj) == 1.0 and traj.metrics["no_final_marker"] == 1.0
    traj, _ = run_one(ROW_TASK, reply="Summary: found.\n\nFINAL_ANSWER: Oslo", require_final_answer=True)
    assert reward(ROW_TASK, traj) == 1.0 and traj.final_answer == "Oslo"


def test_no_marker_skips_the_judge():
    # nothing listens on port 9: a judge call would fail and count judge_error = 1
    from memrl.rewards.judge import JudgeSettings
    from memrl.workflows import get_workflow
    from memrl.workflows.rollouts import apply_score, score_trajectory

    traj, _ = run_one(ROW_TASK, reply="Oslo", require_final_answer=True,
                      judge=JudgeSettings(url="http://127.0.0.1:9/v1", model="j", timeout_s=1.0))
    apply_score(traj, asyncio.run(score_trajectory(get_workflow("memact"), ROW_TASK, traj)))  # the score stage
    assert traj.info["judge"]["score"] == 0.0 and traj.info["judge"]["error"] is None
    assert traj.metrics["judge_error"] == 0.0
    assert traj.reward == 0.0


def test_tool_schemas_file_in_the_published_config_shape(tmp_path):
    # the shape of the published DCPO/config/mem_search_tool_config_single.yaml, our own descriptions
    cfg = tmp_path / "tools.yaml"
    cfg.write_text(
        "tools:\n"
        "  - class_name: some.SearchTool\n    config: {type: native}\n    tool_schema:\n"
        "      type: function\n      function:\n        name: search\n        description: Look it up.\n"
        "        parameters: {type: object, properties: {query: {type: string}}, required: [query]}\n"
        "  - class_name: some.PruneTool\n    config: {type: native}\n    tool_schema:\n"
        "      type: function\n      function:\n        name: prune_context\n        description: Forget.\n"
        "        parameters: {type: object, properties: {memory: {type: string}}, required: [memory]}\n")
    search = {"type": "function", "function": {"name": "search", "description": "Look it up.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}
    prune = {"type": "function", "function": {"name": "prune_context", "description": "Forget.", "parameters": {
        "type": "object", "properties": {"memory": {"type": "string"}}, "required": ["memory"]}}}
    _, engine = run_one(ROW_TASK, tool_schemas_file=str(cfg))
    user = USER.format(q=Q_SINGLE)
    assert engine.calls[0].prompt_ids == TOK.encode(
        f"<system>{SYSTEM}{tools_fallback_text([search, prune])}</system><user>{user}</user><assistant>")
    _, engine = run_one(ROW_TASK, tool_schemas_file=str(cfg), prune_tool=False)
    assert tools_fallback_text([search]) in engine.calls[0].prompt_text and "Forget." not in engine.calls[0].prompt_text
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([search]))
    with pytest.raises(ValueError, match=r"tool_schemas_file .*bad.json: no schema for prune_context"):
        MemActConfig(tool_schemas_file=str(bad))
