"""`memrl train --preset memact_official` end to end on CPU: 2 DCPO steps of the tiny model against a fake
reasoning judge and a retrieval service replying in the public MemAct shape (issue 27's "done means").

Everything runs for real on 127.0.0.1 free ports, started and stopped here:
- the data: a parquet in the published layout (DCPO/data/*.parquet: prompt [system, user], Q-keyed JSON
  and plain-text ground truths, no sub-question list), our own text;
- the retriever: `memrl serve retrieval --reply-shape public` (a subprocess), documents without id / score;
- the judge: an OpenAI-compatible HTTP server answering like a reasoning model (gpt-oss behind SGLang, as
  DCPO/scripts/reward_service.sh serves it): a separate `reasoning_content` field that names the opposite
  verdict, and a final answer holding one of the published tags. Its verdict is a function of the request
  alone (`verdict()` below), and every request and reply is recorded;
- the policy: the tiny model (memrl.models.tiny), first taught the agent's format by a short SFT on
  scripted demonstrations played through the workflow (a random model never writes "FINAL_ANSWER: ", so
  nothing would reach the judge).

Checked: 2 steps complete; every trajectory's reward is what the judge said about its answer (an answer
without the marker is never sent and scores 0); each step trains the rows the published selection picks
(rows per task = algorithm.segments_per_task); metrics.jsonl counts the judge's verdicts and failures.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]

CORRECT, PARTIAL, INCORRECT = "<ANSWER_CORRECT>", "<ANSWER_PARTIAL_CORRECT>", "<ANSWER_INCORRECT>"
SYSTEM = ("You answer questions with a search tool.\n\n# Most important:\nPut what you found into "
          "prune_context's memory, then delete the results.")
USER = "<developer_message>\nAnswer briefly.\n</developer_message>\n\n{q}"
# (question text, ground truth as the file holds it, search query, the demonstrations' right and wrong answer)
TASKS = [
    ("Q1: Capital of Peru?\nQ2: Year of the first Moon landing?", '{"Q1": "Lima", "Q2": "1969"}', "Peru",
     '{"Q1": "Lima", "Q2": "1969"}', '{"Q1": "Cusco", "Q2": "1969"}'),
    ("Q1: River through Lyon?\nQ2: Year the Eiffel Tower opened?", '{"Q1": "Rhone", "Q2": "1889"}', "Lyon",
     '{"Q1": "Rhone", "Q2": "1889"}', '{"Q1": "Seine", "Q2": "1900"}'),
    ("Where is the Nobel Peace Prize awarded?", "Oslo", "Nobel", "Oslo", "unsure"),
    ("In what year was the cricketer born?", "1875", "cricketer", "1875", "1880"),
]
CORPUS = [
    {"id": "d1", "title": "Peru", "text": "Lima is the capital of Peru."},
    {"id": "d2", "title": "Lyon", "text": "The Rhone flows through Lyon."},
    {"id": "d3", "title": "Nobel", "text": "The Nobel Peace Prize is awarded in Oslo."},
    {"id": "d4", "title": "cricketer", "text": "The cricketer was born in 1875."},
]
# the tool schemas the user supplies (workflow.tool_schemas_file), in the published tool config's layout
# (DCPO/config/mem_search_tool_config_single.yaml: tools[].tool_schema); our own short descriptions
TOOLS_YAML = """tools:
  - tool_schema:
      type: function
      function:
        name: search
        description: Search the documents.
        parameters: {type: object, properties: {query: {type: string}}, required: [query]}
  - tool_schema:
      type: function
      function:
        name: prune_context
        description: Keep a memory note, delete results.
        parameters: {type: object, properties: {memory: {type: string}, delete_ids: {type: array}},
                     required: [memory, delete_ids]}
