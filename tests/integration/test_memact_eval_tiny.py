"""End to end: `memrl eval workflow=memact` with a random tiny model on 20 multi-question tasks built from
the shared HotpotQA subset (2-3 sub-questions each, in the agreed Task layout), searching a corpus of those
questions' paragraphs. A random model writes garbage: it must be counted, never crash the run, and the
tables (standard + MemAct) must agree with the JSONL. The same run with the prune tool withheld is the
baseline; `memrl eval report` puts both in one MemAct table.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.data.hotpotqa import load_hotpotqa, paragraph_text
from memrl.data.tasks_jsonl import load_task_file, write_tasks
from memrl.eval.runner import RESULTS_FILE, read_results
from memrl.types import Task

pytestmark = pytest.mark.slow

# the shared data beside the checkout (a clone in /work/main, or a worktree one level deeper)
DATA = next((p for p in (Path(__file__).parents[k] / "shared" / "data" for k in (3, 4)) if p.exists()),
            Path(__file__).parents[3] / "shared" / "data")
HOTPOT = DATA / "hotpotqa_dev_distractor_1143.json.xz"
OVERRIDES = ["workflow=memact", "workflow.retriever_kind=bm25", "workflow.max_assistant_turns=3",
             "workflow.max_turn_tokens=12", "engine.max_batch_size=8", "concurrency=8"]


def build(root: Path) -> tuple[Path, Path]:
    """20 tasks of 2, 3, 2, 3, ... HotpotQA questions, and the corpus of their paragraphs."""
    qs = load_hotpotqa(HOTPOT, limit=50)
    tasks, corpus, i = [], {}, 0
    for n in range(20):
        k = 2 + n % 2
        group = qs[i:i + k]
        i += k
        text = "Answer these questions:\n" + "\n".join(f"{j}. {q.question}" for j, q in enumerate(group, 1))
        tasks.append(Task(f"mq{n}", text, "", [q.answers[0] for q in group],
                          meta={"sub_questions": [q.question for q in group],
                                "sub_answers": [list(q.answers) for q in group]}))
        for q in group:
            for p in q.meta["paragraphs"]:
                corpus.setdefault(p["title"], paragraph_text(p["sentences"]))
    write_tasks(root / "tasks.jsonl", tasks)
    with open(root / "corpus.jsonl", "w", encoding="utf-8") as f:
        for k, (title, text) in enumerate(corpus.items()):
            f.write(json.dumps({"id": f"p{k}", "title": title, "text": text}) + "\n")
    return root / "tasks.jsonl", root / "corpus.jsonl"


def test_memact_eval_with_a_random_tiny_model(tmp_path):
    if not HOTPOT.exists():
        pytest.skip(f"shared real data not found at {DATA.resolve()}")
    from memrl.models.tiny import cached_tiny_model

    tasks_file, corpus = build(tmp_path)
    tasks = load_task_file(tasks_file)
    assert len(tasks) == 20 and [len(t.answers) for t in tasks[:4]] == [2, 3, 2, 3]
    model = cached_tiny_model("tiny")
    runs = {}
    for name, extra, k in (("memact", [], 20), ("search_only", ["workflow.prune_tool=false", "limit=5"], 5)):
        out = tmp_path / name
        rc = main(["eval", "--model", str(model), "--out", str(out), "--no-progress", "--name", name,
                   str(tasks_file), f"workflow.retriever_corpus={corpus}", *OVERRIDES, *extra])
        assert rc == 0
        runs[name] = out
        rows = read_results(out / RESULTS_FILE)
        assert len(rows) == k and {r["task_id"] for r in rows} == {t.task_id for t in tasks[:k]}
        for r in rows:
            m = r["metrics"]
            assert m["multiq_questions"] in (2.0, 3.0) and r["reward"] == m["multiq_all_correct"]
            assert m["prune_withheld"] == float(name == "search_only")
            assert 1 <= m["turns"] <= 3 and 0 < r["generated_tokens"] <= 36
            assert m["peak_context_tokens"] >= m["mean_context_tokens"] > 0
            # garbage is counted: a random model's answer holds no JSON, or its calls are malformed
            assert m["answer_unparsed"] + m["answer_parse_fallback"] + m["malformed_calls"] + m["stop_max_turns"] >= 1
        table = list(csv.DictReader(open(out / "memact_summary.csv")))
        assert len(table) == 1 and table[0]["run"] == name and int(table[0]["questions"]) == k
        mean_ctx = sum(r["metrics"]["mean_context_tokens"] for r in rows) / k
        assert float(table[0]["mean_context_tokens"]) == pytest.approx(mean_ctx)
        assert float(table[0]["accuracy"]) == pytest.approx(100 * sum(r["reward"] for r in rows) / k)
        assert int(table[0]["malformed_calls"]) == sum(int(r["metrics"]["malformed_calls"]) for r in rows)
        assert "| accuracy (all) |" in (out / "summary.md").read_text()
        assert (out / "memact_context.png").stat().st_size > 0
    rc = main(["eval", "report", str(runs["memact"]), str(runs["search_only"]), "--out", str(tmp_path / "cmp")])
    assert rc == 0
    table = list(csv.DictReader(open(tmp_path / "cmp" / "memact_summary.csv")))
    assert [r["run"] for r in table] == ["memact", "search_only"]
    assert [float(r["prune_withheld"]) for r in table] == [0.0, 1.0]


def test_real_engine_rows_hold_exactly_the_sampled_ids_and_logprobs():
    """The tiny model through HFEngine, its first two turns forced to a search and a prune (a random model
    would not call tools): every later prompt is the kept messages' ids, and the trained ids / logprobs of
    all segments are exactly what the engine sampled (temperature 1, so logprobs are real)."""
    import asyncio
    import random

    from doubles import KeywordRetriever

    from memrl.engines.base import Completion
    from memrl.engines.hf import HFEngine
    from memrl.models.tiny import cached_tiny_model
    from memrl.services.base import Document
    from memrl.tools.search import register_retriever
    from memrl.workflows.memact import MemActConfig, run

    hf = HFEngine(str(cached_tiny_model("tiny")), device="cpu", seed=0, deterministic=False)
    tok = hf.tokenizer
    forced = ['<tool_call>{"name": "search", "arguments": {"query": "Paris"}}</tool_call>',
              '<tool_call>{"name": "prune_context", "arguments": {"memory": "Paris", "delete_ids": ["r1"]}}'
              "</tool_call>"]

    class Forced:
        tokenizer = tok

        def __init__(self):
            self.prompts, self.outs = [], []

        async def generate(self, prompt_ids, sampling):
            k = len(self.outs)
            if k < len(forced):
                ids = tok.encode(forced[k], add_special_tokens=False) + [tok.eos_token_id]
                out = Completion(ids, [-0.25] * len(ids), "stop")
            else:
                out = await hf.generate(prompt_ids, sampling)
            self.prompts.append(list(prompt_ids))
            self.outs.append(out)
            return out

    register_retriever("kw_real", KeywordRetriever([Document("p", "Paris", "Paris is in France.")]))
    engine = Forced()
    cfg = MemActConfig(retriever_kind="kw_real", no_prune_prob=0.0, temperature=1.0, max_assistant_turns=4,
                       max_turn_tokens=8)
    try:
        traj = asyncio.run(run(Task("t", "Where is Paris?", "", ["France"]), engine, cfg, random.Random(3)))
    finally:
        asyncio.run(hf.close())
    assert traj.metrics["prunes"] == 1.0 and len(engine.outs) >= 3
    trained = [(i, lp) for s in traj.segments
               for i, lp, m in zip(s.response_ids, s.response_logprobs, s.loss_mask, strict=True) if m]
    sampled = [(i, lp) for o in engine.outs for i, lp in zip(o.token_ids, o.logprobs, strict=True)]
    assert trained == sampled and any(lp != -0.25 for _, lp in sampled)
    # after the prune: the head, the kept prune turn (sampled ids, then "\n"), its result, the header
    def e(text):
        return tok.encode(text, add_special_tokens=False)

    hdr = e("<|im_start|>assistant\n")
    assert engine.prompts[0][-len(hdr):] == hdr
    result = e("<|im_start|>tool\n[r2] Removed r1. Your memory note stays in your prune_context call above."
               "<|im_end|>\n")
    assert engine.prompts[2] == engine.prompts[0] + engine.outs[1].token_ids + e("\n") + result + hdr
