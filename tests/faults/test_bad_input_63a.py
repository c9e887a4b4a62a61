"""Issue 63 (items 1-11): settings that were silently ignored, contradictions found late, values with no upper
bound. Each probe is refused before any work in one line naming the field, file or endpoint (exit 2 for a
command-line value, 1 otherwise), or the run says which setting won. The huge-value items (1, 9) are pinned
with the range walk in tests/unit/test_config_ranges.py, the seed sweep's (8) in tests/unit/test_demo_seeds.py."""

from __future__ import annotations

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig


def _fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


def _validate(*overrides: str):
    return validate(load_config(TrainConfig, ["model.path=unused", *overrides]))


# ------------------------------------------------------- item 4: foldgrpo on a workflow without branches


@pytest.mark.parametrize("workflow", ["memagent", "mem1", "memact", "summarize"])
def test_foldgrpo_on_a_workflow_without_branches_is_refused_before_any_work(workflow, tmp_path, capsys):
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
                   f"workflow={workflow}", "algorithm.name=foldgrpo"], capsys)
    assert line == (f"memrl train: error: algorithm.name=foldgrpo on workflow={workflow}: its process rewards "
                    "(unfolded, scope, failure) read the branches workflow=fold records, and this workflow records "
                    "none, so it would train as plain GRPO; use workflow=fold or algorithm.name=grpo")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_foldgrpo_runs_where_its_terms_mean_something():
    assert _validate("workflow=fold", "algorithm.name=foldgrpo")[0].name == "fold"
    # no process rewards: FoldGRPO's GRPO over threads, asked for by name
    assert _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[]")
    # a process reward of the user's own may read any workflow's rows
    from memrl.algorithms.process_rewards import PROCESS_REWARDS, register_process_reward

    register_process_reward("mine")(lambda traj, seg, opts: [0.0] * len(seg.response_ids))
    try:
        assert _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[mine]")
        with pytest.raises(ConfigError, match=r"^algorithm.name=foldgrpo on workflow=memagent: its process rewards "
                                              r"\(scope\) read"):
            _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[scope]")
    finally:
        del PROCESS_REWARDS["mine"]


# ------------------------------------ item 7: a context budget below the first prompt (fold, summarize, window)


@pytest.mark.parametrize("member", ["fold", "summarize", "sliding_window"])
def test_a_first_prompt_over_the_context_budget_is_said_not_a_silent_empty_run(member, caplog):
    """Before: 0 tokens generated, stop context_budget, exit 0 and not a word."""
    import asyncio
    import logging
    import random

    from doubles import CharTokenizer, ScriptedEngine

    from memrl.tools.calls import tools_fallback_text
    from memrl.types import Task
    from memrl.workflows import get_workflow, parse_workflow

    tok = CharTokenizer()
    _, cfg = parse_workflow({"name": member, "max_context_tokens": 10, "system_template": "S",
                                "user_template": "{question}|{answer_format}", "retriever_scope": "task"})
    engine = ScriptedEngine(["FINAL_ANSWER: Paris"])
    with caplog.at_level(logging.WARNING, logger="memrl.workflows.search_agent"):
        traj = asyncio.run(get_workflow(member).run(Task("t1", "Q", "", ["Paris"], {"documents": ["Paris is the capital of France."]}), engine, cfg, random.Random(0)))
    assert engine.calls == [] and traj.info["stop"] == "context_budget" and traj.metrics["turns"] == 0.0
    first = [r.getMessage() for r in caplog.records if r.name == "memrl.workflows.search_agent"]
    assert len(first) == 1
    # the prompt: system (S + the tools' fallback text) + user (question | answer format), then the header
    from memrl.tools.search import SEARCH_SCHEMA

    schemas = [SEARCH_SCHEMA]
    if member == "fold":
        from memrl.workflows.fold import BRANCH_SCHEMA, RETURN_SCHEMA

        schemas += [BRANCH_SCHEMA, RETURN_SCHEMA]
    fmt = "End with one line: FINAL_ANSWER: <short answer>."
    n = len(tok.encode("<system>S" + tools_fallback_text(schemas) + f"</system><user>Q|{fmt}</user>")) + \
        len(tok.encode("<assistant>"))
    assert first == [f"task t1: the first prompt ({n} tokens) is over workflow.max_context_tokens=10: no turn was "
                     "sampled"]
    caplog.clear()
    _, cfg = parse_workflow({"name": member, "max_context_tokens": 100_000, "system_template": "S",
                             "user_template": "{question}|{answer_format}", "retriever_scope": "task"})
    with caplog.at_level(logging.WARNING, logger="memrl.workflows.search_agent"):
        traj = asyncio.run(get_workflow(member).run(Task("t1", "Q", "", ["Paris"], {"documents": ["Paris."]}),
                                                    ScriptedEngine(["FINAL_ANSWER: Paris"]), cfg, random.Random(0)))
    assert traj.info["stop"] == "answer" and not caplog.records


