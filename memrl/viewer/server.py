"""The viewer's HTTP server (standard library only): static page + a JSON API over one or two runs.

    GET /                                   the page (memrl/viewer/static)
    GET /api/runs                           [{id, name, kind, path}]
    GET /api/runs/{r}/summary               accuracy by length, metric names, warnings
    GET /api/runs/{r}/questions?offset=&limit=&correct=&length=&workflow=&q=
    GET /api/runs/{r}/rows/{i}              one trajectory (chunks left out)
    GET /api/runs/{r}/rows/{i}/chunk/{j}    the chunk text of step j
    GET /api/runs/{r}/find?key=K            {idx} of the row with key K (num_docs/task_id or step/trajectory)
    GET /api/runs/{r}/metrics?names=a,b     training curves
    GET /api/runs/{r}/plot.png              the eval report's accuracy.png
Errors are JSON {"error": message} with a 4xx/5xx status; the page shows the message.

A request whose Host header names another host is refused (403): a page on another site that rebinds
its DNS name to 127.0.0.1 cannot read runs. Each connection gets a thread of a large pool behind a deep
listen backlog, so a burst of connections waits its turn instead of being dropped, and a connection's time
is bounded (IDLE_TIMEOUT_S without a byte, CONNECTION_DEADLINE_S in all): idle or slow clients are cut off
and never hold the threads the next visitor needs.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import json
import logging
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from memrl.viewer.data import Run, ViewerError

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
FILES = {"/": ("index.html", "text/html; charset=utf-8"),
         "/static/app.js": ("app.js", "text/javascript; charset=utf-8"),
         "/static/style.css": ("style.css", "text/css; charset=utf-8")}
MAX_LIMIT = 500
MAX_CONNECTIONS = 1024
"""Connections served at once, each in a thread of its own (made on demand): a client that connects and
sends nothing, or sends slowly, holds one of these until its time is up, not one of a few."""
BACKLOG = 1024
"""Connections the kernel queues before the pool takes them (the standard library's default is 5)."""
IDLE_TIMEOUT_S = 10.0
"""A connection that sends (or accepts) no byte for this long is closed."""
CONNECTION_DEADLINE_S = 30.0
"""A connection is closed this long after it was accepted, whatever it is doing (a client that sends its
request a byte at a time never reaches the idle timeout)."""
REAP_EVERY_S = 0.25


class PooledHTTPServer(HTTPServer):
    """An HTTPServer that hands each connection to a thread of a pool of up to MAX_CONNECTIONS, and closes a
    connection that stays idle for IDLE_TIMEOUT_S or open for CONNECTION_DEADLINE_S (a reaper thread)."""

    request_queue_size = BACKLOG
    allowed_hosts: frozenset[str] | None = None
    """Host header values accepted (None = any: the server listens on every interface)."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler],
                 threads: int = MAX_CONNECTIONS) -> None:
        # before binding: a failed bind calls server_close(), which shuts the pool down
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="memrl-view")
        self._open: dict[Any, float] = {}  # connection -> when it must be closed
        self._open_lock = threading.Lock()
        self._stop = threading.Event()
        super().__init__(address, handler)
        threading.Thread(target=self._reap, name="memrl-view-reaper", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(IDLE_TIMEOUT_S)
        with self._open_lock:
            self._open[request] = time.monotonic() + CONNECTION_DEADLINE_S
        self._pool.submit(self._handle, request, client_address)

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except OSError:  # the client went away, or its time ran out (the reaper shut its socket)
            pass
        except Exception:  # noqa: BLE001 - the same as socketserver's handle_error
            self.handle_error(request, client_address)
        finally:
            with self._open_lock:
                self._open.pop(request, None)
            self.shutdown_request(request)

    def _reap(self) -> None:
        """Shut down the connections past their deadline: a blocked read or write in their thread returns."""
        while not self._stop.wait(REAP_EVERY_S):
            now = time.monotonic()
            with self._open_lock:
                late = [r for r, t in self._open.items() if t <= now]
            for r in late:
                with contextlib.suppress(OSError):
                    r.shutdown(socket.SHUT_RDWR)

    def server_close(self) -> None:
        super().server_close()
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)


def allowed_hosts(host: str, port: int, extra: Iterable[str] = ()) -> frozenset[str] | None:
    """Host header values a server bound to host:port answers: the bound address and, on loopback,
    localhost's names, each with and without the port. None for a wildcard bind (0.0.0.0, ::)."""
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
    if ip is not None and ip.is_unspecified:
        return None
    names = {host.lower()}
    if ip is not None and ip.version == 6:
        names.add(f"[{host.strip('[]').lower()}]")
    if host.lower() == "localhost" or (ip is not None and ip.is_loopback):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    names |= {h.lower() for h in extra}
    raw_v6 = {n for n in names if ":" in n and not n.startswith("[")}  # "::1" takes no ":port" suffix
    return frozenset(names | {f"{n}:{port}" for n in names - raw_v6})


class NotFound(ViewerError):
    pass


def _int(qs: dict[str, list[str]], name: str, default: int, lo: int = 0, hi: int | None = None) -> int:
    raw = qs.get(name, [str(default)])[0]
    try:
        v = int(raw)
    except ValueError as e:
        raise ViewerError(f"query parameter {name} must be an integer, got {raw!r}") from e
    if v < lo or (hi is not None and v > hi):
        raise ViewerError(f"query parameter {name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {v}")
    return v


class Handler(BaseHTTPRequestHandler):
    runs: list[Run] = []
    server_version = "memrl-view"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        log.debug("%s " + format, self.address_string(), *args)

    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        url = urlsplit(self.path)
        allowed = getattr(self.server, "allowed_hosts", None)
        host = (self.headers.get("Host") or "").strip().lower()
        if allowed is not None and host not in allowed:
            log.warning("view: refused a request for Host %r (serving %s)", host, ", ".join(sorted(allowed)))
            self._json(HTTPStatus.FORBIDDEN, {"error": f"Host {host!r} is not this viewer's address"})
            return
        try:
            if url.path in FILES:
                name, ctype = FILES[url.path]
                self._send(HTTPStatus.OK, (STATIC / name).read_bytes(), ctype)
                return
            if not url.path.startswith("/api/"):
                raise NotFound(f"no page {url.path}")
            body = self._api(url.path[len("/api/"):].strip("/").split("/"), parse_qs(url.query))
            if isinstance(body, bytes):
                self._send(HTTPStatus.OK, body, "image/png")
            else:
                self._json(HTTPStatus.OK, body)
        except NotFound as e:
            self._json(HTTPStatus.NOT_FOUND, {"error": str(e)})
        except (ViewerError, FileNotFoundError) as e:
            self._json(HTTPStatus.BAD_REQUEST, {"error": str(e)})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:  # noqa: BLE001 - one bad request must not stop the server
            log.exception("GET %s failed", self.path)
            self._json(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{self.path}: {type(e).__name__}: {e}"})

    def _api(self, parts: list[str], qs: dict[str, list[str]]) -> Any:
        if parts == ["runs"]:
            return [{"id": i, "name": r.name, "kind": r.kind, "path": str(r.path)} for i, r in enumerate(self.runs)]
        if len(parts) < 3 or parts[0] != "runs":
            raise NotFound(f"no endpoint /api/{'/'.join(parts)}")
        try:
            run = self.runs[int(parts[1])]
        except (ValueError, IndexError) as e:
            raise NotFound(f"no run {parts[1]!r} (runs: 0..{len(self.runs) - 1})") from e
        what, rest = parts[2], parts[3:]
        if what == "summary" and not rest:
            return run.summary()
        if what == "questions" and not rest:
            return run.questions(
                offset=_int(qs, "offset", 0), limit=_int(qs, "limit", 50, 1, MAX_LIMIT),
                correct=qs.get("correct", [""])[0], length=qs.get("length", [""])[0],
                workflow=qs.get("workflow", [""])[0], q=qs.get("q", [""])[0])
        if what == "rows" and len(rest) in (1, 3):
            idx = _row_index(rest[0])
            if len(rest) == 1:
                return run.row(idx)
            if rest[1] == "chunk":
                return {"chunk": run.chunk(idx, _row_index(rest[2]))}
        if what == "find" and not rest:
            key = unquote(qs.get("key", [""])[0])
            return {"idx": run.find(key), "key": key}
        if what == "metrics" and not rest:
            names = [n for n in qs.get("names", [""])[0].split(",") if n]
            return run.metrics(names)
        if what == "plot.png" and not rest:
            p = run.path / "accuracy.png"
            if not p.exists():
                raise NotFound(f"{p} does not exist")
            return p.read_bytes()
        raise NotFound(f"no endpoint /api/{'/'.join(parts)}")

    def _send(self, status: HTTPStatus, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: HTTPStatus, obj: Any) -> None:
        self._send(status, json.dumps(obj, ensure_ascii=False, allow_nan=False).encode(), "application/json")


def _row_index(raw: str) -> int:
    try:
        return int(raw)
    except ValueError as e:
        raise ViewerError(f"row/step index must be an integer, got {raw!r}") from e


def make_server(run_dirs: Sequence[str | Path], host: str = "127.0.0.1", port: int = 8765,
                extra_hosts: Iterable[str] = ()) -> PooledHTTPServer:
    """A bound (not yet serving) server over the runs; clear errors for bad dirs and a port in use.
    `extra_hosts`: further Host header values to answer (a name a proxy forwards under)."""
    if not run_dirs:
        raise ViewerError("view: give one or two run directories")
    runs = [Run.open(d) for d in run_dirs]
    handler = type("RunHandler", (Handler,), {"runs": runs})
    try:
        server = PooledHTTPServer((host, port), handler)
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            raise ViewerError(f"port {port} on {host} is already in use; pass another --port (0 = any free)") from e
        raise ViewerError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    server.allowed_hosts = allowed_hosts(host, server.server_address[1], extra_hosts)
    return server


def serve_in_thread(server: PooledHTTPServer) -> threading.Thread:
    """Serve in a daemon thread (tests, notebooks); stop with server.shutdown(); server.server_close()."""
    t = threading.Thread(target=server.serve_forever, name="memrl-view", daemon=True)
    t.start()
    return t


def url_of(server: PooledHTTPServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host}:{port}/"
