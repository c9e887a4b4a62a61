"""`memrl view`: per-call records in eval rows and training dumps, the JSON API, bad input, and the page
rendered by headless Chromium (Playwright) over scripted MemAgent / ReMemR1 evals and a MemAct-like dump."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from doubles import CharTokenizer, ScriptedEngine

from memrl.data.memagent_files import write_eval_json
from memrl.engines import EngineConfig
from memrl.eval.runner import RESULTS_FILE, EvalConfig, evaluate
from memrl.training.config import TrainConfig
from memrl.training.monitor.dump import DUMP_FILE, TrajectoryDump, trajectory_rows
from memrl.types import Group, Segment, Task, Trajectory
from memrl.viewer.data import word_diff
from memrl.viewer.server import make_server, serve_in_thread, url_of

DOCS = ["The tower is tall.", "It stands in Paris.", "Nothing here."]
CHUNK = 40  # CharTokenizer: one token per character, so each document is exactly one chunk


def _tasks() -> list[Task]:
    ctx = "".join(d.ljust(CHUNK) for d in DOCS)
    out = [Task("q0", "Where is the Eiffel Tower?", ctx, ["Paris"], meta={"num_docs": 3})]
    out += [Task(f"q{k}", f"Filler question {k}?", ctx, [f"zzz{k}"], meta={"num_docs": 3}) for k in range(1, 6)]
    return out


def _block(prompt: str, tag: str) -> str:
    return re.search(f"<{tag}>\\n(.*?)\\n</{tag}>", prompt, re.S).group(1)


def _memory(prompt: str) -> str:
    """q0: learn 'tall', add 'Paris', then drop it again (the answer enters and leaves the memory)."""
    if "Filler" in prompt:
        return "nothing useful"
    sec, mem = _block(prompt, "section"), _block(prompt, "memory")
    if "tall" in sec:
        return "the tower is tall"
    if "Paris" in sec:
        return mem + ", it stands in Paris"
    return mem.replace(", it stands in Paris", "") + ", nothing new"


def _memagent(prompt: str, _: int) -> str:
    if "<section>" in prompt:
        return _memory(prompt)
    return "\\boxed{Paris}" if "Paris" in _block(prompt, "memory") else "\\boxed{unknown}"


def _rememr1(prompt: str, _: int) -> str:
    """As MemAgent, but the last memory call recalls 'Paris', so the final prompt shows it again."""
    if "<section>" in prompt:
        q = "<recall>Paris</recall>" if "Nothing here" in _block(prompt, "section") else ""
        return f"<thinking>read</thinking><update>{_memory(prompt)}</update>{q}"
    return "\\boxed{Paris}" if "Paris" in _block(prompt, "recalled_memory") else "\\boxed{unknown}"


def _eval(tmp: Path, name: str, workflow: str, script) -> Path:
    f = tmp / "data" / "eval_3.json"
    if not f.exists():
        write_eval_json(f, _tasks())
    wf = {"name": workflow, "chunk_tokens": CHUNK, "max_memory_tokens": 200, "max_final_tokens": 40}
    cfg = EvalConfig(workflow=wf, engine=EngineConfig(model="scripted"), progress=False, concurrency=2, name=name)
    evaluate([str(f)], tmp / name, cfg, engine=ScriptedEngine(script))
    return tmp / name


def _memact_groups() -> tuple[list[Group], Task]:
    """A MemAct-shaped trajectory (tool calls, results, a prune, per-turn context length, an unknown key)
    and a worse sibling, with advantages as GRPO would set them."""
    tok = CharTokenizer()
    task = Task("m0", "Where is the Eiffel Tower?", "ctx", ["Paris"])

    def seg(i: int, text: str, info: dict, trained: bool = True, adv: float = 0.5) -> Segment:
        ids = tok.encode(text)
        return Segment([7] * (30 + i), ids, [-0.5] * len(ids), [int(trained)] * len(ids), step=i,
                       step_reward=0.1 * i, advantage=adv, info=info)

    good = Trajectory("m0", "m0#0", [
        seg(0, 'search("Eiffel")', {"kind": "turn", "context_tokens": 812, "scratch_note": "custom value",
                                     "tool_calls": [{"name": "search", "arguments": {"query": "Eiffel"}}],
                                     "tool_results": [{"id": "r1", "text": "It stands in Paris."}]}),
        seg(1, "prune(r1)", {"kind": "turn", "context_tokens": 455,
                             "prunes": [{"deleted_ids": ["r1"], "memory": "Eiffel Tower: in Paris"}]},
            trained=False),
        seg(2, "\\boxed{Paris}", {"kind": "final", "answer_text": "\\boxed{Paris}", "memory": "Eiffel Tower: in Paris"}),
    ], final_answer="Paris", reward=1.0, info={"memories": ["Eiffel Tower: in Paris"]})
    bad = Trajectory("m0", "m0#1", [seg(0, "\\boxed{Rome}", {"kind": "final", "answer_text": "\\boxed{Rome}"},
                                        adv=-0.5)], final_answer="Rome", reward=0.0)
    return [Group("m0", [good, bad], task)], task


def _train_dir(tmp: Path) -> Path:
    """A training run dir: the dump of one step through maybe_dump, plus metrics.jsonl."""
    groups, task = _memact_groups()
    cfg = TrainConfig()
    cfg.trainer.dump_every, cfg.trainer.dump_trajectories = 2, 4
    cfg.workflow["name"] = "memact"
    out = tmp / "train"
    out.mkdir()
    dump = TrajectoryDump(out, cfg.trainer, "memact", CharTokenizer())
    assert dump.write(1, groups) == []  # step 1: not a dump step
    assert len(dump.write(2, groups)) == 2  # step 2
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "reward/mean": r}) + "\n"
                                               for s, r in [(1, 0.25), (2, 0.5), (3, 0.75)]))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("viewer")
    return {"memagent": _eval(tmp, "memagent", "memagent", _memagent),
            "rememr1": _eval(tmp, "rememr1", "rememr1", _rememr1), "train": _train_dir(tmp), "tmp": tmp}


class Server:
    def __init__(self, dirs):
        self.srv = make_server([str(d) for d in dirs], "127.0.0.1", 0)
        serve_in_thread(self.srv)
        self.url = url_of(self.srv)

    def get(self, path: str) -> tuple[int, object]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read())

    def close(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


@pytest.fixture
def server(runs):
    s = Server([runs["memagent"], runs["rememr1"]])
    yield s
    s.close()


# ---------------------------------------------------------------- what is on disk


def _row(run: Path, task_id: str) -> dict:
    return next(r for r in map(json.loads, (run / RESULTS_FILE).read_text().splitlines()) if r["task_id"] == task_id)


def test_eval_rows_keep_each_call(runs):
    r = _row(runs["rememr1"], "q0")
    assert [s["kind"] for s in r["steps"]] == ["memory", "memory", "memory", "final"]
    s1, s2, fin = r["steps"][1], r["steps"][2], r["steps"][3]
    assert s1["info"]["chunk"] == "It stands in Paris.".ljust(CHUNK)
    assert s1["info"]["memory"] == "the tower is tall, it stands in Paris"
    assert s2["response"] == "<thinking>read</thinking><update>the tower is tall, nothing new</update><recall>Paris</recall>"
    assert s2["response_tokens"] == len(s2["response"]) + 1  # + EOS
    assert (s2["info"]["recall_query"], s2["info"]["recalled_step"]) == ("Paris", 1)
    assert s2["info"]["recalled_memory"] == "the tower is tall, it stands in Paris"
    assert fin["info"]["shown_recalled_memory"] == "the tower is tall, it stands in Paris" and r["prediction"] == "Paris"
    assert "response_text" not in s2["info"] and "answer_text" not in fin["info"]  # kept once, as `response`
    m = _row(runs["memagent"], "q0")["steps"][0]
    # the prompt is the chat-wrapped template with question, placeholder memory and the 40-char chunk
    assert m["prompt_tokens"] > CHUNK and m["response"] == "the tower is tall" and m["trained_tokens"] == 18


def test_training_dump_rows_and_size_cap(runs, tmp_path, caplog):
    lines = (runs["train"] / DUMP_FILE).read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert [(r["step"], r["trajectory_id"], r["reward"]) for r in rows] == [(2, "m0#0", 1.0), (2, "m0#1", 0.0)]
    assert rows[0]["question"] == "Where is the Eiffel Tower?" and rows[0]["group_rewards"] == [1.0, 0.0]
    s = rows[0]["steps"]
    assert [x["trained_tokens"] for x in s] == [16, 0, 13] and [x["advantage"] for x in s] == [0.5, 0.5, 0.5]
    assert s[0]["response"] == 'search("Eiffel")' and s[1]["info"]["prunes"][0]["deleted_ids"] == ["r1"]
    assert s[2]["step_reward"] == pytest.approx(0.2) and rows[0]["workflow"] == "memact"
    # whole groups only, at least one: a limit of 1 still gives the first group whole
    groups, task = _memact_groups()
    assert len(trajectory_rows(5, groups + groups, 1, "x")) == 2
    # the cap: once the file is as big as dump_max_mb, nothing more is written (one warning)
    cfg = TrainConfig()
    cfg.trainer.dump_every, cfg.trainer.dump_max_mb = 1, 1e-6
    dump = TrajectoryDump(tmp_path, cfg.trainer, "x")
    assert len(dump.write(1, groups)) == 2
    size = (tmp_path / DUMP_FILE).stat().st_size
    assert dump.write(2, groups) == [] and dump.write(3, groups) == []
    assert (tmp_path / DUMP_FILE).stat().st_size == size
    assert sum("dump_max_mb" in r.message for r in caplog.records) == 1


def test_word_diff():
    assert word_diff("the tower is tall", "the tower is tall, it stands in Paris") == [
        ["=", "the tower is tall"], ["+", ", it stands in Paris"]]
    assert word_diff("the tower is tall, it stands in Paris", "the tower is tall, nothing new") == [
        ["=", "the tower is tall, "], ["-", "it stands in Paris"], ["+", "nothing new"]]
    assert word_diff("", "a b") == [["+", "a b"]] and word_diff("x", "x") == [["=", "x"]]


# ---------------------------------------------------------------- the JSON API


def test_question_list_pages_and_filters(server):
    assert server.get("api/runs")[1] == [
        {"id": 0, "name": "memagent", "kind": "eval", "path": server.srv.RequestHandlerClass.runs[0].path.as_posix()},
        {"id": 1, "name": "rememr1", "kind": "eval", "path": server.srv.RequestHandlerClass.runs[1].path.as_posix()}]
    st, p1 = server.get("api/runs/0/questions?limit=4")
    st2, p2 = server.get("api/runs/0/questions?limit=4&offset=4")
    assert st == st2 == 200 and p1["total"] == p2["total"] == 6
    assert len(p1["items"]) == 4 and len(p2["items"]) == 2
    assert sorted(i["task_id"] for i in p1["items"] + p2["items"]) == [f"q{k}" for k in range(6)]
    assert p1["lengths"] == [3] and p1["workflows"] == ["memagent"]
    assert server.get("api/runs/0/questions?correct=correct")[1]["total"] == 0  # MemAgent dropped Paris
    ok = server.get("api/runs/1/questions?correct=correct")[1]
    assert [i["key"] for i in ok["items"]] == ["3/q0"]  # ReMemR1 recalled it
    assert server.get("api/runs/1/questions?correct=wrong")[1]["total"] == 5
    assert [i["task_id"] for i in server.get("api/runs/0/questions?q=EIFFEL")[1]["items"]] == ["q0"]
    assert server.get("api/runs/0/questions?length=3")[1]["total"] == 6
    assert server.get("api/runs/0/questions?length=4")[1]["total"] == 0
    assert server.get("api/runs/0/questions?workflow=rememr1")[1]["total"] == 0
    summ = server.get("api/runs/1/summary")[1]
    assert summ["accuracy_by_length"] == [{"length": 3, "questions": 6, "accuracy": pytest.approx(100 / 6)}]


def test_trajectory_diff_gold_and_chunk(server):
    idx = server.get("api/runs/0/find?key=3/q0")[1]["idx"]
    st, row = server.get(f"api/runs/0/rows/{idx}")
    assert st == 200 and row["key"] == "3/q0" and row["correct"] is False
    steps = row["steps"]
    assert [s["gold_event"] for s in steps] == [None, "appeared", "left", None]
    assert [s.get("gold_in_memory") for s in steps] == [False, True, False, None]
    assert steps[1]["memory_diff"] == [["=", "the tower is tall"], ["+", ", it stands in Paris"]]
    assert "chunk" not in steps[1]["info"] and steps[1]["info"]["chunk_chars"] == CHUNK
    assert server.get(f"api/runs/0/rows/{idx}/chunk/1")[1] == {"chunk": "It stands in Paris.".ljust(CHUNK)}
    assert server.get("api/runs/1/find?key=3/nope")[1]["idx"] is None


def test_api_errors_are_json_with_a_message(server):
    assert server.get("api/runs/0/questions?length=x") == (400, {"error": "length must be an integer, got 'x'"})
    assert server.get("api/runs/0/questions?limit=0")[0] == 400
    assert server.get("api/runs/0/questions?correct=maybe")[0] == 400
    assert server.get("api/runs/0/rows/99") == (400, {"error": "memagent: no row 99 (the run has 6)"})
    assert server.get("api/runs/0/rows/0/chunk/9")[0] == 400
    assert server.get("api/runs/7/summary")[0] == 404 and "no run '7'" in server.get("api/runs/7/summary")[1]["error"]
    assert server.get("api/nothing")[0] == 404 and server.get("api/runs/0/plot.png")[0] == 404


def test_truncated_results_file_and_growth(runs, tmp_path):
    d = tmp_path / "live"
    shutil.copytree(runs["memagent"], d)
    lines = (d / RESULTS_FILE).read_text().splitlines(keepends=True)
    extra = json.loads(lines[0])
    extra["task_id"] = "q9"
    half = json.dumps(extra) + "\n"
    # a malformed line in the middle, and a killed run's half-written last line
    (d / RESULTS_FILE).write_text("".join(lines[:2]) + "{broken\n" + "".join(lines[2:]) + half[:50])
    s = Server([d])
    try:
        summ = s.get("api/runs/0/summary")[1]
        assert summ["rows"] == 6 and len(summ["warnings"]) == 2
        assert "is not a usable row" in summ["warnings"][0] and "incomplete" in summ["warnings"][1]
        assert [i["task_id"] for i in s.get("api/runs/0/questions")[1]["items"]] == [
            json.loads(x)["task_id"] for x in lines]
        with open(d / RESULTS_FILE, "a") as f:  # the run goes on: the line completes
            f.write(half[50:])
        assert s.get("api/runs/0/questions")[1]["total"] == 7
        assert s.get("api/runs/0/rows/6")[1]["task_id"] == "q9"
    finally:
        s.close()


def test_rows_with_unusable_fields_are_counted_not_scored(runs, tmp_path):
    """A row that parses but whose score or length is missing or not a number is skipped, counted and
    named; it never counts as a wrong answer (it used to score 0 silently)."""
    d = tmp_path / "odd"
    shutil.copytree(runs["memagent"], d)
    lines = (d / RESULTS_FILE).read_text().splitlines(keepends=True)
    bad_score, no_len = json.loads(lines[0]), json.loads(lines[1])
    bad_score["task_id"], bad_score["sub_em"] = "x1", "1.0"
    no_len["task_id"] = "x2"
    del no_len["num_docs"]
    (d / RESULTS_FILE).write_text("".join(lines) + json.dumps(bad_score) + "\n" + json.dumps(no_len) + "\n")
    s = Server([d])
    try:
        summ = s.get("api/runs/0/summary")[1]
        assert (summ["rows"], summ["skipped_rows"]) == (6, 2)
        assert "'sub_em' must be a number, got '1.0'" in summ["warnings"][0]
        assert "it has no 'num_docs'" in summ["warnings"][1]
        assert summ["accuracy_by_length"] == s.get("api/runs/0/summary")[1]["accuracy_by_length"]
        assert sum(a["questions"] for a in summ["accuracy_by_length"]) == 6
    finally:
        s.close()


def test_host_header_must_name_the_viewer(runs):
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 sends its own Host; it is refused."""
    import http.client

    s = Server([runs["memagent"]])
    port = s.srv.server_address[1]
    try:
        for host, status in [("evil.example", 403), (f"evil.example:{port}", 403), (f"127.0.0.1:{port}", 200),
                             (f"localhost:{port}", 200), ("localhost", 200), ("", 403)]:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.putrequest("GET", "/api/runs", skip_host=True)
            if host:
                c.putheader("Host", host)
            c.endheaders()
            r = c.getresponse()
            body = json.loads(r.read())
            c.close()
            assert r.status == status, host
            if status == 403:
                assert body == {"error": f"Host {host!r} is not this viewer's address"}
    finally:
        s.close()
    from memrl.viewer.server import allowed_hosts

    assert allowed_hosts("0.0.0.0", 80) is None  # listening everywhere was asked for: any name
    assert allowed_hosts("10.1.2.3", 8) == {"10.1.2.3", "10.1.2.3:8"}
    assert allowed_hosts("127.0.0.1", 8, ["view.lab"]) == {
        "127.0.0.1", "localhost", "[::1]", "view.lab", "127.0.0.1:8", "localhost:8", "[::1]:8", "view.lab:8"}


