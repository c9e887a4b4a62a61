"""Bad input through every command: truncated and garbage files of each supported format through `data`,
`eval` and `train`; bad options, overrides, presets, paths and names. Each prints exactly one line naming
the thing and what was expected (no traceback), exits 1 (or 2 for a usage error), and loses nothing."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.data.io import write_records

RECORDS = [{"input": f"what is key{i}?", "answers": [f"v{i}"], "context": f"Document 1: key{i} is v{i}.",
            "index": i, "num_docs": 1} for i in range(3)]
GARBAGE = bytes(range(256)) * 4
PARQUET = ("not a readable parquet file: Parquet magic bytes not found in footer. Either the file is "
           "corrupted or this is not a parquet file.")
# (format, damage) -> what the one line says after "<path>: "; hand-checked against the files built below
EXPECTED = {
    ("json", "truncated"): "invalid JSON at line 3 column 56: Expecting ':' delimiter",
    ("json", "garbage"): "not UTF-8 text (byte 0x80); expected UTF-8 JSON",
    ("jsonl", "truncated"): "row 1 (line 2) is not valid JSON: Expecting ':' delimiter",
    ("jsonl", "garbage"): "not UTF-8 text (byte 0x80); expected UTF-8 JSON",
    ("parquet", "truncated"): PARQUET,
    ("parquet", "garbage"): PARQUET,
    ("json.xz", "truncated"): "truncated xz file (it ends before the end-of-stream marker)",
    ("json.xz", "garbage"): "not a valid xz file (Input format not supported by decoder)",
    ("json.gz", "truncated"): "truncated gzip file (it ends before the end-of-stream marker)",
    ("json.gz", "garbage"): "not a valid gzip file (Not a gzipped file (b'\\x00\\x01'))",
    ("json.bz2", "truncated"): "truncated bzip2 file (it ends before the end-of-stream marker)",
    ("json.bz2", "garbage"): "not a valid bzip2 file (Invalid data stream)",
}
SMALL_MEMAGENT = ["workflow.chunk_tokens=64", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=2"]


def _damaged(tmp_path: Path, fmt: str, damage: str) -> Path:
    good = tmp_path / f"good.{fmt}"
    write_records(good, RECORDS)
    data = good.read_bytes()
    bad = tmp_path / f"{damage}.{fmt}"
    bad.write_bytes(data[: len(data) // 2] if damage == "truncated" else GARBAGE)
    return bad


@pytest.mark.parametrize(("fmt", "damage"), list(EXPECTED))
def test_damaged_file_named_in_one_line_by_every_command(fmt, damage, tmp_path, tiny_model, capsys):
    bad = _damaged(tmp_path, fmt, damage)
    line = f"{bad}: {EXPECTED[fmt, damage]}"
    commands = {
        "data": ["data", "show", str(bad), "--rows", "10"],
        "eval": ["eval", str(bad), "--out", str(tmp_path / "ev"), "--model", tiny_model],
        "train": ["train", "data.name=file", f"data.path={bad}", f"model.path={tiny_model}",
                  f"out_dir={tmp_path / 'tr'}", "trainer.progress=false", "trainer.tensorboard=false"],
    }
    for name, argv in commands.items():
        assert main(argv) == 1, name
        assert one_line(capsys.readouterr().err) == f"memrl {name}: error: {line}"
    assert not (tmp_path / "ev" / "results.jsonl").exists()
    assert not (tmp_path / "tr" / "checkpoints").exists()


def test_eval_overrides_anywhere_and_a_bad_file_loses_no_finished_row(tmp_path, tiny_model, capsys):
    good = tmp_path / "eval_1.json"
    write_records(good, RECORDS)
    out = tmp_path / "ev"
    # overrides after an option (was: "unrecognized arguments: limit=1")
    argv = ["eval", str(good), "--no-progress", "limit=1", "--out", str(out), "--model", tiny_model]
    assert main(argv + SMALL_MEMAGENT) == 0
    results = (out / "results.jsonl").read_bytes()
    assert len(results.splitlines()) == 1
    capsys.readouterr()
    bad = _damaged(tmp_path, "json.xz", "garbage")
    assert main(argv + SMALL_MEMAGENT + [str(bad)]) == 1
    assert one_line(capsys.readouterr().err) == f"memrl eval: error: {bad}: {EXPECTED['json.xz', 'garbage']}"
    assert (out / "results.jsonl").read_bytes() == results


def test_unknown_workflow_is_a_usage_error(tmp_path, tiny_model, capsys):
    from memrl.workflows import workflow_names

    good = tmp_path / "eval_1.json"
    write_records(good, RECORDS)
    assert main(["eval", str(good), "--out", str(tmp_path / "ev"), "--model", tiny_model, "workflow=nosuch"]) == 2
    known = ", ".join(workflow_names())
    assert one_line(capsys.readouterr().err) == (
        f"memrl eval: error: workflow.name: unknown workflow 'nosuch'; known: {known}")


def test_out_under_a_file_and_unwritable_out(tmp_path, tiny_model, capsys):
    good = tmp_path / "eval_1.json"
    write_records(good, RECORDS)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    out = blocker / "sub"
    assert main(["eval", str(good), "--out", str(out), "--model", tiny_model]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl eval: error: output directory --out={out} cannot be created: {blocker} is a file, not a directory")
    if os.geteuid() == 0:  # root writes anywhere a mode allows: use a place no one can create in
        locked = Path("/proc/memrl-no-such-dir/out")
    else:
        (tmp_path / "ro").mkdir(mode=0o555)
        locked = tmp_path / "ro" / "out"
    assert main(["eval", str(good), "--out", str(locked), "--model", tiny_model]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith(f"memrl eval: error: output directory --out={locked} is not writable (") and line.endswith(")")


def test_unparseable_yaml_preset(tmp_path, capsys):
    preset = tmp_path / "bad.yaml"
    preset.write_text("trainer:\n  steps: [1, 2\n  lr: 3\n")
    assert main(["train", "--preset", str(preset), "model.path=x"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: preset {preset} is not valid YAML at line 3 column 5: "
        "expected ',' or ']', but got ':'")
    preset.write_bytes(GARBAGE)
    assert main(["train", "--preset", str(preset), "model.path=x"]) == 2
    assert one_line(capsys.readouterr().err) == f"memrl train: error: preset {preset} cannot be read: not UTF-8 text"


def test_missing_or_wrong_model_dir(tmp_path, capsys):
    missing = tmp_path / "nope"
    assert main(["train", f"model.path={missing}", f"out_dir={tmp_path / 'run'}"]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: model.path={missing}: no such directory (expected a HuggingFace model directory)")
    (tmp_path / "empty").mkdir()
    assert main(["train", f"model.path={tmp_path / 'empty'}", f"out_dir={tmp_path / 'run'}"]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: model.path={tmp_path / 'empty'} has no config.json "
        "(expected a HuggingFace model directory)")
    good = tmp_path / "eval_1.json"
    write_records(good, RECORDS)
    assert main(["eval", str(good), "--out", str(tmp_path / "ev"), "--model", str(missing)]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl eval: error: --model={missing}: no such directory "
        "(expected a HuggingFace model directory)")


def test_debug_shows_the_traceback(tmp_path):
    bad = _damaged(tmp_path, "json.xz", "garbage")
    from memrl.data.io import DataError

    with pytest.raises(DataError, match="not a valid xz file"):
        main(["data", "show", str(bad), "--debug"])


def test_stray_option_is_still_refused(capsys):
    assert main(["eval", "x.json", "--out", "o", "--bogus"]) == 2
    assert capsys.readouterr().err == "memrl: error: unrecognized arguments: --bogus\n"


class _FailingEngine:
    """Serves `ok` requests through a real tiny model's tokenizer, then fails like a dead server would."""

    def __init__(self, tokenizer, ok: int) -> None:
        self.tokenizer, self.ok, self.calls = tokenizer, ok, 0

    async def generate(self, prompt_ids, sampling):
        from memrl.engines.base import Completion, EngineError

        self.calls += 1
        if self.calls > self.ok:
            raise EngineError("http://127.0.0.1:9/v1/completions: connection refused (gave up after 4 attempts)")
        ids = self.tokenizer.encode(" \\boxed{v0}", add_special_tokens=False)
        return Completion(ids, [-0.5] * len(ids), "stop")

    def update_weights(self, weights) -> None:
        pass

    async def close(self) -> None:
        pass


