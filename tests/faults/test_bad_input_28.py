"""Issue 28: what a careless or hostile user meets at the command line, each a one-line error (exit 1, or 2
for an option value) that names the file / row / field / option, found before any model loads:
duplicate task ids, tasks without (usable) gold answers, broken model directories, damaged parquet pages,
bad option values of `memrl serve` and `memrl data`, multi-question sources for `--kind multiobjective`."""

from __future__ import annotations

import json
import shutil
import socket
import struct
from pathlib import Path

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.data.io import load_tasks, write_records

SMALL = ["workflow.chunk_tokens=64", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2", "--no-progress"]
HOTPOT = [{"_id": f"h{i}", "question": f"who is {i}?", "answer": f"a{i}", "context": [[f"T{i}", [f"s{i}."]]],
           "supporting_facts": [[f"T{i}", 0]], "type": "bridge", "level": "easy"} for i in range(6)]


@pytest.fixture(autouse=True)
def no_model_loads(monkeypatch):
    """Every error here must come before transformers loads a model or tokenizer."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError(f"a model or tokenizer was loaded: {args}")

    for cls in (transformers.AutoModelForCausalLM, transformers.AutoTokenizer):
        monkeypatch.setattr(cls, "from_pretrained", refuse)


def _eval(path: Path, model: str, tmp_path: Path) -> list[str]:
    return ["eval", str(path), "--out", str(tmp_path / "ev"), "--model", model, *SMALL]


def _train(path: Path, model: str, tmp_path: Path) -> list[str]:
    return ["train", "data.name=file", f"data.path={path}", f"model.path={model}", f"out_dir={tmp_path / 'tr'}",
            "trainer.progress=false", "trainer.tensorboard=false"]


def _fails(argv: list[str], capsys, code: int = 1) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


# ------------------------------------------------------------------------------------------------ task files


def test_duplicate_task_ids_named_with_both_rows_before_any_model_loads(tmp_path, tiny_model, capsys):
    # eval_{N}.json rows take their task id from `index`: rows 0 and 2 both say index 0
    rows = [{"input": f"q{i}", "answers": [f"v{i}"], "context": "Document 1: x", "index": i % 2, "num_docs": 1}
            for i in range(3)]
    path = tmp_path / "eval_1.json"
    write_records(path, rows)
    msg = (f"{path}: row 2: task id '0' is already used by row 0; task ids must be unique within a file "
           "(results and resume are keyed by them)")
    assert _fails(_eval(path, tiny_model, tmp_path), capsys) == f"memrl eval: error: {msg}"
    assert _fails(["data", "show", str(path), "--rows", "5"], capsys) == f"memrl data: error: {msg}"
    # memrl's task layout in training: read before the model (it was read after the model loaded)
    tasks = tmp_path / "tasks.jsonl"
    write_records(tasks, [{"task_id": t, "question": "q", "context": "c", "answers": ["a"]} for t in "aba"])
    assert _fails(_train(tasks, tiny_model, tmp_path), capsys) == (
        f"memrl train: error: {tasks}: row 2: task id 'a' is already used by row 0; task ids must be unique "
        "within a file (results and resume are keyed by them)")
    assert not (tmp_path / "ev" / "results.jsonl").exists() and not (tmp_path / "tr" / "checkpoints").exists()


def test_skip_bad_skips_and_counts_a_repeated_id(tmp_path):
    from memrl.data.io import ReadStats

    path = tmp_path / "tasks.jsonl"
    write_records(path, [{"task_id": t, "question": "q", "context": "c", "answers": ["a"]} for t in "abac"])
    st = ReadStats(str(path))
    assert [t.task_id for t in load_tasks(path, skip_bad=True, stats=st)] == ["a", "b", "c"]
    assert (st.rows, st.skipped) == (4, 1)
    assert st.reasons == [f"{path}: row 2: task id 'a' is already used by row 0; task ids must be unique within "
                          "a file (results and resume are keyed by them)"]


def test_task_without_gold_answers_is_refused_up_front(tmp_path, tiny_model, capsys):
    # decision (docs/CONTRACTS.md): every workflow scores its rollouts, so no layout accepts an empty answers list
    path = tmp_path / "tasks.jsonl"
    write_records(path, [{"task_id": "a", "question": "q", "context": "c", "answers": ["x"]},
                         {"task_id": "b", "question": "q", "context": "c", "answers": []}])
    msg = f"{path}: row 1: no gold answers (field 'answers' is empty); every task is scored, so it needs at least one"
    assert _fails(_eval(path, tiny_model, tmp_path), capsys) == f"memrl eval: error: {msg}"
    assert _fails(_train(path, tiny_model, tmp_path), capsys) == f"memrl train: error: {msg}"


def test_golds_that_are_all_empty_text_are_refused(tmp_path, tiny_model, capsys):
    multi = tmp_path / "multi.jsonl"
    meta = {"sub_questions": ["x?", "y?"], "sub_answers": [[""], [" "]]}
    write_records(multi, [{"task_id": "m", "question": "1. x?\n2. y?", "context": "", "answers": ["", " "],
                           "meta": meta}])
    assert _fails(["data", "show", str(multi)], capsys) == (
        f"memrl data: error: {multi}: row 0: the gold answers of sub-questions 1, 2 (of 2) are all empty; "
        "the task can never be scored")
    # one sub-question without a usable gold: the task can never be fully right either
    meta = {"sub_questions": ["x?", "y?"], "sub_answers": [["x", ""], [""]]}
    write_records(multi, [{"task_id": "m", "question": "1. x?\n2. y?", "context": "", "answers": ["x", ""],
                           "meta": meta}])
    assert _fails(_eval(multi, tiny_model, tmp_path), capsys) == (
        f"memrl eval: error: {multi}: row 0: the gold answers of sub-question 2 (of 2) are all empty; "
        "the task can never be scored")
    # MemAct's layout with a JSON-list ground truth (memrl's older files) of empty answers
    row = {"data_source": "memact_multiobjective", "prompt": [{"role": "user", "content": "Q1: x?\nQ2: y?"}],
           "reward_model": {"ground_truth": json.dumps(["", ""])}, "extra_info": {"question": "Q1: x?\nQ2: y?"}}
    mo = tmp_path / "mo.jsonl"
    write_records(mo, [row])
    assert _fails(["data", "show", str(mo), "--kind", "multiobjective"], capsys) == (
        f"memrl data: error: {mo}: row 0: the gold answers of sub-questions 1, 2 (of 2) are all empty; "
        "the task can never be scored")
    single = tmp_path / "eval_1.json"
    write_records(single, [{"input": "q", "answers": ["", " "], "context": "c", "index": 0}])
    assert _fails(_eval(single, tiny_model, tmp_path), capsys) == (
        f"memrl eval: error: {single}: row 0: every gold answer is empty (['', ' ']); the task can never be scored")


def _damaged_page_parquet(tmp_path: Path) -> Path:
    """4 eval rows in 2 row groups (2 rows each, uncompressed); row group 1's first data page header
    overwritten with 0xff bytes (the footer stays intact, so the file opens and row group 0 reads)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"input": f"q{i}", "answers": [f"v{i}"], "context": f"Document 1: x{i}", "index": i} for i in range(4)]
    path = tmp_path / "eval_1.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2, compression="NONE")
    meta = pq.ParquetFile(path).metadata
    assert meta.num_row_groups == 2
    off = meta.row_group(1).column(0).data_page_offset
    data = bytearray(path.read_bytes())
    data[off : off + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))
    return path


