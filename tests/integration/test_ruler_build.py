"""`memrl data build --kind ruler`: byte-identical rebuilds, lengths within 2% in the given tokenizer, and
`memrl eval` scoring the built files with RULER's metrics (a scripted engine right or wrong by construction)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from doubles import ScriptedEngine

from memrl.data.io import detect_kind, load_tasks
from memrl.data.ruler_build import PAPER_TASKS, parse_length
from memrl.engines import EngineConfig
from memrl.eval.report import summarize
from memrl.eval.runner import EvalConfig, evaluate
from memrl.models.tiny import cached_tiny_model

LENGTHS = (4096, 8192)
SAMPLES = 3


def _essay(path: Path) -> None:
    topics = ["cities", "code", "money", "schools", "painting", "ships", "bread"]
    path.write_text(" ".join(f"Paragraph {i} of this essay is about {topics[i % 7]}. It says little else, and "
                             f"then it ends." for i in range(2000)), encoding="utf-8")


def _squad(path: Path) -> None:
    """Three short SQuAD-layout articles; one impossible question (dropped, as RULER's reader does)."""
    arts = []
    for a in range(3):
        paras = []
        for p in range(4):
            qas = [{"question": f"What colour is door {a}-{p}?", "id": f"{a}{p}", "is_impossible": False,
                    "answers": [{"text": f"colour{a}{p}", "answer_start": 0}, {"text": f"shade{a}{p}",
                                                                              "answer_start": 0}]}]
            if p == 0:
                qas.append({"question": "Unanswerable?", "id": f"x{a}", "is_impossible": True, "answers": []})
            paras.append({"context": f"Door {a}-{p} of the old house is painted colour{a}{p}, also called "
                                     f"shade{a}{p}. " + "The hall behind it is long and quiet. " * 3, "qas": qas})
        arts.append({"title": f"House {a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "v2.0", "data": arts}), encoding="utf-8")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from memrl.cli import main

    tmp = tmp_path_factory.mktemp("ruler")
    model = cached_tiny_model("tiny", tmp / "models")
    _essay(tmp / "essay.txt")
    _squad(tmp / "squad.json")

    def build(out: str, seed: int = 7, tasks: tuple[str, ...] = PAPER_TASKS) -> int:
        return main(["data", "build", "--kind", "ruler", "--tasks", ",".join(tasks), "--lengths", "4k,8k",
                     "--tokenizer", str(model), "--out", str(tmp / out), "--seed", str(seed), "--samples",
                     str(SAMPLES), "--haystack", str(tmp / "essay.txt"), "--qa-source", str(tmp / "squad.json")])

    assert build("a") == 0
    return tmp, model, build


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_rebuild_is_byte_identical_and_the_seed_matters(built):
    tmp, _, build = built
    assert build("b") == 0
    a, b = _files(tmp / "a"), _files(tmp / "b")
    assert sorted(a) == sorted(["manifest.json"] + [f"{n}/data/{t}/validation.jsonl" for n in LENGTHS
                                                     for t in PAPER_TASKS])
    assert a == b
    assert build("c", seed=8, tasks=("niah_single_1", "fwe")) == 0
    c = _files(tmp / "c")
    assert sum(k.endswith(".jsonl") for k in c) == 4 and all(a[k] != c[k] for k in c if k.endswith(".jsonl"))


def test_every_row_is_within_two_percent_of_its_target_in_the_tokenizer(built):
    from transformers import AutoTokenizer

    tmp, model, _ = built
    tok = AutoTokenizer.from_pretrained(model)
    gen = {"niah": 128, "vt": 30, "fwe": 50, "qa": 32}  # RULER's tokens_to_generate per task family
    for n in LENGTHS:
        for task in PAPER_TASKS:
            path = tmp / "a" / str(n) / "data" / task / "validation.jsonl"
            rows = [json.loads(x) for x in path.read_text().splitlines()]
            assert len(rows) == SAMPLES
            fam = "niah" if task.startswith("niah") else "qa" if task.startswith("qa") else task
            for r in rows:
                counted = len(tok.encode(r["input"] + r["answer_prefix"], add_special_tokens=False)) + gen[fam]
                assert counted == r["length"], (task, n)
                assert 0.98 * n <= r["length"] <= n, (task, n, r["length"])
            assert detect_kind(path) == "ruler"


def test_task_structure_matches_ruler(built):
    tmp, _, _ = built
    n_answers = {"niah_single_1": 1, "niah_single_2": 1, "niah_single_3": 1, "niah_multikey_1": 1,
                 "niah_multikey_2": 1, "niah_multikey_3": 1, "niah_multivalue": 4, "niah_multiquery": 4,
                 "vt": 5, "fwe": 3, "qa_1": 2}
    for task, k in n_answers.items():
        tasks = load_tasks(tmp / "a" / "4096" / "data" / task / "validation.jsonl")
        for t in tasks:
            assert len(t.answers) == k and t.meta["seq_length"] == 4096 and t.meta["dataset"] == task
            assert t.meta["metric"] == ("string_match_part" if task == "qa_1" else "string_match_all")
            if task.startswith("niah"):  # every value is in the haystack, the key in the question
                assert all(a in t.context for a in t.answers)
                assert t.context.find(t.answers[0]) == t.meta["index"] - t.context.find(t.context[:1])
            if task == "niah_single_3":
                assert len(t.answers[0]) == 36 and t.answers[0][14] == "4"  # a uuid4
            if task == "niah_multikey_3":
                assert t.question.count("-") == 4  # a uuid key
            if task == "vt":  # chain VAR a = value, VAR b = VAR a, ... in the haystack
                a = t.answers
                assert f"VAR {a[1]} = VAR {a[0]}" in t.context and f"VAR {a[4]} = VAR {a[3]}" in t.context
            if task == "fwe":  # the three answers are the most frequent coded words, in order
                words = [w for w in t.context.split() if len(w) == 6 and w.isalpha() and w.islower()]
                counts = sorted({w: words.count(w) for w in set(words)}.items(), key=lambda kv: -kv[1])
                assert [w for w, _ in counts[:3]] == t.answers
            if task == "qa_1":
                assert t.question.startswith("Question: What colour is door")
                assert t.answers[0] in t.context


def _pattern(row: int, answers: list[str]) -> str:
    """Row 0 of every file: all answers; row 1: the first answer only; row 2: nothing right."""
    return [", ".join(answers), answers[0], "?"][row]


def test_eval_scores_string_match_all_per_task_and_length(built):
    tmp, _, _ = built
    files = [str(tmp / "a" / str(n) / "data" / t / "validation.jsonl") for n in LENGTHS for t in PAPER_TASKS]
    by_ctx = []
    for f in files:
        by_ctx += [(t.context, t.question, int(t.task_id), t.answers) for t in load_tasks(f)]

    def reply(prompt: str, _: int) -> str:
        [(row, answers)] = [(r, a) for c, q, r, a in by_ctx if c in prompt and q in prompt]
        return f"\\boxed{{{_pattern(row, answers)}}}"

    cfg = EvalConfig(workflow={"name": "full_context", "max_context_tokens": 10**6},
                     engine=EngineConfig(model="scripted"), progress=False, concurrency=4)
    rows = evaluate(files, tmp / "eval", cfg, engine=ScriptedEngine(reply))
    assert len(rows) == len(files) * SAMPLES
    sums = {(s.dataset, s.num_docs): s for s in summarize(rows, "r")}
    # string_match_all = mean over the 3 rows of (answers found / answers): (1 + 1/k + 0) / 3 x 100 with k
    # answers per row: k=1 -> 66.67, multivalue / multiquery k=4 -> 41.67, vt k=5 -> 40.00, fwe k=3 -> 44.44;
    # qa_1 (string_match_part: any answer found) -> (1 + 1 + 0) / 3 -> 66.67
    expect = {"niah_multivalue": 100 * (1 + 1 / 4) / 3, "niah_multiquery": 100 * (1 + 1 / 4) / 3,
              "vt": 100 * (1 + 1 / 5) / 3, "fwe": 100 * (1 + 1 / 3) / 3}
    for n in LENGTHS:
        for task in PAPER_TASKS:
            s = sums[(task, n)]
            assert s.questions == SAMPLES
            if task == "qa_1":
                assert s.string_match_part == pytest.approx(200 / 3) and s.string_match_all is None
            else:
                assert s.string_match_all == pytest.approx(expect.get(task, 200 / 3)), (task, n)


def test_cli_refuses_bad_arguments(tmp_path, capsys):
    from memrl.cli import main

    assert parse_length("8k") == 8192 and parse_length("1m") == 1 << 20 and parse_length("5000") == 5000
    model = cached_tiny_model("tiny", tmp_path / "models")
    base = ["data", "build", "--kind", "ruler", "--tokenizer", str(model), "--out", str(tmp_path / "o")]
    assert main(base + ["--lengths", "1k", "--tasks", "niah_single_9"]) == 1
    assert "--tasks: unknown niah_single_9" in capsys.readouterr().err
    assert main(base + ["--lengths", "eight"]) == 1
    assert "--lengths" in capsys.readouterr().err
    assert main(base + ["--lengths", "1k", "--tasks", "niah_single_2"]) == 1
    assert "niah_single_2 needs an essay haystack: pass --haystack FILE" in capsys.readouterr().err
    assert main(base + ["--lengths", "1k", "--tasks", "qa_1"]) == 1
    assert "qa_1 needs --qa-source FILE" in capsys.readouterr().err
    assert main(["data", "build", "--out", str(tmp_path / "h")]) == 1  # the HotpotQA build still needs sources
    assert "--source is required" in capsys.readouterr().err