# -------------------------------------------- item 2: a template given twice; a template file that is not text


def test_a_template_file_beside_a_presets_inline_template_is_refused_not_ignored(tmp_path, capsys):
    mine = tmp_path / "system.txt"
    mine.write_text("My own system prompt.")
    argv = ["train", "--preset", "context_cpu", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
            f"data.path={tmp_path / 'tasks.jsonl'}", f"workflow.system_template_file={mine}"]
    assert _fails(argv, capsys) == (
        f"memrl train: error: workflow.system_template_file={mine} and workflow.system_template are both set (a "
        "preset may set the inline one): keep one; add workflow.system_template=null to use the file")
    # the way out the message names: the file is what the run reads
    from memrl.workflows import parse_workflow

    _, wf = parse_workflow({"name": "fold", "system_template": None, "system_template_file": str(mine)})
    assert (wf.system_template, wf.system_template_file) == (None, str(mine))
    for preset, key in [("demo_cpu", "memory_template"), ("mem1_cpu", "prompt_template"),
                        ("memact_dcpo_cpu", "system_template")]:
        cfg = load_config(TrainConfig, ["model.path=unused", "data.path=unused.jsonl", f"workflow.{key}_file={mine}"],
                          preset=preset)
        with pytest.raises(ConfigError, match=rf"^workflow\.{key}_file=.* and workflow\.{key} are both set"):
            validate(cfg)


@pytest.mark.parametrize(("make", "said"), [
    (lambda d: "/dev/zero", "template file /dev/zero is not a regular file"),
    (lambda d: str(d), "template file {d} is not a regular file"),
    (lambda d: _write(d / "nul.txt", b"Q: {problem}\x00\x00"), "template file {d}/nul.txt is binary, not text: a NUL "
                                                                 "byte at character 12"),
    (lambda d: _write(d / "bin.txt", b"\x89PNG\r\n\x1a\n"), "template file {d}/bin.txt is not UTF-8 text: invalid "
                                                            "start byte at byte 0"),
    (lambda d: _write(d / "big.txt", b"a" * (1 << 21)), "template file {d}/big.txt holds 2,097,152 bytes, more than a "
                                                        "prompt's 1,048,576"),
])
def test_a_template_file_that_is_not_a_prompt_is_refused_in_one_line(make, said, tmp_path, capsys):
    path = make(tmp_path)
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
                   "workflow=fold", f"workflow.system_template_file={path}"], capsys)
    assert line == f"memrl train: error: workflow.system_template_file: {said.format(d=tmp_path)}"


def _write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


# ----------------------------------------------- item 6: enable_thinking on a template without a thinking switch