def test_damaged_parquet_page_names_the_file_and_row_group(tmp_path, tiny_model, capsys):
    path = _damaged_page_parquet(tmp_path)
    head = f"{path}: parquet data damaged in row group 1 of 2 (rows 2-3): "
    for name, argv in (("data", ["data", "show", str(path), "--rows", "10"]),
                       ("eval", _eval(path, tiny_model, tmp_path))):
        line = _fails(argv, capsys)
        assert line.startswith(f"memrl {name}: error: {head}"), line
        assert len(line) > len(f"memrl {name}: error: {head}") and line.isprintable()  # pyarrow's reason, one line


# ------------------------------------------------------------------------------------------------ model folders


def _broken_model(src: str, tmp_path: Path, damage: str) -> tuple[Path, str]:
    """A copy of the tiny model with one defect, and what the one line must say after '--model=<dir>'."""
    m = tmp_path / f"m_{damage}"
    shutil.copytree(src, m)
    st = m / "model.safetensors"
    size = st.stat().st_size
    (n,) = struct.unpack("<Q", st.read_bytes()[:8])  # the safetensors header length
    if damage == "config_json":
        (m / "config.json").write_text('{"model_type": ', encoding="utf-8")
        return m, ": config.json is not valid JSON (line 1 column 16: Expecting value)"
    if damage == "model_type":
        (m / "config.json").write_text('{"hidden_size": 8}', encoding="utf-8")
        return m, ': config.json has no "model_type" (expected a HuggingFace model config)'
    if damage == "no_weights":
        st.unlink()
        return m, (f": {m} has config.json but no weights (*.safetensors or pytorch_model*.bin); a verl or "
                   "Megatron checkpoint converts with: memrl model convert --from verl|megatron SRC --out DIR")
    if damage == "half_weights":  # the header is whole; the tensor data it describes is not
        st.write_bytes(st.read_bytes()[: size // 2])
        return m, f": model.safetensors is damaged: it holds {size // 2} bytes but its header describes {size} (cut short)"
    if damage == "cut_header":
        st.write_bytes(st.read_bytes()[: 8 + n - 10])
        return m, (f": model.safetensors is damaged: its header claims {n} bytes but the file has {8 + n - 10} "
                   "(cut short or not safetensors)")
    if damage == "four_bytes":
        st.write_bytes(st.read_bytes()[:4])
        return m, ": model.safetensors is damaged: 4 bytes, shorter than a safetensors header"
    if damage == "missing_shard":
        st.rename(m / "model-00001-of-00002.safetensors")
        index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                                "b": "model-00002-of-00002.safetensors"}}
        (m / "model.safetensors.index.json").write_text(json.dumps(index), encoding="utf-8")
        return m, ": weight shard model-00002-of-00002.safetensors (listed in model.safetensors.index.json) is missing"
    if damage == "no_tokenizer":  # transformers built an empty tokenizer from the rest: every prompt was empty
        (m / "tokenizer.json").unlink()
        return m, (" has no tokenizer (expected tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
                   "or vocab.txt)")
    if damage == "no_chat_template":
        (m / "chat_template.jinja").unlink()
        return m, (' has no chat template (expected chat_template.jinja, chat_template.json or "chat_template" in '
                   "tokenizer_config.json; memrl's workflows format every prompt with it)")
    raise AssertionError(damage)