def test_engine_failure_is_one_line_and_finished_rows_are_kept(tmp_path, tiny_model, capsys, monkeypatch):
    from transformers import AutoTokenizer

    import memrl.eval.runner as runner

    tok = AutoTokenizer.from_pretrained(tiny_model)
    # full_context makes one call per question: the first two questions finish, the third fails
    monkeypatch.setattr(runner, "make_eval_engine", lambda sec: _FailingEngine(tok, ok=2))
    good = tmp_path / "eval_1.json"
    write_records(good, RECORDS)
    out = tmp_path / "ev"
    argv = ["eval", str(good), "--out", str(out), "--model", tiny_model, "workflow=full_context", "concurrency=1",
            "--no-progress"]
    assert main(argv) == 1
    assert one_line(capsys.readouterr().err) == (
        "memrl eval: error: workflow full_context failed on task 2 sample 0: "
        "http://127.0.0.1:9/v1/completions: connection refused (gave up after 4 attempts)")
    rows = runner.read_results(out / "results.jsonl")
    assert [r["task_id"] for r in rows] == ["0", "1"] and [r["prediction"] for r in rows] == ["v0", "v0"]


def test_unknown_workflow_and_missing_model_in_train_commands(tmp_path, tiny_model, capsys):
    from memrl.workflows import workflow_names

    known = ", ".join(workflow_names())
    assert main(["train", f"model.path={tiny_model}", "workflow=nosuch", f"out_dir={tmp_path / 'r'}"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"memrl train: error: workflow.name: unknown workflow 'nosuch'; known: {known}")
    assert main(["train-sft", f"model.path={tiny_model}", "workflow=nosuch", f"out_dir={tmp_path / 's'}"]) == 2
    assert one_line(capsys.readouterr().err) == (
        f"memrl train-sft: error: workflow.name: unknown workflow 'nosuch'; known: {known}")
    assert main(["train-sft", f"model.path={tmp_path / 'nope'}", f"out_dir={tmp_path / 's'}"]) == 1
    assert one_line(capsys.readouterr().err) == (
        f"memrl train-sft: error: model.path={tmp_path / 'nope'}: no such directory "
        "(expected a HuggingFace model directory)")


def test_data_outputs_checked_before_reading(tmp_path, capsys):
    good = tmp_path / "good.json"
    write_records(good, RECORDS)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    cases = [
        (["data", "convert", str(good), str(blocker / "x.json"), "--to", "eval"],
         f"output file DST={blocker / 'x.json'}: its directory {blocker} exists and is not a directory"),
        (["data", "build", "--source", str(good), "--out", str(blocker / "o")],
         f"output directory --out={blocker / 'o'} cannot be created: {blocker} is a file, not a directory"),
        (["data", "train", "--source", str(good), "--out", str(blocker / "t.parquet")],
         f"output file --out={blocker / 't.parquet'}: its directory {blocker} exists and is not a directory"),
        (["data", "convert", str(good), str(tmp_path), "--to", "eval"], f"output file DST={tmp_path} is a directory"),
    ]
    for argv, msg in cases:
        assert main(argv) == 1, argv
        assert capsys.readouterr().err == f"memrl data: error: {msg}\n"  # nothing read, nothing printed before