def test_enable_thinking_on_a_template_without_the_switch_is_refused_before_generation(tiny_model, tmp_path, capsys):
    said = (f"workflow.enable_thinking=true: the chat template of {{}} {tiny_model} has no thinking switch (it never "
            "reads enable_thinking), so the setting would do nothing; drop it or use a model whose template has one "
            "(Qwen3)")
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"task_id": "q1", "question": "Q?", "context": "Paris is in France.", "answers": ["Paris"]}\n')
    line = _fails(["eval", "--model", tiny_model, "--out", str(tmp_path / "eval"), str(tasks),
                   "workflow.enable_thinking=true"], capsys, code=1)
    assert line == "memrl eval: error: " + said.format("--model")
    assert not (tmp_path / "eval" / "results.jsonl").exists()
    line = _fails(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'train'}", "data.name=file",
                   f"data.path={tasks}", "workflow.enable_thinking=true"], capsys, code=1)
    assert line == "memrl train: error: " + said.format("model.path")


def test_enable_thinking_passes_where_the_template_reads_it(tiny_model):
    from transformers import AutoTokenizer

    from memrl.models.tiny import cached_tiny_model
    from memrl.workflows.templates import TemplateError, check_thinking_switch

    qwen3 = AutoTokenizer.from_pretrained(cached_tiny_model("tiny-qwen3"))
    check_thinking_switch(qwen3, True)
    chatml = AutoTokenizer.from_pretrained(tiny_model)
    for value in (None, False):  # unset, or off: nothing to switch on
        check_thinking_switch(chatml, value)
    with pytest.raises(TemplateError):
        check_thinking_switch(chatml, True)


# ---------------------------------------------- item 5: a dead or hanging judge, said while the run goes on


def _judge_all(url: str, n: int, **kw):
    import asyncio

    from memrl.rewards.judge import JudgeClient, JudgeSettings

    async def go():
        client = JudgeClient(JudgeSettings(url=url, model="m", retries=0, backoff_s=0.01, **kw))
        try:
            return [await client.judge("Q?", ["Paris"], "Paris") for _ in range(n)], client
        finally:
            await client.close()

    return asyncio.run(go())


def test_a_dead_judge_is_said_on_the_console_with_its_first_error_and_counted(caplog):
    """Before: every reward 0 and not a console line (only metrics.jsonl's judge_error counted it)."""
    import logging
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    with caplog.at_level(logging.WARNING, logger="memrl.rewards.judge"):
        results, client = _judge_all(f"http://127.0.0.1:{port}/v1", 12, timeout_s=2)
    assert [r.score for r in results] == [0.0] * 12 and client.counters["judge_error"] == 12
    said = [r.getMessage() for r in caplog.records]
    first = f"http_error: {url}: ConnectError: All connection attempts failed"
    assert client.first_error == first
    assert said == [f"judge {url} failed ({first}); the judgement scores 0 and the run goes on (judge_error counts "
                    "failures)",
                    f"judge {url}: 10 judgements failed so far, each scored 0 (first: {first})"]