@pytest.mark.parametrize("damage", ["config_json", "model_type", "no_weights", "half_weights", "cut_header",
                                    "four_bytes", "missing_shard", "no_tokenizer", "no_chat_template"])
def test_broken_model_folder_is_one_line_before_loading(damage, tmp_path, tiny_model, capsys):
    model, what = _broken_model(tiny_model, tmp_path, damage)
    good = tmp_path / "eval_1.json"
    write_records(good, [{"input": "q", "answers": ["v"], "context": "Document 1: x", "index": 0}])
    assert _fails(_eval(good, str(model), tmp_path), capsys) == f"memrl eval: error: --model={model}{what}"
    assert _fails(_train(good, str(model), tmp_path), capsys) == f"memrl train: error: model.path={model}{what}"
    assert _fails(["train-sft", f"model.path={model}", f"out_dir={tmp_path / 's'}"], capsys) == (
        f"memrl train-sft: error: model.path={model}{what}")
    assert not (tmp_path / "ev" / "results.jsonl").exists()


def test_data_stats_tokenizer_folder_without_a_tokenizer(tmp_path, tiny_model, capsys):
    model, _ = _broken_model(tiny_model, tmp_path, "no_tokenizer")
    good = tmp_path / "eval_1.json"
    write_records(good, [{"input": "q", "answers": ["v"], "context": "Document 1: x", "index": 0}])
    assert _fails(["data", "stats", "--tokenizer", str(model), str(good)], capsys) == (
        f"memrl data: error: --tokenizer {model} has no tokenizer (expected tokenizer.json, tokenizer.model, "
        "vocab.json + merges.txt, or vocab.txt)")


# ------------------------------------------------------------------------------------------------ memrl serve