def test_500_simultaneous_connections_are_all_answered(runs):
    """500 clients connect at once before the server reads any request: all are queued (listen backlog)
    and answered by the bounded pool within 30 s. With the standard library's backlog of 5 the kernel
    dropped the handshakes it could not queue and clients waited on retransmits: 60+ s for the 500."""
    import time

    s = Server([runs["memagent"]])
    port = s.srv.server_address[1]
    socks, deadline = [], time.monotonic() + 30
    try:
        for _ in range(500):
            c = socket.create_connection(("127.0.0.1", port), timeout=max(0.01, deadline - time.monotonic()))
            c.sendall(f"GET /api/runs/0/summary HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            socks.append(c)
        answered = 0
        for c in socks:
            data = b""
            c.settimeout(max(0.01, deadline - time.monotonic()))
            while chunk := c.recv(65536):
                data += chunk
            answered += data.startswith(b"HTTP/1.0 200") and b'"rows": 6' in data
        assert answered == 500
    finally:
        for c in socks:
            c.close()
        s.close()


def test_bad_run_dirs_and_port_in_use(runs, tmp_path, capsys):
    from memrl.cli import main

    assert main(["view", str(tmp_path / "missing")]) == 1
    assert capsys.readouterr().err.strip() == f"memrl view: error: run directory {tmp_path / 'missing'} does not exist"
    (tmp_path / "empty").mkdir()
    assert main(["view", str(tmp_path / "empty")]) == 1
    assert "holds no results.jsonl, trajectories.jsonl or metrics.jsonl" in capsys.readouterr().err
    assert main(["view", str(runs["memagent"]), str(runs["rememr1"]), str(runs["train"])]) == 2  # a usage error
    assert "give one or two run directories, got 3" in capsys.readouterr().err
    (tmp_path / "file").write_text("x")
    assert main(["view", str(tmp_path / "file")]) == 1
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "fresh").mkdir()
    (tmp_path / "fresh" / RESULTS_FILE).write_text("")  # an eval that has not finished a question yet
    s = Server([tmp_path / "fresh"])
    try:
        assert s.get("api/runs/0/summary")[1]["rows"] == 0
        assert s.get("api/runs/0/questions")[1]["items"] == []
    finally:
        s.close()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["view", str(runs["memagent"]), "--port", str(port)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"memrl view: error: port {port} on 127.0.0.1 is already in use; pass another --port (0 = any free)"]
    assert main(["view", str(runs["memagent"]), "--port", "70000"]) == 2  # the option's range (bounded), one line
    assert capsys.readouterr().err == "memrl view: error: argument --port: 70000 is not allowed: must be in [0, 65535]\n"