def test_a_judge_that_trickles_its_reply_is_cut_at_timeout_s():
    """httpx's timeout bounds each read: a server sending a byte every 0.1 s held a judgement for as long as
    it liked. Now the whole call is bounded by timeout_s."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            try:
                for _ in range(100):
                    self.wfile.write(b" ")
                    self.wfile.flush()
                    time.sleep(0.1)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    try:
        t0 = time.monotonic()
        [r], client = _judge_all(f"http://127.0.0.1:{httpd.server_address[1]}/v1", 1, timeout_s=0.5)
        took = time.monotonic() - t0
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (r.score, r.error) == (0.0, "timeout") and took < 3.0, took


# --------------------------------------------------------- item 11: an mlflow tracking server that is not there


def test_a_dead_mlflow_server_is_one_line_within_seconds(tiny_model, tmp_path, capsys):
    """Before: `trainer.mlflow_uri=http://127.0.0.1:9` sat silent for minutes (mlflow's client retries with
    back-off), after the model had loaded."""
    import socket
    import time

    import train_child  # noqa: F401 - registers memagent_parity
    from conftest import train_overrides

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"http://127.0.0.1:{port}"
    t0 = time.monotonic()
    line = _fails(["train", *train_overrides(tiny_model, tmp_path / "run"), "trainer.loggers=[jsonl,mlflow]",
                   f"trainer.mlflow_uri={uri}"], capsys)
    assert time.monotonic() - t0 < 30
    assert line == (f"memrl train: error: trainer.mlflow_uri={uri}: the tracking server does not answer within 5 s "
                    "(ConnectError: [Errno 111] Connection refused); start it, or log to a local store (a directory "
                    "path)")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize(("status", "ok"), [(404, True), (200, True), (502, False), (504, False)])
def test_the_mlflow_probe_takes_any_answer_but_a_gateways(status, ok):
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from memrl.training.monitor.trackers import mlflow_uri_problem

    class Answer(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    try:
        problem = mlflow_uri_problem(f"http://127.0.0.1:{httpd.server_address[1]}")
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert problem == (None if ok else f"the tracking server does not answer within 5 s (HTTP {status} from a "
                                       "gateway); start it, or log to a local store (a directory path)")


# --------------------------------------------- item 9 (the rest): a chat reply bigger than anything it could be


def test_a_chat_reply_longer_than_max_tokens_allows_never_reaches_the_tokenizer():
    """A 20 MB chat reply (a server that ignores max_tokens) was tokenized whole and aborted the process with
    a Rust out-of-memory error."""
    from doubles import CharTokenizer

    from memrl.engines.openai_http import BadReply, parse_chat

    class Counting(CharTokenizer):
        seen = 0

        def encode(self, text, **kw):  # noqa: ANN001, ANN003, ANN201
            Counting.seen += len(text)
            return super().encode(text, **kw)

    def reply(text: str) -> dict:
        return {"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "length"}]}

    tok = Counting()
    with pytest.raises(BadReply) as e:
        parse_chat(reply("x" * 20_000_000), "http://h/v1/chat/completions", tok, max_tokens=64)
    assert str(e.value) == ("http://h/v1/chat/completions: malformed chat reply: 20,000,000 characters, more than "
                            "max_tokens=64 tokens can hold (256 each); the server ignored max_tokens")
    assert Counting.seen == 0
    assert parse_chat(reply("x" * 64 * 256), "u", tok, max_tokens=64).finish_reason == "length"  # at the bound


def test_a_reply_body_past_the_byte_cap_is_refused_unread(monkeypatch):
    import asyncio
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from memrl.engines import openai_http
    from memrl.engines.base import EngineError, SamplingParams

    sent = []

    class Flood(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(1 << 20))
            self.end_headers()
            try:
                for _ in range(64):
                    self.wfile.write(b" " * (1 << 14))
                    sent.append(1 << 14)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def log_message(self, *args: object) -> None:
            pass

    monkeypatch.setattr(openai_http, "MAX_REPLY_BYTES", 50_000)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Flood)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, args=(0.02,), daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    try:
        eng = openai_http.OpenAIEngine(base_url=url, tokenizer=None, max_retries=0, timeout_s=5.0)
        with pytest.raises(EngineError) as e:
            asyncio.run(eng.generate([1, 2], SamplingParams(temperature=0, max_tokens=4)))
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert str(e.value) == f"{url}/completions: the reply is larger than 50,000 bytes; refused unread"


# ------------------------------------------- item 3: --resume of a LoRA run onto other base weights at the path


def test_resume_of_a_lora_run_checks_the_base_weights_by_content(tiny_model, tmp_path, capsys):
    """Before: model.path was compared as a string, so an adapter resumed on other base weights placed at the
    same path without a word."""
    import shutil

    import torch
    from conftest import train_overrides
    from safetensors.torch import load_file, save_file

    from memrl.model_files import weights_digest
    from memrl.training.checkpoints.checkpoint import load_state

    base = tmp_path / "base"
    shutil.copytree(tiny_model, base)
    out = tmp_path / "run"
    argv = ["train", *train_overrides(str(base), out, steps=1), "model.lora.rank=4"]
    import train_child  # noqa: F401 - registers memagent_parity

    assert main(argv) == 0
    capsys.readouterr()
    digest = weights_digest(base)
    state = load_state(out / "checkpoints" / "step_000001")
    assert state["base_weights_sha256"] == digest and len(digest) == 64
    weights = load_file(base / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1.0  # other base weights, same path, same shapes
    save_file(weights, base / "model.safetensors", metadata={"format": "pt"})
    now = weights_digest(base)
    line = _fails([*argv[:1], "--resume", *argv[1:]], capsys)
    assert line == (f"memrl train: error: --resume: model.path={base} holds other base weights than the LoRA run "
                    f"was trained on (SHA-256 of its weight files {now[:16]}..., the checkpoint's {digest[:16]}...); "
                    "put the run's base weights back or train into a new out_dir")
    assert torch.equal(load_file(base / "model.safetensors")[name], weights[name])


# ------------------------------------------- item 10: --tokenizer DIR that holds no tokenizer (RULER builder)


def _ruler(tok: str, out) -> list[str]:
    return ["data", "build", "--kind", "ruler", "--tasks", "niah_single_1", "--lengths", "1k", "--samples", "2",
            "--tokenizer", tok, "--out", str(out)]


def test_ruler_builder_refuses_a_directory_without_a_tokenizer_in_one_line(tiny_model, tmp_path, capsys):
    """Before: a model directory without tokenizer files loaded a one-token tokenizer and the builder never
    reached a length (it hung); a directory of YAML files was a traceback."""
    import shutil

    weights_only = tmp_path / "weights_only"
    weights_only.mkdir()
    for f in ("config.json", "model.safetensors"):
        shutil.copy(f"{tiny_model}/{f}", weights_only / f)
    yamls = tmp_path / "yamls"
    yamls.mkdir()
    (yamls / "a.yaml").write_text("a: 1\n")
    for d in (weights_only, yamls):
        line = _fails(_ruler(str(d), tmp_path / "out"), capsys, code=1)
        assert line == (f"memrl data: error: --tokenizer {d} has no tokenizer (expected tokenizer.json, "
                        "tokenizer.model, vocab.json + merges.txt, or vocab.txt)")
        line = _fails(["data", "stats", "--tokenizer", str(d), str(yamls / "a.yaml")], capsys, code=1)
        assert line.startswith(f"memrl data: error: --tokenizer {d} has no tokenizer")
    assert not (tmp_path / "out").exists()
    damaged = tmp_path / "damaged"
    shutil.copytree(tiny_model, damaged)
    (damaged / "tokenizer.json").write_text("version: 1\nmodel: {}\n")  # YAML, not the JSON transformers reads
    line = _fails(_ruler(str(damaged), tmp_path / "out"), capsys, code=1)
    assert line.startswith(f"memrl data: error: --tokenizer {damaged}: transformers cannot load a tokenizer from it (")


# -------- item 1 (the message): a checkpoint saved after the update that broke the weights is not "untouched"


@pytest.mark.parametrize(("saved", "step", "said"), [
    (["step_000002", "step_000003"], 3, "the last checkpoint {r}/step_000003 holds these weights (saved after step 3's "
                                        "update); {r}/step_000002 predates them"),
    (["step_000002"], 3, "the last checkpoint {r}/step_000002 is untouched"),
    ([], 0, "no checkpoint of this run was written"),
])
def test_the_non_finite_message_says_which_checkpoint_holds_the_broken_weights(saved, step, said, tmp_path):
    """`optim.lr=1e30` trained and saved garbage weights, and the next step's message called that checkpoint
    "untouched"."""
    from memrl.training.checkpoints.checkpoint import non_finite_message

    for name in saved:
        (tmp_path / name).mkdir()
    if saved:
        (tmp_path / "latest").write_text(saved[-1])
    msg = non_finite_message(RuntimeError("nan at token 0"), step, tmp_path, "M")
    assert msg.endswith("produced a non-finite log-probability: nan at token 0; " + said.format(r=tmp_path))