@pytest.fixture
def corpus(tmp_path) -> Path:
    p = tmp_path / "corpus.jsonl"
    write_records(p, [{"id": "1", "title": "t", "text": "paris is in france"}])
    return p


@pytest.mark.parametrize(("args", "msg"), [
    # ranges are declared on the options (memrl.config.bounded): argparse refuses them, in one line
    (["--port", "0"], "memrl serve retrieval: error: argument --port: 0 is not allowed: must be in [1, 65535]"),
    (["--port", "70000"], "memrl serve retrieval: error: argument --port: 70000 is not allowed: must be in [1, 65535]"),
    (["--max-concurrency", "0"], "memrl serve retrieval: error: argument --max-concurrency: 0 is not allowed: must be in [1, 4096]"),
    (["--max-topk", "-3"], "memrl serve retrieval: error: argument --max-topk: -3 is not allowed: must be in [1, 1000000]"),
    (["--max-body-bytes", "0"], "memrl serve retrieval: error: argument --max-body-bytes: 0 is not allowed: must be in [1, 268435456]"),
    (["--cache-size", "-1"], "memrl serve retrieval: error: argument --cache-size: -1 is not allowed: must be in [0, 1000000]"),
    (["--retriever", "dense"], "memrl serve: error: --retriever dense needs --model (a local embedding model directory)"),
])
def test_serve_option_out_of_range_is_a_usage_error(args, msg, corpus, capsys):
    with socket.socket() as busy:  # a port in use, so a value that slipped through cannot start a server
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = str(busy.getsockname()[1])
        assert _fails(["serve", "retrieval", "--corpus", str(corpus), "--port", port, *args], capsys, code=2) == msg


def test_serve_missing_files_and_a_busy_port(corpus, tmp_path, capsys):
    argv = ["serve", "retrieval", "--corpus", str(corpus)]
    assert _fails([*argv, "--retriever", "dense", "--model", str(tmp_path / "nope")], capsys) == (
        f"memrl serve: error: --model {tmp_path / 'nope'}: no such directory "
        "(expected a local embedding model directory)")
    assert _fails(["serve", "retrieval", "--corpus", str(tmp_path)], capsys) == (
        f"memrl serve: error: corpus file {tmp_path} is a directory (expected a corpus JSONL: memrl data corpus)")
    with socket.socket() as busy:  # a port someone else listens on: refused before the corpus is indexed
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main([*argv, "--port", str(port)]) == 1
        out = capsys.readouterr()
        assert out.out == ""  # nothing indexed
        assert one_line(out.err) == (f"memrl serve: error: --host 127.0.0.1 --port {port}: cannot listen there "
                                     "(Address already in use)")


# ------------------------------------------------------------------------------------------------ memrl data


@pytest.fixture
def hotpot(tmp_path) -> Path:
    p = tmp_path / "hotpot.json"
    write_records(p, HOTPOT)
    return p


