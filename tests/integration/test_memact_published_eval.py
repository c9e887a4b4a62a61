"""`memrl eval workflow=memact` on a file in MemAct's published layout (rows imitating its DCPO/data parquet
files: prompt [system, user], a Q-keyed JSON or plain-text ground truth, no sub-question list; our own text).

A real OpenAI-compatible server on 127.0.0.1 (CompletionServer in tests/doubles.py) serves a scripted engine and
records every prompt it receives: the first prompt of each task must be exactly the tokenizer's chat
template applied to the row's messages with the workflow's tools and the generation prompt, as the
published agent loop builds it (mem_agent_loop.py: apply_chat_template(messages, tools=...,
add_generation_prompt=True, tokenize=True)). The tokenizer's template takes `tools=` (Qwen2.5-style,
tests/doubles_chat.py), so nothing of memrl's own templates may appear.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from memrl.cli import main
from memrl.eval.runner import RESULTS_FILE, read_results
from memrl.tools.search import PRUNE_SCHEMA, SEARCH_SCHEMA

pytestmark = pytest.mark.slow

SYSTEM = "You research questions with tools.\n\n# Most important:\nPrune what you no longer need."
USER = "<developer_message>\nKeep memory notes short.\n</developer_message>\n\n<user_query>\n{q}\n</user_query>\n"
QUESTIONS = [
    ("\nTwo questions:\n\nQ1: Which river flows through Lyon?\n\nQ2: When did the Eiffel Tower open?\n\n"
     "Reply with FINAL_ANSWER: and a JSON object.\n\n", '{"Q1": "Rh\\u00f4ne", "Q2": "1889"}'),
    ("\nThree questions:\n\nQ1: Capital of Peru?\n\nQ2: Year of the first Moon landing?\n\nQ3: Who wrote the "
     "first program?\n\nReply with FINAL_ANSWER: and a JSON object.\n\n", '{"Q1": "Lima", "Q2": "1969", "Q3": "Ada Lovelace"}'),
    ("Which city hosts the Nobel Peace Prize ceremony?", "Oslo"),
    ("In what year was the cricketer born?", "1875"),
]
# the scripted replies, by the question each prompt holds: (reply, memrl reward, published reward), by hand
REPLIES = {
    "Lyon": ('Summary: both found.\n\nFINAL_ANSWER: \n{"Q1": "Rh\u00f4ne", "Q2": "1889"}', 1.0, 1.0),
    "Peru": ('FINAL_ANSWER: {"Q1": "Lima", "Q3": "Ada Lovelace"}', 0.0, 0.0),  # Q2 missing: [1, 0, 1]
    "Nobel": ("Summary: Oslo.\n\nFINAL_ANSWER: Oslo", 1.0, 1.0),
    "cricketer": ("1875", 1.0, 0.0),  # no marker: memrl reads the reply, the published reward scores 0
}


def script(prompt: str, call: int) -> str:
    return next(reply for key, (reply, _, _) in REPLIES.items() if key in prompt)


def rows() -> list[dict]:
    return [{"data_source": "memagent",
             "prompt": [{"content": SYSTEM, "role": "system"}, {"content": USER.format(q=q), "role": "user"}],
             "ability": "", "agent_name": "mem_agent", "reward_model": {"ground_truth": gt},
             "extra_info": {"ground_truth": gt, "need_tools_kwargs": True, "question": q,
                            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ""}}}}}
            for q, gt in QUESTIONS]


def ids_of(out) -> list[int]:
    return list(out["input_ids"]) if isinstance(out, dict) or hasattr(out, "keys") else list(out)


def test_eval_builds_the_first_prompt_from_the_rows_messages(tmp_path):
    from doubles import CompletionServer
    from doubles_chat import tools_tokenizer_dir
    from transformers import AutoTokenizer

    from memrl.demonstrators import ScriptedEngine

    model = tools_tokenizer_dir(tmp_path / "model")
    tok = AutoTokenizer.from_pretrained(model)
    data = tmp_path / "published.parquet"
    pq.write_table(pa.Table.from_pylist(rows()), str(data))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Lyon", "text": "The Rhone flows through Lyon."}) + "\n")
    # derived here, independently of the workflow: the template over the row's messages and the tools
    want = {r["extra_info"]["question"]: ids_of(tok.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in r["prompt"]], tools=[SEARCH_SCHEMA, PRUNE_SCHEMA],
        add_generation_prompt=True, tokenize=True)) for r in rows()}
    common = [str(data), "workflow=memact", "workflow.retriever_kind=keyword", f"workflow.retriever_corpus={corpus}",
              "engine=openai", "concurrency=4"]
    runs = {}
    for name, extra in (("auto", []), ("published_reward", ["workflow.require_final_answer=true"]),
                        ("template", ["workflow.prompt_source=template"])):
        with CompletionServer(ScriptedEngine(script, tokenizer=tok)) as server:
            out = tmp_path / name
            rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", *common,
                       f"engine.openai.base_url={server.url}", *extra])
            assert rc == 0
            prompts = [e[1] for e in server.events if e[0] == "complete"]
        runs[name] = ({r["task_id"]: r for r in read_results(out / RESULTS_FILE)}, prompts)

    results, prompts = runs["auto"]
    assert len(prompts) == 4  # one turn per task: each reply is its answer
    assert sorted(prompts) == sorted(want.values())
    assert tok.decode(prompts[0]).startswith(f"<|im_start|>system\n{SYSTEM}\n\n# Tools\n<tools>\n")
    rewards = {tid: r["reward"] for tid, r in results.items()}
    assert rewards == {f"memagent-{i}": REPLIES[k][1] for i, k in enumerate(REPLIES)}
    assert results["memagent-1"]["metrics"]["multiq_correct"] == 2.0  # Q1 and Q3 right, Q2 missing

    results, prompts = runs["published_reward"]
    assert sorted(prompts) == sorted(want.values())
    assert {tid: r["reward"] for tid, r in results.items()} == {f"memagent-{i}": REPLIES[k][2]
                                                                for i, k in enumerate(REPLIES)}
    assert results["memagent-3"]["metrics"]["no_final_marker"] == 1.0

    # template: memrl's templates around the question; the row's system message is not sent
    _, prompts = runs["template"]
    assert not set(map(tuple, prompts)) & set(map(tuple, want.values()))
    assert all("You research questions with tools." not in tok.decode(p) for p in prompts)
