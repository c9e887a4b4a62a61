"""Eval row identity: two datasets at one N (ReMemR1's HotpotQA + 2Wiki sets) stay two report rows and resume
exactly; a second file into the same --out runs; garbled results lines are named, not fatal; samples."""

from __future__ import annotations

import json
import logging
import re

import pytest
from doubles import ScriptedEngine

from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.eval.report import markdown_table, summarize
from memrl.eval.runner import RESULTS_FILE, EvalConfig, evaluate, read_results, row_key
from memrl.types import Task

ANSWERS = ["Paris", "blue whale", "1969", "Ada Lovelace"]
WF = {"name": "memagent", "chunk_tokens": 40, "max_memory_tokens": 32, "max_final_tokens": 64}


def _tasks(n_docs: int, salt: str) -> list[Task]:
    """Same task ids (q0..q3) in every set, as ReMemR1's per-dataset files share question positions."""
    ctx = "\n\n".join(f"Document {d + 1}:\nT{d}\n{salt} filler" for d in range(n_docs))
    return [Task(f"q{i}", f"Question number {i}?", ctx, [a], meta={"num_docs": n_docs, "index": i})
            for i, a in enumerate(ANSWERS)]


def _reply(prompt: str, _: int) -> str:
    """Questions 0 and 2 answered right, 1 and 3 wrong, whatever the dataset."""
    i = int(re.search(r"Question number (\d+)\?", prompt).group(1))
    if "<section>" in prompt:
        return f"note {i}"
    return f"\\boxed{{{ANSWERS[i]}}}" if i % 2 == 0 else "\\boxed{no idea}"


def _finals(eng: ScriptedEngine) -> int:
    return sum("<section>" not in c.prompt_text for c in eng.calls)


def _cfg(**kw) -> EvalConfig:
    kw.setdefault("workflow", dict(WF))
    return EvalConfig(engine=EngineConfig(model="scripted"), progress=False, concurrency=2, **kw)


@pytest.fixture
def pair(tmp_path):
    """ReMemR1's file names at one N: eval_hotpotqa_4.json and eval_2wikimultihopqa_4.json."""
    out = []
    for ds in ("hotpotqa", "2wikimultihopqa"):
        p = tmp_path / "data" / f"eval_{ds}_4.json"
        write_eval_json(p, _tasks(4, ds))
        out.append(str(p))
    return out


def test_two_datasets_at_one_n_are_two_rows_and_resume_exactly(tmp_path, pair):
    out = tmp_path / "run"
    full = evaluate(pair, out, _cfg(), engine=ScriptedEngine(_reply))
    assert len(full) == 8 and {r["dataset"] for r in full} == {"hotpotqa", "2wikimultihopqa"}
    sums = summarize(full, "r")
    # one row per (dataset, N), datasets in name order; each 4 questions, 2 right
    assert [(s.dataset, s.num_docs, s.questions, s.accuracy) for s in sums] == [
        ("2wikimultihopqa", 4, 4, 50.0), ("hotpotqa", 4, 4, 50.0)]
    md = markdown_table(sums)
    assert "| run | dataset | docs |" in md and "| r | hotpotqa | 4 | 4 |" in md
    # the published evaluators' grouping: one row per eval file
    assert [(s.dataset, s.questions) for s in summarize(full, "r", group_by="file")] == [
        ("eval_2wikimultihopqa_4.json", 4), ("eval_hotpotqa_4.json", 4)]

    # a kill mid-run: 3 full rows, then half of the 4th
    lines = (out / RESULTS_FILE).read_text().splitlines(keepends=True)
    (out / RESULTS_FILE).write_text("".join(lines[:3]) + lines[3][:40])
    eng = ScriptedEngine(_reply)
    again = evaluate(pair, out, _cfg(), engine=eng)
    assert _finals(eng) == 5  # exactly the 5 rows not written, of both datasets
    keys = [row_key(r) for r in read_results(out / RESULTS_FILE)]
    assert len(keys) == len(set(keys)) == 8 and set(keys) == {row_key(r) for r in full}
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "started", "finished", "session")}  # noqa: E731
    assert sorted(map(strip, again), key=row_key) == sorted(map(strip, full), key=row_key)
    eng3 = ScriptedEngine(_reply)
    assert len(evaluate(pair, out, _cfg(), engine=eng3)) == 8 and not eng3.calls