"""
# the rubric the user supplies (workflow.judge.rubric_file): our own text, the published placeholder names
RUBRIC = ("Grade the answer.\nQUESTION<<{question}>>\nGOLD<<{ground_truth}>>\nANSWER<<{model_answer}>>\n"
          f"End with {CORRECT}, {PARTIAL} or {INCORRECT}.")


def verdict(gold: str, answer: str) -> str | None:
    """The fake judge's verdict, from the request alone: every gold value in the answer -> correct, some ->
    partial, none -> incorrect; an answer saying "unsure" gets a reply whose final part never comes
    (reasoning only: no verdict, a counted failure that scores 0)."""
    if "unsure" in answer:
        return None
    values = list(json.loads(gold).values()) if gold.startswith("{") else [gold]
    found = sum(v in answer for v in values)
    return "correct" if found == len(values) else "partial" if found else "incorrect"


TAG = {"correct": CORRECT, "partial": PARTIAL, "incorrect": INCORRECT}
OPPOSITE = {"correct": INCORRECT, "partial": CORRECT, "incorrect": CORRECT, None: CORRECT}


class ReasoningJudge:
    """OpenAI-compatible chat completions like a reasoning model behind SGLang; records (question, gold,
    answer, verdict) per request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str, str | None]] = []
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][0]["content"]
                q, gold, answer = (re.search(rf"{k}<<(.*?)>>", prompt, re.S).group(1)
                                   for k in ("QUESTION", "GOLD", "ANSWER"))
                v = verdict(gold, answer)
                outer.bodies.append(body)
                outer.seen.append((q, gold, answer, v))
                reasoning = f"Comparing each part. Could it be {OPPOSITE[v]}? Let me check again."
                if v is None:  # the token budget ran out in the analysis channel: no final part
                    message = {"content": f"<|channel|>analysis<|message|>{reasoning}", "reasoning_content": None}
                else:
                    message = {"content": f"The answer is graded.\n{TAG[v]}", "reasoning_content": reasoning}
                data = json.dumps({"id": "x", "object": "chat.completion", "model": body["model"],
                                   "choices": [{"index": 0, "finish_reason": "stop",
                                                "message": {"role": "assistant", **message}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def published_rows() -> list[dict]:
    return [{"data_source": "memagent",
             "prompt": [{"content": SYSTEM, "role": "system"}, {"content": USER.format(q=q), "role": "user"}],
             "ability": "", "agent_name": "mem_agent", "reward_model": {"ground_truth": gt},
             "extra_info": {"ground_truth": gt, "need_tools_kwargs": True, "question": q,
                            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ""}}}}}
            for q, gt, *_ in TASKS]


def write_inputs(tmp: Path) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {"data": tmp / "train.parquet", "corpus": tmp / "corpus.jsonl", "tools": tmp / "tools.yaml",
             "rubric": tmp / "rubric.txt"}
    pq.write_table(pa.Table.from_pylist(published_rows()), str(files["data"]))
    files["corpus"].write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    files["tools"].write_text(TOOLS_YAML)
    files["rubric"].write_text(RUBRIC)
    return files


def demo_script():
    """The scripted agent the policy imitates: each turn, whatever the context, searches (every other
    reply) or answers with one of four answers in turn, so the cold-started policy samples all of these
    unconditionally (a tiny model learns that in a few steps): some trajectories search, answers differ."""
    counter = iter(range(10**6))
    answers = ["Lima", "Oslo", "unsure", "1875"]

    def script(prompt: str, call: int) -> str:
        k = next(counter)
        if k % 2 == 0:
            return '<tool_call>{"name": "search", "arguments": {"query": "Peru"}}</tool_call>'
        return f"FINAL_ANSWER: {answers[(k // 2) % 4]}"

    return script


def cold_started_model(tmp: Path, files: dict[str, Path], epochs: int = 8, lr: float = 1e-2) -> Path:
    """The tiny model after a short SFT on the scripted agent's segments (built by the workflow itself, so
    the rows are the ones RL builds). Its tokenizer gets memrl.models.tiny's compact-tools ChatML (the tool
    names instead of ~300 tokens of schemas), so rows stay short on a 2-core CPU."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.io import load_tasks
    from memrl.demonstrators import ScriptedEngine
    from memrl.models.tiny import CHAT_TEMPLATE_COMPACT_TOOLS, cached_tiny_model
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.workflows import get_workflow
    from memrl.workflows.memact import MemActConfig
    from memrl.workflows.runner import rollout_sync

    base = cached_tiny_model("tiny")
    tok = AutoTokenizer.from_pretrained(base)
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    out = tmp / "sft"
    tok.save_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    wf = MemActConfig(prompt_source="row", require_final_answer=True, tool_schemas_file=str(files["tools"]),
                      retriever_kind="keyword", retriever_corpus=str(files["corpus"]), no_prune_prob=0.5)
    groups = rollout_sync(load_tasks(files["data"]), get_workflow("memact"),
                          ScriptedEngine(demo_script(), tokenizer=tok), wf, n=8, concurrency=1, seed=0, score=False)
    segments = [s for g in groups for t in g.trajectories for s in t.segments]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    losses = sft_train(model, segments, SFTConfig(epochs=epochs, batch_rows=32, lr=lr, warmup_steps=2,
                                                  lr_floor=0.3, seed=0))
    print(f"cold start: {len(segments)} rows, loss {losses[0]:.2f} -> {losses[-1]:.3f}, {len(losses)} steps")
    model.save_pretrained(out, safe_serialization=True)
    return out