def test_training_run_api(runs):
    s = Server([runs["train"]])
    try:
        summ = s.get("api/runs/0/summary")[1]
        assert summ["kind"] == "train" and summ["metric_names"] == ["reward/mean"] and summ["rows"] == 2
        assert summ["workflow"] == "memact"
        assert s.get("api/runs/0/metrics?names=reward/mean")[1] == {"reward/mean": [[1, 0.25], [2, 0.5], [3, 0.75]]}
        q = s.get("api/runs/0/questions")[1]
        assert [(i["key"], i["correct"], i["workflow"]) for i in q["items"]] == [
            ("2/m0#0", True, "memact"), ("2/m0#1", False, "memact")]
    finally:
        s.close()


@pytest.mark.slow
def test_real_training_dumps_every_k_steps(tmp_path):
    """The trainer hook on the tiny model: 2 steps, dump_every=2 -> one dump of one whole group (n=3)."""
    from memrl.config import load_config
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    cfg = load_config(TrainConfig, [
        f"model.path={cached_tiny_model('tiny')}", f"out_dir={tmp_path / 'run'}", "trainer.steps=2",
        "workflow=memagent", "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6",
        "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=1", "algorithm.n=3", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.tensorboard=false", "trainer.dump_every=2", "trainer.dump_trajectories=3",
        "trainer.save_every=0"])
    Trainer(assemble(cfg)).fit()
    rows = [json.loads(x) for x in (tmp_path / "run" / DUMP_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [2, 2, 2] and len({r["task_id"] for r in rows}) == 1
    assert all(r["question"] and r["answers"] and r["workflow"] == "memagent" for r in rows)
    for r in rows:
        assert len(r["steps"]) == r["metrics"]["num_chunks"] + 1
        assert all(s["advantage"] is not None and s["step_reward"] is not None for s in r["steps"])
        assert r["steps"][0]["info"]["chunk"] and r["steps"][-1]["kind"] == "final"
    assert [r["reward"] for r in rows] == rows[0]["group_rewards"]
    s = Server([tmp_path / "run"])
    try:
        assert s.get("api/runs/0/questions")[1]["total"] == 3
        assert "reward/mean" in s.get("api/runs/0/summary")[1]["metric_names"]
    finally:
        s.close()


# ---------------------------------------------------------------- the page in a real browser


def _browser():
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install -y chromium; .ci/run installs it)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed (pip install playwright; it is in the dev extra)")
    return chromium, sync_playwright


def test_page_in_headless_chromium(runs):
    chromium, sync_playwright = _browser()
    shots = runs["tmp"] / "screenshots"
    shots.mkdir(exist_ok=True)
    s = Server([runs["memagent"], runs["rememr1"]])
    t = Server([runs["train"]])
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(s.url)
            page.wait_for_selector(".q")
            assert page.locator(".q").count() == 6 and page.inner_text("#range") == "1–6 of 6"
            assert page.locator("svg.acc circle").count() == 1  # accuracy by length: one length
            page.fill("#q", "eiffel")
            page.wait_for_function("document.querySelectorAll('.q').length === 1")
            page.click(".q")
            page.wait_for_selector("#side-by-side .col[data-run='1'] .step")
            left, right = page.locator(".col[data-run='0']"), page.locator(".col[data-run='1']")
            assert left.locator("h2").inner_text() == "memagent" and right.locator("h2").inner_text() == "rememr1"
            mems = [m.inner_text() for m in left.locator(".step:not(.final) > .memory").all()]
            assert mems == ["No previous memorythe tower is tall", "the tower is tall, it stands in Paris",
                            "the tower is tall, it stands in Parisnothing new"]  # deleted + inserted text
            assert left.locator("[data-step='1'] ins.add").inner_text() == ", it stands in Paris"
            assert left.locator("[data-step='2'] del.del").inner_text() == "it stands in Paris"
            assert left.locator("[data-step='1'] mark.goldword").inner_text() == "Paris"
            assert left.locator(".badge.gold-appeared").count() == 1 and left.locator(".badge.gold-left").count() == 1
            assert right.locator(".recall").inner_text().count("query: Paris") == 1
            assert right.locator(".recall").inner_text().endswith(
                "memory of step 1 (score 0.407): the tower is tall, it stands in Paris")
            assert left.locator(".qhead .bad").inner_text() == "unknown" and right.locator(".qhead .ok").inner_text() == "Paris"
            # chunks are collapsed and fetched on expand
            chunk = left.locator("[data-step='1'] details.chunk")
            assert not chunk.locator("pre").is_visible()
            chunk.locator("summary").click()
            page.wait_for_function("document.querySelector(\"[data-step='1'] details.chunk pre\").textContent.startsWith('It stands')")
            page.screenshot(path=str(shots / "side_by_side.png"), full_page=False)
            # filters: correct-only on run B lists only q0
            page.click("#run-1")
            page.select_option("#correct", "correct")
            page.fill("#q", "")
            page.wait_for_function("document.querySelectorAll('.q').length === 1 && document.querySelector('#range').textContent === '1–1 of 1'")
            # an API error is shown in the page, not a blank or broken page
            page.goto(s.url + "#run=0&idx=99")
            page.wait_for_selector("main .error")
            assert page.inner_text("main .error") == "memagent: no row 99 (the run has 6)"
            # a training dump: tool calls, results, prunes, context per turn, advantages, unknown keys
            page.goto(t.url + "#run=0&idx=0")
            page.wait_for_selector(".step .tool_calls")
            col = page.locator(".col[data-run='0']")
            assert '"query": "Eiffel"' in col.locator(".tool_calls").inner_text()
            assert "It stands in Paris." in col.locator(".tool_results").inner_text()
            prune = col.locator(".prunes").inner_text()
            assert '"r1"' in prune and "Eiffel Tower: in Paris" in prune
            assert col.locator("[data-step='0'] .head").inner_text().split("\n")[:2] == ["turn 0", "ctx 812 tok"]
            assert "advantage 0.5" in col.locator("[data-step='1'] .head").inner_text()
            assert col.locator("[data-step='1'] .badge.untrained").count() == 1
            assert col.locator("[data-step='0'] .kv").inner_text() == "scratch_note: custom value"
            assert page.locator("#curve svg circle").count() == 3
            page.screenshot(path=str(shots / "training.png"))
            assert errors == []
            browser.close()
    finally:
        s.close()
        t.close()
    assert (shots / "side_by_side.png").stat().st_size > 10_000
    if os.environ.get("MEMRL_VIEWER_SCREENSHOT"):  # how docs/img/viewer.png is made
        shutil.copyfile(shots / "side_by_side.png", os.environ["MEMRL_VIEWER_SCREENSHOT"])


def test_validation_curves_in_headless_chromium(runs, tmp_path):
    """A training run that validated (trainer.val_every, val.before_train): its metrics.jsonl holds
    val/<dataset>/<N>/<metric> on the steps that validated only (step 0 = before training), as
    memrl.training.step.validation logs them; the page's metric picker lists them and draws just those points."""
    chromium, sync_playwright = _browser()
    d = tmp_path / "validated"
    shutil.copytree(runs["train"], d)
    rows = [{"step": 0, "val/hotpotqa/50/accuracy": 25.0, "val/mean_accuracy": 25.0},
            {"step": 1, "reward/mean": 0.25},
            {"step": 2, "reward/mean": 0.5, "val/hotpotqa/50/accuracy": 75.0, "val/mean_accuracy": 75.0},
            {"step": 3, "reward/mean": 0.75}]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    s = Server([d])
    try:
        names = s.get("api/runs/0/summary")[1]["metric_names"]
        assert names == ["reward/mean", "val/hotpotqa/50/accuracy", "val/mean_accuracy"]
        assert s.get("api/runs/0/metrics?names=val/hotpotqa/50/accuracy")[1] == {
            "val/hotpotqa/50/accuracy": [[0.0, 25.0], [2.0, 75.0]]}
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1200, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(s.url + "#run=0&idx=0")
            page.wait_for_selector("#metric")
            assert [o.inner_text() for o in page.locator("#metric option").all()] == names
            page.wait_for_function("document.querySelectorAll('#curve svg circle').length === 3")  # reward/mean
            page.select_option("#metric", "val/hotpotqa/50/accuracy")
            page.wait_for_function("document.querySelectorAll('#curve svg circle').length === 2")
            page.screenshot(path=str(tmp_path / "validation.png"))
            assert errors == []
            browser.close()
    finally:
        s.close()