def test_rows_name_their_source_file(tmp_path, pair):
    import hashlib
    from pathlib import Path

    rows = evaluate(pair[:1], tmp_path / "run", _cfg(limit=1), engine=ScriptedEngine(_reply))
    [r] = rows
    data = Path(pair[0]).read_bytes()
    assert (r["file"], r["file_path"], r["file_bytes"], r["file_sha256"]) == (
        "eval_hotpotqa_4.json", str(Path(pair[0]).resolve()), len(data), hashlib.sha256(data).hexdigest()[:16])
    assert (r["dataset"], r["num_docs"], r["task_id"], r["sample"]) == ("hotpotqa", 4, "q0", 0)


def test_a_second_file_into_the_same_out_runs(tmp_path):
    """Two task files with the same ids and no N (issue 28: "3 rows already done, 0 to go")."""
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for p, salt in ((a, "A"), (b, "B")):
        p.write_text("".join(json.dumps({"prompt": f"Question number {i}?", "label": ANSWERS[i],
                                         "metadata": {"context": f"Document 1:\n{salt}\ntext"}}) + "\n"
                             for i in range(3)))
    out = tmp_path / "run"
    assert len(evaluate([str(a)], out, _cfg(), engine=ScriptedEngine(_reply))) == 3
    eng = ScriptedEngine(_reply)
    rows = evaluate([str(b)], out, _cfg(), engine=eng)
    assert _finals(eng) == 3 and len(rows) == 6
    assert sorted((r["file"], r["task_id"]) for r in rows) == [(f, str(i)) for f in ("a.jsonl", "b.jsonl")
                                                              for i in range(3)]
    eng2 = ScriptedEngine(_reply)
    assert len(evaluate([str(a), str(b)], out, _cfg(), engine=eng2)) == 6 and not eng2.calls


