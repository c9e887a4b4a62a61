"""Published eval / training layouts read to exact Tasks: vime / slime JSONL, MemAgent index-only eval files
(contexts rebuilt from the dev file), RULER (its own and MemAgent's layout), ReMemR1 file names.

Every row below is hand-written after the upstream writer named above it; every expected value is derived
by hand from that writer's code (the derivation is in the comments).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data import hotpotqa
from memrl.data.index_only import document_list
from memrl.data.io import DataError, ReadStats, detect_kind, load_tasks

DATA = Path(__file__).parents[2] / ".." / "shared" / "data"
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
needs_data = pytest.mark.skipif(not HOTPOT.exists(), reason=f"shared real data not found at {DATA.resolve()}")


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _load_all(path: Path, **kw) -> list:
    """Tasks with skip_bad on, asserting no row was rejected."""
    st = ReadStats(str(path))
    tasks = load_tasks(path, skip_bad=True, stats=st, **kw)
    assert (st.rows, st.skipped) == (len(tasks), 0), st.reasons
    return tasks


# --- vime / slime (examples/mem_agent/prepare_data.py: convert_row) ------------------------------------------

# from a MemAgent parquet row: prompt = the user message's content, label = ground_truth[0],
# metadata = {context, ground_truth, num_docs = extra_info.num_docs, data_source}
SLIME_TRAIN = [
    {"prompt": "Which magazine was started first?", "label": "Arthur's Magazine",
     "metadata": {"context": "Document 1:\nArthur's Magazine\nAn American monthly.", "ground_truth": ["Arthur's Magazine"],
                  "num_docs": 200, "data_source": "hotpotqa"}},
    {"prompt": "Who directed it?", "label": "Ann Lee",
     "metadata": {"context": "Document 1:\nT\nx", "ground_truth": ["Ann Lee", "Ann"], "num_docs": 200,
                  "data_source": "hotpotqa"}},
]
# from an eval_{N}.json row: prompt = input, label = answers[0], data_source fixed to "hotpotqa"
SLIME_EVAL = [{"prompt": "Were Scott Derrickson and Ed Wood of the same nationality?", "label": "yes",
               "metadata": {"context": "Document 1:\nEd Wood\nAn American filmmaker.", "ground_truth": ["yes"],
                            "num_docs": 50, "data_source": "hotpotqa"}}]


def test_vime_train_jsonl_reads_to_exact_tasks(tmp_path):
    p = _jsonl(tmp_path / "train.jsonl", SLIME_TRAIN)
    assert detect_kind(p) == "slime"
    a, b = _load_all(p)
    # ids: the row number (vime's evaluator numbers rows the same way: _id = position)
    assert (a.task_id, a.question, a.answers) == ("0", "Which magazine was started first?", ["Arthur's Magazine"])
    assert a.context == "Document 1:\nArthur's Magazine\nAn American monthly."
    assert a.meta == {"dataset": "hotpotqa", "data_source": "hotpotqa", "num_docs": 200, "index": 0}
    # ground_truth (all answers) wins over label, which is its first entry here (so not kept)
    assert (b.task_id, b.answers, b.meta["index"]) == ("1", ["Ann Lee", "Ann"], 1) and "label" not in b.meta


def test_slime_eval_jsonl_and_chat_prompts(tmp_path):
    rows = [*SLIME_EVAL,
            {"prompt": [{"role": "user", "content": "Q2?"}], "label": "z",
             "metadata": json.dumps({"context": "C", "num_docs": 50, "data_source": "hotpotqa"})}]
    p = _jsonl(tmp_path / "eval_50.jsonl", rows)
    a, b = _load_all(p)
    assert (a.question, a.answers, a.meta["num_docs"], a.meta["dataset"]) == (
        "Were Scott Derrickson and Ed Wood of the same nationality?", ["yes"], 50, "hotpotqa")
    # chat prompt: the last message's content; no ground_truth: [label]; metadata as JSON text decoded
    assert (b.task_id, b.question, b.context, b.answers) == ("1", "Q2?", "C", ["z"])


def test_bad_slime_row_is_named(tmp_path):
    p = _jsonl(tmp_path / "t.jsonl", [SLIME_TRAIN[0], {"prompt": "q", "label": "a", "metadata": {"num_docs": 3}}])
    with pytest.raises(DataError, match=r"t\.jsonl: row 1: field 'metadata.context'"):
        load_tasks(p)


def test_train_reads_a_vime_file(tmp_path):
    from memrl.config import load_config
    from memrl.training.assemble import task_stream
    from memrl.training.config import TrainConfig

    p = _jsonl(tmp_path / "train.jsonl", SLIME_TRAIN)
    cfg = load_config(TrainConfig, ["data.name=file", f"data.path={p}"])
    got = [next(iter_) for iter_ in [task_stream(cfg, 0)] for _ in range(2)]
    assert sorted(t.task_id for t in got) == ["0@e0", "1@e0"]  # epoch 0 of rows 0 and 1
    assert {t.question for t in got} == {"Which magazine was started first?", "Who directed it?"}


# --- MemAgent index-only eval files (taskutils/memory_data/different_docs_eval.py: generate_index_only) -------

# A dev file in HotpotQA's original layout. read_hotpotqa's document list: every paragraph as
# f"{title}\n{''.join(sentences)}", deduplicated, sorted:
#   "Beta\n b1. b2." (twice -> once), "alpha\na1.", "Gamma\ng."
#   sorted by code point: "B" (0x42) < "G" (0x47) < "a" (0x61) -> [Beta, Gamma, alpha] = indices 0, 1, 2
DEV = [
    {"_id": "x1", "question": "q1", "answer": "a", "type": "bridge", "level": "easy",
     "supporting_facts": [["Beta", 0]], "context": [["Beta", [" b1.", " b2."]], ["alpha", ["a1."]]]},
    {"_id": "x2", "question": "q2", "answer": "b", "type": "bridge", "level": "easy",
     "supporting_facts": [["Gamma", 0]], "context": [["Beta", [" b1.", " b2."]], ["Gamma", ["g."]]]},
]
# generate_index_only row: context = the shuffled document indices; ruler_hqa_over1m.set_context renders
# "Document {i}:\n{DOCS[idx]}" (i from 1) joined by "\n\n"
INDEX_ROW = {"context": [2, 0, 1], "input": "Which one?", "answers": ["alpha"], "num_docs": 12800, "index": 5}
EXPECTED_CONTEXT = "Document 1:\nalpha\na1.\n\nDocument 2:\nBeta\n b1. b2.\n\nDocument 3:\nGamma\ng."


def test_index_only_eval_file_rebuilds_exact_context(tmp_path):
    dev = tmp_path / "hotpotqa_dev.json"
    dev.write_text(json.dumps(DEV))
    assert document_list(dev).docs == ("Beta\n b1. b2.", "Gamma\ng.", "alpha\na1.")
    p = tmp_path / "eval_12800.json"
    p.write_text(json.dumps([INDEX_ROW, {**INDEX_ROW, "context": [1], "index": 6}], indent=4))
    assert detect_kind(p) == "eval_index"
    a, b = _load_all(p, docs_from=dev)
    assert (a.task_id, a.question, a.answers) == ("5", "Which one?", ["alpha"])
    assert a.context.encode() == EXPECTED_CONTEXT.encode()
    assert a.meta == {"num_docs": 12800, "index": 5, "dataset": "hotpotqa"}
    assert b.context == "Document 1:\nGamma\ng."


def test_index_only_errors_name_file_and_row(tmp_path):
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(DEV))
    p = tmp_path / "eval_25600.json"
    p.write_text(json.dumps([INDEX_ROW, {**INDEX_ROW, "context": [0, 3]}]))
    with pytest.raises(DataError, match=r"eval_25600\.json: row 0: field 'context' holds document indices.*--docs-from"):
        load_tasks(p)
    with pytest.raises(DataError, match=r"eval_25600\.json: row 1: context\[1\] = 3 is out of range; .*dev\.json has 3"):
        load_tasks(p, docs_from=dev)
    with pytest.raises(DataError, match="docs_from file .*nope.json does not exist"):
        load_tasks(p, docs_from=tmp_path / "nope.json")


def test_show_prints_kind_and_rebuilds(tmp_path, capsys):
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(DEV))
    p = tmp_path / "eval_12800.json"
    p.write_text(json.dumps([INDEX_ROW]))
    assert main(["data", "show", str(p), "--docs-from", str(dev), "--chars", "200"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kind: eval_index (") and "read 1 rows, 0 rejected" in out and EXPECTED_CONTEXT in out
    assert main(["data", "show", str(p)]) == 1
    assert "--docs-from" in capsys.readouterr().err
    s = _jsonl(tmp_path / "train.jsonl", SLIME_TRAIN)
    assert main(["data", "show", str(s), "--rows", "2"]) == 0
    assert "kind: slime (" in capsys.readouterr().out


@needs_data
def test_index_only_parity_with_per_question_contexts():
    """The document list of the real dev subset rebuilds each question's own context exactly as the
    per-question renderer (memrl.data.hotpotqa.render_paragraphs) writes it."""
    from memrl.data.longctx import DocPool

    docs = document_list(HOTPOT)
    tasks = hotpotqa.load_hotpotqa(HOTPOT)
    assert list(docs.docs) == sorted(set(docs.docs)) and len(docs) == len(DocPool.from_tasks(tasks))
    pos = {d: i for i, d in enumerate(docs.docs)}
    from memrl.data.index_only import rebuild_context

    for t in tasks[:50]:
        idx = [pos[f"{p['title']}\n{''.join(p['sentences'])}"] for p in t.meta["paragraphs"]]
        assert rebuild_context(idx, docs, "x") == hotpotqa.render_paragraphs(t.meta["paragraphs"])


# --- RULER -------------------------------------------------------------------------------------------------

# NVIDIA/RULER scripts/data/synthetic/niah.py (base template): input = template with the haystack, the
# answer prefix cut off into answer_prefix; `index` there holds the answer's character position.
NIAH_INPUT = ("Some special magic numbers are hidden within the following text. Make sure to memorize it. "
              "I will quiz you about the numbers afterwards.\nThe grass is green. One of the special magic numbers "
              "for shiny-lake is: 4821907.\nWhat are all the special magic numbers for shiny-lake mentioned in the "
              "provided text?")
NIAH_ROW = {"index": 171, "input": NIAH_INPUT, "outputs": ["4821907"], "length": 8000,
            "length_w_model_temp": 8000,
            "answer_prefix": " The special magic numbers for shiny-lake mentioned in the provided text are",
            "token_position_answer": 30}
# scripts/data/synthetic/qa.py: "...\n\nQuestion: {query}", answer prefix " Answer:"
QA_INPUT = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nThe following are given documents.\n\nDocument 1:\nParis is in France.\n\nAnswer the question "
            "based on the given documents. Only give me the answer and do not output any other words.\n\n"
            "Question: Where is Paris?")


def test_ruler_layout_reads_to_exact_tasks(tmp_path):
    p = _jsonl(tmp_path / "8192" / "data" / "niah_single_1" / "validation.jsonl", [NIAH_ROW, NIAH_ROW])
    assert detect_kind(p) == "ruler"
    a, b = _load_all(p)
    # the last line of input is the question; the text before it what the agent reads
    assert (a.task_id, b.task_id) == ("0", "1")
    assert a.question == "What are all the special magic numbers for shiny-lake mentioned in the provided text?"
    assert a.context == NIAH_INPUT[: NIAH_INPUT.rindex("\n")] and a.answers == ["4821907"]
    assert a.meta == {"index": 171, "length": 8000, "length_w_model_temp": 8000,
                      "answer_prefix": NIAH_ROW["answer_prefix"], "token_position_answer": 30,
                      "dataset": "niah_single_1", "seq_length": 8192, "metric": "string_match_all",
                      "layout": "ruler"}
    q = _jsonl(tmp_path / "8192" / "data" / "qa_2" / "validation.jsonl",
               [{"index": 0, "input": QA_INPUT, "outputs": ["France", "FR"], "length": 90,
                 "length_w_model_temp": 90, "answer_prefix": " Answer:"}])
    [t] = _load_all(q)
    assert (t.question, t.answers, t.meta["metric"], t.meta["dataset"]) == (
        "Question: Where is Paris?", ["France", "FR"], "string_match_part", "qa_2")


def test_memagent_ruler_layout_and_index_only_squad(tmp_path):
    # taskutils/memory_data/synthetic/variable_tracking.py via ruler_data_prepare.py: eval_<task>_<len>.json,
    # input = instruction + question (no {context}), context apart
    vt = {"index": 0, "input": "Memorize and track the chain(s) of variable assignment hidden in the following text. "
          "Question: Find all variables that are assigned the value 12345 in the text above.",
          "context": "VAR AAA = 12345 ... VAR BBB = VAR AAA", "outputs": ["AAA", "BBB"],
          "answer_prefix": " Answer: ...", "length": 130000}
    p = tmp_path / "eval_vt_131072.json"
    p.write_text(json.dumps([vt], indent=4))
    [t] = _load_all(p)
    assert (t.question, t.context, t.answers) == (vt["input"], vt["context"], ["AAA", "BBB"])
    assert (t.meta["dataset"], t.meta["seq_length"], t.meta["metric"], t.meta["layout"]) == (
        "vt", 131072, "string_match_all", "memagent")
    # synthetic/qa.py past 2e6 tokens stores indices into read_squad's list: every paragraph context,
    # deduplicated, sorted: ["Alpha para", "zeta para"]
    squad = tmp_path / "squad.json"
    squad.write_text(json.dumps({"version": "v2.0", "data": [{"title": "X", "paragraphs": [
        {"context": "zeta para", "qas": []}, {"context": "Alpha para", "qas": []},
        {"context": "zeta para", "qas": []}]}]}))
    qa = {"index": 0, "input": "Answer the question based on the given documents. Who?", "context": [1, 0],
          "outputs": ["x", "y"], "answer_prefix": " Answer:"}
    q = tmp_path / "eval_qa_1_4194304.json"
    q.write_text(json.dumps([qa]))
    [t] = _load_all(q, docs_from=squad)
    assert t.context == "Document 1:\nzeta para\n\nDocument 2:\nAlpha para"
    # MemAgent scores its qa_* files with its QA metrics (ruler_general.py): no RULER metric set
    assert (t.meta["dataset"], t.meta["seq_length"], "metric" in t.meta) == ("qa_1", 4194304, False)


def test_ruler_without_line_breaks_is_refused(tmp_path):
    p = _jsonl(tmp_path / "niah_single_1" / "validation.jsonl",
               [{**NIAH_ROW, "input": NIAH_INPUT.replace("\n", " ")}])
    with pytest.raises(DataError, match=r"row 0: field 'input' has no line break"):
        load_tasks(p)


# --- ReMemR1 eval file names (taskutils/memory_eval/run_eval.py: eval_{hotpotqa,2wikimultihopqa}_{N}) -----------

def test_rememr1_file_names_give_the_dataset(tmp_path):
    row = {"context": "Document 1:\nT\nx", "input": "q?", "answers": ["a"], "num_docs": 50, "index": 3,
           "is_ordered": True, "is_reverse_ordered": False, "min_distance": 2, "evidence_idx": [0, 2],
           "level": "hard", "type": "compositional", "id": "8813f87c0bdd11eba7f7acde48001122"}
    for name, ds in [("eval_2wikimultihopqa_50.json", "2wikimultihopqa"), ("eval_hotpotqa_50.json", "hotpotqa"),
                     ("eval_hotpotqa_50_min_distance_100.json", "hotpotqa_min_distance_100"), ("eval_50.json", None)]:
        (tmp_path / name).write_text(json.dumps([row]))
        [t] = _load_all(tmp_path / name)
        assert (t.task_id, t.meta.get("dataset")) == ("8813f87c0bdd11eba7f7acde48001122", ds)


def test_convert_to_slime_writes_the_published_rows_back(tmp_path):
    src = _jsonl(tmp_path / "train.jsonl", SLIME_TRAIN)
    assert main(["data", "convert", str(src), str(tmp_path / "again.jsonl"), "--to", "slime"]) == 0
    assert [json.loads(ln) for ln in (tmp_path / "again.jsonl").read_text().splitlines()] == SLIME_TRAIN
