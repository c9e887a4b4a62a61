"""`memrl data fetch` against a local HTTP server this test starts (127.0.0.1, a free port): the pinned entries of
memrl.data.fetch.DATASETS are replaced (monkeypatch, the only override there is) by files it serves. Checked:
a wrong checksum is refused and removed with one line naming --file; a download cut short is resumed with a
Range request for exactly the missing bytes; a server that ignores the range is read again from the start;
offline is one line naming --file; --file takes a copy (an archive or its member) after checking its sha256;
the cache is reused; an archive's member is extracted and checked."""

from __future__ import annotations

import hashlib
import io
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data import fetch as F
from memrl.downloads import DownloadError, download
from memrl.errors import UserError

BODY = b"".join(b"line %05d of a pinned data file\n" % i for i in range(4000))  # 132,000 bytes
SHA = hashlib.sha256(BODY).hexdigest()


class Server:
    """Serves `files` {path: bytes} with HTTP Range support. `cut` {path: n}: the next response for that path
    sends only its first n bytes (with the full Content-Length) and closes. `ignore_range`: always 200."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.cut, self.ignore_range = files, {}, False
        self.ranges: list[str | None] = []
        self.sent = 0
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a) -> None:  # quiet
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                path = self.path.split("?")[0]
                body = srv.files.get(path)
                if body is None:
                    self.send_error(404)
                    return
                rng = self.headers.get("Range")
                srv.ranges.append(rng)
                start = 0
                if rng and not srv.ignore_range:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    if start >= len(body):
                        self.send_response(416)
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                part = body[start:]
                self.send_header("Content-Length", str(len(part)))
                self.end_headers()
                n = srv.cut.pop(path, len(part))
                srv.sent += min(n, len(part))  # counted before the client can have read it
                self.wfile.write(part[:n])
                self.wfile.flush()
                if n < len(part):
                    self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server({"/data.json": BODY})
    yield s
    s.close()


def _pin(url: str, **kw) -> F.PinnedFile:
    base = dict(url=url, sha256=SHA, size=len(BODY), license="test licence", about="a test file",
                next_command="memrl data show {path}", filename="data.json")
    return F.PinnedFile(**{**base, **kw})


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("MEMRL_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_fetch_downloads_checks_caches_and_prints_the_next_command(server, cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(F.DATASETS, "locomo", _pin(server.url + "/data.json"))
    assert main(["data", "fetch", "locomo"]) == 0
    target = cache / "data" / "locomo" / "data.json"
    assert target.read_bytes() == BODY
    assert not (cache / "data" / "locomo" / "data.json.partial").exists()
    out = capsys.readouterr().out.splitlines()
    assert out == [f"locomo (test licence; downloaded): {target}", f"next: memrl data show {target}"]
    assert server.ranges == ["bytes=0-"] and server.sent == len(BODY)

    assert main(["data", "fetch", "locomo", "--out", str(tmp_path / "mine")]) == 0  # from the cache, copied
    assert server.sent == len(BODY)  # nothing downloaded again
    assert (tmp_path / "mine" / "data.json").read_bytes() == BODY
    assert capsys.readouterr().out.splitlines()[0] == f"locomo (test licence; from the cache): {tmp_path / 'mine' / 'data.json'}"


def test_a_wrong_checksum_is_refused_removed_and_names_file(server, cache, monkeypatch, capsys):
    bad = "0" * 64
    monkeypatch.setitem(F.DATASETS, "locomo", _pin(server.url + "/data.json", sha256=bad))
    assert main(["data", "fetch", "locomo"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0] == f"downloading {server.url}/data.json (132,000 bytes)"
    assert err[1:] == [(f"memrl data: error: could not fetch locomo: {server.url}/data.json: the downloaded file's sha256 is "
                   f"{SHA}, not the pinned {bad} (removed it); offline? download it elsewhere and pass --file FILE "
                   f"(checked against sha256 {bad})")]
    assert sorted(p.name for p in (cache / "data" / "locomo").iterdir()) == ["data.json.partial.lock"]


def test_a_cut_download_resumes_with_a_range_request_for_the_rest(server, tmp_path):
    server.cut["/data.json"] = 50_000
    dest = tmp_path / "f" / "data.json"
    with pytest.raises(DownloadError, match=r"stopped after 50,000 of 132,000 bytes .*run the command again to resume"):
        download(server.url + "/data.json", dest, SHA, len(BODY), quiet=True)
    assert (tmp_path / "f" / "data.json.partial").read_bytes() == BODY[:50_000]
    assert download(server.url + "/data.json", dest, SHA, len(BODY), quiet=True) == dest
    assert dest.read_bytes() == BODY
    assert server.ranges == ["bytes=0-", "bytes=50000-"]
    assert server.sent == len(BODY)  # the second request sent only the missing 82,000 bytes


def test_a_server_that_ignores_the_range_is_read_from_the_start(server, tmp_path):
    part = tmp_path / "data.json.partial"
    part.write_bytes(b"x" * 1000)  # a stale partial file: its bytes must not survive
    server.ignore_range = True
    dest = download(server.url + "/data.json", tmp_path / "data.json", SHA, len(BODY), quiet=True)
    assert dest.read_bytes() == BODY and not part.exists()
    assert server.ranges == ["bytes=1000-"]


def test_offline_is_one_line_naming_file(cache, monkeypatch, capsys):
    s = Server({})
    url = s.url + "/data.json"
    s.close()  # nothing listens there now
    monkeypatch.setitem(F.DATASETS, "locomo", _pin(url))
    assert main(["data", "fetch", "locomo"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"memrl data: error: could not fetch locomo: {url}: ")
    assert err.rstrip().endswith(f"offline? download it elsewhere and pass --file FILE (checked against sha256 {SHA})")


def test_file_is_checked_against_the_same_sha256(cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(F.DATASETS, "locomo", _pin("http://127.0.0.1:9/data.json"))  # never contacted
    mine = tmp_path / "copy.json"
    mine.write_bytes(BODY[:-1] + b"!")
    assert main(["data", "fetch", "locomo", "--file", str(mine)]) == 1
    got = hashlib.sha256(mine.read_bytes()).hexdigest()
    assert capsys.readouterr().err.strip() == (f"memrl data: error: --file {mine}: sha256 {got} (132,000 bytes) is not "
                                               f"the pinned locomo (sha256 {SHA}); refusing it")
    mine.write_bytes(BODY)
    assert main(["data", "fetch", "locomo", "--file", str(mine)]) == 0
    assert (cache / "data" / "locomo" / "data.json").read_bytes() == BODY
    assert capsys.readouterr().out.startswith("locomo (test licence; from --file): ")


def _zip(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_an_archive_member_is_extracted_and_checked(cache, tmp_path, monkeypatch):
    archive = _zip({"dev.json": BODY, "train.json": b"[]"})
    s = Server({"/release.zip": archive})
    try:
        pin = _pin(s.url + "/release.zip?dl=1", sha256=hashlib.sha256(archive).hexdigest(), size=len(archive),
                   member="dev.json", member_sha256=SHA, member_size=len(BODY), filename="2wiki_dev.json")
        monkeypatch.setitem(F.DATASETS, "2wiki_dev", pin)
        path, fresh = F.fetch_dataset("2wiki_dev", quiet=True)
        assert fresh and path == cache / "data" / "2wiki_dev" / "2wiki_dev.json" and path.read_bytes() == BODY
        assert (cache / "data" / "2wiki_dev" / "release.zip").read_bytes() == archive  # kept beside it
        assert F.fetch_dataset("2wiki_dev", quiet=True) == (path, False)
    finally:
        s.close()
    # --file: the archive or the member itself, each by its own sha256; a member that differs is refused
    path.unlink()
    mine = tmp_path / "dev.json"
    mine.write_bytes(BODY)
    assert F.fetch_dataset("2wiki_dev", file=mine) == (path, True) and path.read_bytes() == BODY
    path.unlink()
    bad = tmp_path / "bad.zip"
    bad.write_bytes(_zip({"dev.json": b"other"}))
    monkeypatch.setitem(F.DATASETS, "2wiki_dev", F.PinnedFile(**{**pin.__dict__, "sha256": hashlib.sha256(
        bad.read_bytes()).hexdigest(), "size": bad.stat().st_size}))
    with pytest.raises(UserError, match=r"bad.zip!dev.json: sha256 .* is not the pinned " + SHA):
        F.fetch_dataset("2wiki_dev", file=bad)
    assert not path.exists()


def test_every_entry_is_pinned_with_url_size_sha256_licence_and_next_command():
    assert sorted(F.DATASETS) == ["2wiki_dev", "hotpotqa_dev_distractor", "hotpotqa_train", "locomo", "longmemeval_m",
                                  "longmemeval_oracle", "longmemeval_s", "squad_v2_dev", "tiny_shakespeare"]
    for name, pin in F.DATASETS.items():
        assert pin.url.startswith(("http://", "https://")), name
        assert len(pin.sha256) == 64 and int(pin.sha256, 16) >= 0 and pin.size > 0, name
        assert pin.license and pin.about and "{path}" in pin.next_command, name
        assert bool(pin.member) == bool(pin.member_sha256) == bool(pin.member_size), name
    assert F.DATASETS["2wiki_dev"].target_name() == "2wikimultihopqa_dev.json"
    assert F.DATASETS["hotpotqa_dev_distractor"].target_name() == "hotpot_dev_distractor_v1.json"


def test_fetched_path_names_the_fetch_command_until_the_file_is_there(server, cache, monkeypatch):
    monkeypatch.setitem(F.DATASETS, "hotpotqa_dev_distractor", _pin(server.url + "/data.json"))
    target = cache / "data" / "hotpotqa_dev_distractor" / "data.json"
    with pytest.raises(UserError) as e:
        F.fetched_path("hotpotqa_dev_distractor")
    assert str(e.value) == (f"hotpotqa_dev_distractor has not been fetched ({target} is missing); run "
                            "`memrl data fetch hotpotqa_dev_distractor`")
    assert F.fetch_dataset("hotpotqa_dev_distractor", quiet=True) == (target, True)
    assert F.fetched_path("hotpotqa_dev_distractor") == target


def test_a_second_process_waits_for_the_first_and_finds_the_file_done(server, tmp_path, capsys):
    import fcntl
    import os

    dest = tmp_path / "data.json"
    fd = os.open(tmp_path / "data.json.partial.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # "the first process", downloading
    result: list = []
    t = threading.Thread(target=lambda: result.append(download(server.url + "/data.json", dest, SHA, len(BODY))))
    t.start()
    t.join(timeout=1.0)
    assert t.is_alive() and server.ranges == []  # waiting, not downloading
    dest.write_bytes(BODY)  # the first process finishes
    os.close(fd)
    t.join(timeout=30)
    assert result == [dest] and server.ranges == []  # found it done: nothing fetched
    assert "waiting for another process downloading data.json" in capsys.readouterr().err
