"""`memrl train-sft` on a conversation parquet (rows of messages + tools, MemAct's cold-start layout).

Written with pyarrow as a real file would be: the tool-call arguments become one struct column, so every
call carries every argument key (a search call gets "memory": null, a prune call "query": null). The
reader must drop those nulls (the published SFT dataset does), so the parquet gives exactly the rows of
the same chats written as JSONL without them. The masks themselves are checked by hand in
tests/unit/test_sft_conversations.py.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memrl.cli import main
from memrl.data.conversations import conversation_segments, is_conversation_file, load_conversations

pytestmark = pytest.mark.slow

TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the corpus"}},
         {"type": "function", "function": {"name": "prune_context", "description": "drop results"}}]


def call(name, **args):
    return {"type": "function", "function": {"name": name, "arguments": args}}


def chats():
    head = [{"role": "system", "content": "You look things up."}, {"role": "user", "content": "Capital of Peru?"}]
    search = {"role": "assistant", "content": "Searching.", "tool_calls": [call("search", query="Peru capital")]}
    prune = {"role": "assistant", "content": "Noting.",
             "tool_calls": [call("prune_context", memory="Peru: Lima", delete_ids=["r1"])]}
    answer = {"role": "assistant", "content": "FINAL_ANSWER: Lima"}
    res = {"role": "tool", "content": "Lima is the capital of Peru."}
    ok = {"role": "tool", "content": "Removed r1."}
    return [{"messages": head + [search, res, answer], "tools": TOOLS},                    # 0 prunes
            {"messages": head + [search, res, prune, ok], "tools": TOOLS},                 # ends at a prune
            {"messages": head + [search, res, prune, ok, answer], "tools": TOOLS}]         # 1 prune, answered


def test_train_sft_reads_a_conversation_parquet(tmp_path, capsys):
    from doubles_chat import tools_tokenizer_dir
    from transformers import AutoTokenizer

    model = tools_tokenizer_dir(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(model)
    parquet, jsonl = tmp_path / "chats.parquet", tmp_path / "chats.jsonl"
    pq.write_table(pa.Table.from_pylist(chats()), str(parquet))
    jsonl.write_text("".join(json.dumps(c) + "\n" for c in chats()))
    stored = pq.read_table(parquet).to_pylist()
    assert stored[0]["messages"][2]["tool_calls"][0]["function"]["arguments"]["memory"] is None  # the nulls
    assert is_conversation_file(parquet) and is_conversation_file(jsonl)
    from_parquet = conversation_segments(tok, load_conversations(parquet)[0])
    from_jsonl = conversation_segments(tok, load_conversations(jsonl)[0])
    assert [(s.prompt_ids, s.response_ids, s.loss_mask) for s in from_parquet] == \
        [(s.prompt_ids, s.response_ids, s.loss_mask) for s in from_jsonl]
    assert '"arguments": {"query": "Peru capital"}' in tok.decode(from_parquet[0].response_ids)
    trained = sum(s.num_trained_tokens for s in from_parquet)

    out = tmp_path / "sft"
    rc = main(["train-sft", f"model.path={model}", "data.name=file", f"data.path={parquet}", f"out_dir={out}",
               "sft.epochs=8", "sft.batch_rows=3", "sft.warmup_steps=0", "sft.lr=3e-3"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert f"SFT on 3 chats, {trained} trained tokens" in printed
    losses = [json.loads(line)["sft/loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 8 and losses[-1] < losses[0]
    assert (out / "model.safetensors").exists() and (out / "config.yaml").exists()

    # a task file is not a conversation file: one line naming it
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"task_id": "a", "question": "q", "answers": ["x"]}) + "\n")
    assert main(["train-sft", f"model.path={model}", "data.name=file", f"data.path={tasks}",
                 f"out_dir={tmp_path / 'x'}"]) == 2
    assert "is not a conversation file" in capsys.readouterr().err