def test_data_option_values_are_one_line_usage_errors(hotpot, tmp_path, capsys):
    out = str(tmp_path / "o")
    cases = [
        (["build", "--source", str(hotpot), "--out", out, "--num-questions", "-3"],
         "memrl data build: error: argument --num-questions: -3 is not allowed: must be in [0, 1000000]"),
        (["build", "--source", str(hotpot), "--out", out, "--docs", "0"], "--docs needs positive counts, got '0'"),
        (["build", "--source", str(hotpot), "--out", out, "--docs", "2,x"],
         "--docs must be comma-separated integers, got '2,x'"),
        (["build", "--kind", "multiobjective", "--source", str(hotpot), "--out", out + ".jsonl",
          "--sub-questions", "2,0"], "--sub-questions needs positive counts, got '2,0'"),
        (["build", "--kind", "multiobjective", "--source", str(hotpot), "--out", out + ".jsonl",
          "--num-questions", "-1"], "memrl data build: error: argument --num-questions: -1 is not allowed: must be in [0, 1000000]"),
        (["train", "--source", str(hotpot), "--out", out + ".parquet", "--docs", "0"],
         "memrl data train: error: argument --docs: 0 is not allowed: must be in [1, 1000000]"),
        (["show", str(hotpot), "--rows", "0"], "memrl data show: error: argument --rows: 0 is not allowed: must be in [1, 1000000]"),
        (["show", str(hotpot), "--chars", "-1"], "memrl data show: error: argument --chars: -1 is not allowed: must be in [0, 268435456]"),
    ]
    for argv, msg in cases:
        assert main(["data", *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err in (f"memrl data: error: {msg}\n", f"{msg}\n"), err
    assert not Path(out).exists() and not Path(out + ".jsonl").exists()


def test_data_sources_and_outputs_checked_before_reading(hotpot, tmp_path, capsys):
    missing = tmp_path / "nope.json"
    # the second source is missing: nothing is read (this printed "read 6 questions" first)
    assert main(["data", "build", "--source", str(hotpot), str(missing), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr() == ("", f"memrl data: error: data file {missing} does not exist\n")
    out = tmp_path / "mo.txt"
    assert main(["data", "build", "--kind", "multiobjective", "--source", str(hotpot), "--out", str(out)]) == 1
    assert capsys.readouterr() == ("", f"memrl data: error: {out}: unknown data file type; expected .json, .jsonl "
                                       "or .parquet (optionally .xz/.gz/.bz2)\n")
    # 6 questions make at most 2 tasks of 3 sub-questions; 5 asked for
    assert main(["data", "build", "--kind", "multiobjective", "--source", str(hotpot), "--out",
                 str(tmp_path / "mo.jsonl"), "--num-questions", "5", "--sub-questions", "3"]) == 1
    assert one_line(capsys.readouterr().err) == (
        "memrl data: error: --kind multiobjective: the pool of 6 questions makes only 2 of the 5 tasks asked for "
        "(sizes [3])")


def test_multiobjective_build_refuses_multi_question_sources(hotpot, tmp_path, capsys):
    first = tmp_path / "mo.jsonl"
    assert main(["data", "build", "--kind", "multiobjective", "--source", str(hotpot), "--out", str(first),
                 "--num-questions", "2", "--sub-questions", "2"]) == 0
    capsys.readouterr()
    again = tmp_path / "mo2.jsonl"
    assert main(["data", "build", "--kind", "multiobjective", "--source", str(hotpot), str(first), "--out",
                 str(again), "--num-questions", "1", "--sub-questions", "2"]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl data: error: --kind multiobjective combines single questions; {first} holds multi-question tasks "
        "(task memact_multiobjective-0 asks 2)")
    assert not again.exists()


def test_a_training_run_given_as_the_model_names_its_latest_checkpoint(tmp_path, tiny_model, capsys):
    # the layout memrl.training.checkpoints.checkpoint writes: out_dir/checkpoints/{step_N/, latest (text "step_N")}
    run = tmp_path / "run"
    shutil.copytree(tiny_model, run / "checkpoints" / "step_2")
    (run / "checkpoints" / "latest").write_text("step_2\n", encoding="utf-8")
    good = tmp_path / "eval_1.json"
    write_records(good, [{"input": "q", "answers": ["v"], "context": "Document 1: x", "index": 0}])
    for given in (run, run / "checkpoints"):
        assert _fails(_eval(good, str(given), tmp_path), capsys) == (
            f"memrl eval: error: --model={given} has no config.json (expected a HuggingFace model directory); "
            f"it is a training run: its latest checkpoint is {run / 'checkpoints' / 'step_2'}")


def test_an_empty_output_path_is_refused(tmp_path, tiny_model, hotpot, capsys):
    # Path("") is ".": these wrote into the current directory
    good = tmp_path / "eval_1.json"
    write_records(good, [{"input": "q", "answers": ["v"], "context": "Document 1: x", "index": 0}])
    assert _fails(["eval", str(good), "--out", "", "--model", tiny_model], capsys, code=2) == (
        "memrl eval: error: --out is empty; give an output directory")
    assert _fails(["demo", "--out", ""], capsys, code=2) == "memrl demo: error: --out is empty; give an output directory"
    assert _fails(["train", f"model.path={tiny_model}", "out_dir=''"], capsys, code=2) == (
        "memrl train: error: out_dir is empty; give an output directory")
    assert _fails(["data", "build", "--source", str(hotpot), "--out", ""], capsys, code=2) == (
        "memrl data: error: --out is empty; give an output directory")
    assert _fails(["data", "convert", str(hotpot), ""], capsys, code=2) == (
        "memrl data: error: DST is empty; give an output file")