def test_garbled_results_lines_are_named_and_rerun(tmp_path, pair, caplog):
    out = tmp_path / "run"
    evaluate(pair, out, _cfg(), engine=ScriptedEngine(_reply))
    p = out / RESULTS_FILE
    lines = p.read_bytes().splitlines(keepends=True)
    # line 2 loses a byte to a non-UTF-8 one, line 5 is cut in the middle (not the last line)
    lines[1] = lines[1][:30] + b"\xff" + lines[1][31:]
    lines[4] = lines[4][:50] + b"\n"
    p.write_bytes(b"".join(lines))
    caplog.set_level(logging.WARNING, logger="memrl.eval.runner")
    rows = read_results(p)
    assert len(rows) == 6
    [msg] = [r.getMessage() for r in caplog.records if "unreadable" in r.getMessage()]
    assert str(p) in msg and "skipped 2 unreadable lines" in msg
    assert "line 2 (not UTF-8: byte 0xff at column 31)" in msg and "line 5 (invalid JSON" in msg

    from memrl.cli import main

    caplog.clear()
    assert main(["eval", "report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert any("skipped 2 unreadable lines" in r.getMessage() for r in caplog.records)
    assert main(["eval", "report", str(out), "--out", str(tmp_path / "rep2"), "--group-by", "file"]) == 0
    assert "| eval_hotpotqa_4.json | 4 |" in (tmp_path / "rep2" / "summary.md").read_text()

    eng = ScriptedEngine(_reply)
    again = evaluate(pair, out, _cfg(), engine=eng)
    assert _finals(eng) == 2 and len(again) == 8  # the two garbled rows' questions, once each
    assert len({row_key(r) for r in again}) == 8


def test_samples_resume_per_sample(tmp_path, pair):
    out = tmp_path / "run"
    cfg = _cfg(samples=2, limit=2, workflow={**WF, "temperature": 1.0})
    full = evaluate(pair[:1], out, cfg, engine=ScriptedEngine(_reply))
    assert sorted((r["task_id"], r["sample"]) for r in full) == [("q0", 0), ("q0", 1), ("q1", 0), ("q1", 1)]
    lines = (out / RESULTS_FILE).read_text().splitlines(keepends=True)
    (out / RESULTS_FILE).write_text("".join(lines[:3]))
    eng = ScriptedEngine(_reply)
    again = evaluate(pair[:1], out, cfg, engine=eng)
    assert _finals(eng) == 1 and sorted(row_key(r) for r in again) == sorted(row_key(r) for r in full)
    with pytest.raises(ValueError, match="samples=0 is not allowed: must be in \\[1, 1000000\\]"):
        _cfg(samples=0)


def test_legacy_rows_still_resume(tmp_path, pair):
    """Rows written before rows carried a file digest resume by (file name, num_docs, task_id)."""
    out = tmp_path / "run"
    evaluate(pair[:1], out, _cfg(), engine=ScriptedEngine(_reply))
    p = out / RESULTS_FILE
    old = [json.loads(ln) for ln in p.read_text().splitlines()]
    for r in old:
        for k in ("file_path", "file_bytes", "file_sha256", "dataset", "sample"):
            r.pop(k)
    p.write_text("".join(json.dumps(r) + "\n" for r in old[:3]))
    eng = ScriptedEngine(_reply)
    assert len(evaluate(pair[:1], out, _cfg(), engine=eng)) == 4 and _finals(eng) == 1


def test_index_only_eval_with_docs_from(tmp_path):
    """An over-1M style file (context = indices) evaluates with docs_from; another dev file may not resume."""
    dev = tmp_path / "dev.json"
    paras = [["Beta", [" b1."]], ["alpha", ["a1."]]]
    dev.write_text(json.dumps([{"_id": "x", "question": "q", "answer": "a", "supporting_facts": [],
                                "context": paras}]))
    p = tmp_path / "eval_12800.json"
    p.write_text(json.dumps([{"context": [1, 0], "input": "Question number 0?", "answers": ["Paris"],
                              "num_docs": 12800, "index": 7}]))
    eng = ScriptedEngine(_reply)
    [row] = evaluate([str(p)], tmp_path / "run", _cfg(docs_from=str(dev)), engine=eng)
    assert (row["dataset"], row["num_docs"], row["task_id"], row["sub_em"]) == ("hotpotqa", 12800, "7", 1.0)
    # the chunk the memory call read is the rebuilt context ("alpha" sorts after "Beta": index 1 is alpha)
    assert "<section>\nDocument 1:\nalpha\na1.\n\nDocument 2:\nBeta" in eng.calls[0].prompt_text
    dev.write_text(json.dumps([{"_id": "x", "question": "q", "answer": "a", "supporting_facts": [],
                                "context": paras + [["Zeta", ["z."]]]}]))
    with pytest.raises(ValueError, match="docs_from differ"):
        evaluate([str(p)], tmp_path / "run", _cfg(docs_from=str(dev)), engine=ScriptedEngine(_reply))


def test_the_same_file_twice_runs_once(tmp_path, pair):
    import shutil

    copy = tmp_path / "copy_of_hotpotqa.json"
    shutil.copy(pair[0], copy)
    eng = ScriptedEngine(_reply)
    rows = evaluate([pair[0], str(copy)], tmp_path / "run", _cfg(), engine=eng)
    assert len(rows) == 4 and _finals(eng) == 4 and {r["file"] for r in rows} == {"eval_hotpotqa_4.json"}
