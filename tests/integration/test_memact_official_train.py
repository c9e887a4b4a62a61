"""`memrl train --preset memact_official` end to end on CPU: 2 DCPO steps of the tiny model against a fake
reasoning judge and a retrieval service replying in the public MemAct shape (issue 27's "done means").

Everything runs for real on 127.0.0.1 free ports, started and stopped here:
- the data: a parquet in the published layout (DCPO/data/*.parquet: prompt [system, user], Q-keyed JSON
  and plain-text ground truths, no sub-question list), our own text;
- the retriever: `memrl serve retrieval --reply-shape public` (a subprocess), documents without id / score;
- the judge: an OpenAI-compatible HTTP server answering like a reasoning model (gpt-oss behind SGLang, as
  DCPO/scripts/reward_service.sh serves it): reasoning that names the opposite verdict (a separate
  `reasoning_content` field, or harmony's analysis channel in the content) and a final answer holding one of
  the published tags, or reasoning only (the budget spent: no verdict). Its verdict is a function of the request
  alone (`verdict()` below), and every request and reply is recorded;
- the policy: the tiny model (memrl.models.tiny) with weights set by hand so that each turn it samples one
  of a few replies (search, prune, "FINAL_ANSWER: ..." with one of three answers, or an answer without
  the marker); a randomly initialized model never writes "FINAL_ANSWER: ", so nothing would reach the judge,
  and an SFT to the same effect takes minutes on a 2-core CPU. The trainer loads, samples and updates it
  like any other model.

Checked: 2 steps complete; every trajectory's reward is what the judge said about its answer (an answer
without the marker is never sent and scores 0); each step trains the rows the published selection picks
(rows per task = algorithm.segments_per_task); metrics.jsonl counts the judge's verdicts and failures.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from doubles import JsonServer, retrieval_server

pytestmark = pytest.mark.slow

CORRECT, PARTIAL, INCORRECT = "<ANSWER_CORRECT>", "<ANSWER_PARTIAL_CORRECT>", "<ANSWER_INCORRECT>"
SYSTEM = ("You answer questions with a search tool.\n\n# Most important:\nPut what you found into "
          "prune_context's memory, then delete the results.")
USER = "<developer_message>\nAnswer briefly.\n</developer_message>\n\n{q}"
# (question text, ground truth as the file holds it): Q-keyed JSON for 2 questions, plain text for one
TASKS = [
    ("Q1: Capital of Peru?\nQ2: Year of the first Moon landing?", '{"Q1": "Lima", "Q2": "1969"}'),
    ("Q1: River through Lyon?\nQ2: Year the Eiffel Tower opened?", '{"Q1": "Rhone", "Q2": "1889"}'),
    ("Where is the Nobel Peace Prize awarded?", "Oslo"),
    ("In what year was the cricketer born?", "1875"),
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
        self.server = JsonServer(self.reply, "/v1")
        self.url = self.server.url

    def reply(self, body: dict) -> dict:
        prompt = body["messages"][0]["content"]
        q, gold, answer = (re.search(rf"{k}<<(.*?)>>", prompt, re.S).group(1) for k in ("QUESTION", "GOLD", "ANSWER"))
        v = verdict(gold, answer)
        self.bodies.append(body)
        self.seen.append((q, gold, answer, v))
        reasoning = f"Comparing each part. Could it be {OPPOSITE[v]}? Let me check again."
        if v is None:  # the token budget ran out in the analysis channel: no final part
            message = {"content": f"<|channel|>analysis<|message|>{reasoning}", "reasoning_content": None}
        elif v == "incorrect":  # no reasoning parser on the server: harmony channels in the content
            message = {"content": f"<|channel|>analysis<|message|>{reasoning}<|end|><|start|>assistant"
                                  f"<|channel|>final<|message|>{TAG[v]}<|return|>"}
        else:
            message = {"content": f"The answer is graded.\n{TAG[v]}", "reasoning_content": reasoning}
        return {"id": "x", "object": "chat.completion", "model": body["model"],
                "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", **message}}]}

    def stop(self) -> None:
        self.server.stop()


def published_rows() -> list[dict]:
    return [{"data_source": "memagent",
             "prompt": [{"content": SYSTEM, "role": "system"}, {"content": USER.format(q=q), "role": "user"}],
             "ability": "", "agent_name": "mem_agent", "reward_model": {"ground_truth": gt},
             "extra_info": {"ground_truth": gt, "need_tools_kwargs": True, "question": q,
                            "tools_kwargs": {"search": {"create_kwargs": {"ground_truth": ""}}}}}
            for q, gt in TASKS]


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


# The policy: a tiny Qwen2 (memrl.models.tiny) whose weights are set by hand so that it writes one of these
# replies per turn. Each reply piece is one added token; from the assistant header's last token, and from
# each piece, the model puts (nearly) equal logits on the pieces that may follow, so T=0.7 samples among
# them, and nothing on anything else. SFT to the same effect takes minutes on a 2-core CPU; this takes none.
# The answers, judged against every task's ground truth: ALL_GOLDS names every gold value (the judge says
# correct; memrl's rule reward reads no answer in it: no JSON object, and its first line is not the single
# answer), " Cusco" none (incorrect), " unsure" gets a reply without a final part (no verdict).
SEARCH_CALL = '{"name": "search", "arguments": {"query": "Peru"}}'
PRUNE_CALL = '{"name": "prune_context", "arguments": {"memory": "Lima is the capital of Peru.", "delete_ids": ["r1"]}}'
ALL_GOLDS = " Lima, 1969, Rhone, 1889, Oslo, 1875"
REPLIES = [["<tool_call>", SEARCH_CALL, "</tool_call>"], ["<tool_call>", PRUNE_CALL, "</tool_call>"],
           ["FINAL_ANSWER:", ALL_GOLDS], ["FINAL_ANSWER:", " Cusco"], ["FINAL_ANSWER:", " unsure"],
           ["I do not know."]]
ODDS = {"I do not know.": 0.2}
"""Relative odds of a first piece (1 unless listed): the answer without the marker is rarer, so about 29 of
the 32 trajectories reach the judge and each of its three verdicts is all but certain to occur."""


def scripted_policy(out: Path) -> Path:
    """Write the policy described above to `out` (tokenizer with the reply pieces added and memrl.models.tiny's
    compact-tools ChatML, so prompts stay short; untied Qwen2 weights): every layer's output projections are
    zero, so the next token depends on the current one only, through the embedding and the head."""
    import torch
    from transformers import AddedToken, AutoModelForCausalLM, AutoTokenizer

    from memrl.models.tiny import CHAT_TEMPLATE_COMPACT_TOOLS, cached_tiny_model

    base = cached_tiny_model("tiny")
    tok = AutoTokenizer.from_pretrained(base)
    pieces = sorted({p for r in REPLIES for p in r})
    tok.add_tokens([AddedToken(p, normalized=False, special=False) for p in pieces])
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    start = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)[-1]
    follow: dict[int, set[int]] = {}
    for reply in REPLIES:
        encoded = [tok.encode(p, add_special_tokens=False) for p in reply]
        assert all(len(e) == 1 for e in encoded), encoded  # each piece is one token
        ids = [start] + [e[0] for e in encoded] + [tok.eos_token_id]
        for a, b in zip(ids[:-1], ids[1:], strict=True):
            follow.setdefault(a, set()).add(b)
    odds = {tok.convert_tokens_to_ids(p): w for p, w in ODDS.items()}
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(len(tok))
    with torch.no_grad():
        model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
        model.config.tie_word_embeddings = False
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb, head = model.get_input_embeddings().weight, model.lm_head.weight
        for j, (a, nexts) in enumerate(sorted(follow.items())):
            emb[a] = 0.0
            emb[a, j] = 1.0  # after the final RMSNorm: sqrt(hidden) * e_j
            head[:, j] = 0.0
            for b in nexts:  # logit 3 * sqrt(192) = 41.6 for each allowed next token, 0 otherwise; odds w at
                # temperature 0.7: 0.7 * ln(w) / sqrt(192) less
                head[b, j] = 3.0 + 0.7 * math.log(odds.get(b, 1.0)) / math.sqrt(emb.shape[1])
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def retrieval_service(tmp_path):
    """`memrl serve retrieval --reply-shape public` over CORPUS (a subprocess on a free port): (url, a
    function returning its /health reply)."""
    import httpx

    corpus = tmp_path / "service_corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS))
    with retrieval_server(corpus, "--reply-shape", "public") as (url, _):
        yield url, lambda: httpx.get(f"{url}/health", timeout=5).json()


def test_memact_official_trains_two_steps_against_a_reasoning_judge(tmp_path, monkeypatch, retrieval_service):
    from memrl.algorithms.selection import select_segments
    from memrl.cli import main
    from memrl.training import trainer as trainer_mod

    service_url, health = retrieval_service
    files = write_inputs(tmp_path)
    policy = scripted_policy(tmp_path / "policy")
    assert health()["reply_shape"] == "public"
    judge = ReasoningJudge()
    seen: list[dict] = []  # per step: its groups, the rows trained, the judge requests so far
    select, train_rows = trainer_mod.Trainer.select, trainer_mod.Trainer.train_rows

    def recording_select(self, groups):  # the selection stage gets the scored groups
        seen.append({"step": self.step, "groups": groups, "rows": [], "judged": len(judge.seen)})
        return select(self, groups)

    def recording_train_rows(self, batch, *args, **kwargs):
        seen[-1]["rows"].extend(batch.segments)
        return train_rows(self, batch, *args, **kwargs)

    monkeypatch.setattr(trainer_mod.Trainer, "select", recording_select)
    monkeypatch.setattr(trainer_mod.Trainer, "train_rows", recording_train_rows)
    out = tmp_path / "run"
    overrides = [
        # size-only: the tiny model on a 2-core CPU, 2 steps of 2 tasks, short turns
        f"model.path={policy}", "engine=hf", "model.device=cpu", "model.dtype=float32", "trainer.steps=2",
        "trainer.batch_size=2", "workflow.max_turn_tokens=16", "trainer.progress=false", "trainer.tensorboard=false",
        # what the preset leaves to the user: data, judge server, rubric, tool schemas, retriever, out_dir
        f"data.path={files['data']}", f"workflow.judge.url={judge.url}", f"workflow.judge.rubric_file={files['rubric']}",
        f"workflow.tool_schemas_file={files['tools']}", f"workflow.retriever_url={service_url}", f"out_dir={out}",
    ]
    try:
        rc = main(["train", "--preset", "memact_official", *overrides])
    finally:
        judge.stop()
    assert rc == 0

    # --- 2 steps, each of 2 tasks x algorithm.n = 8 trajectories
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in seen] == [0, 1] and len(lines) == 2
    assert all(len(s["groups"]) == 2 and all(len(g.trajectories) == 8 for g in s["groups"]) for s in seen)
    trajs = [t for s in seen for g in s["groups"] for t in g.trajectories]
    # the file's row i is task "memagent-<i>" (data_source-index), "@e<epoch>" added by the trainer's stream
    gold = {t.trajectory_id: TASKS[int(t.task_id.split("@")[0].rsplit("-", 1)[1])][1] for t in trajs}

    # --- rewards are the judge's verdicts: every answer with the marker was sent once, nothing else was
    assert all(b["model"] == "gpt-oss" and b["max_tokens"] == 800 and b["temperature"] == 1.0 and "top_p" not in b
               for b in judge.bodies)  # the preset's published judge settings, on the wire
    verdicts = {(g, a): v for _, g, a, v in judge.seen}
    sent = sorted((g, a) for _, g, a, _ in judge.seen)
    answered = [t for t in trajs if t.final_answer]
    assert sent == sorted((gold[t.trajectory_id], t.final_answer) for t in answered)
    for t in trajs:
        if not t.final_answer:  # no "FINAL_ANSWER: " (the "I do not know." reply): 0 without a call
            assert t.reward == 0.0 and t.info["judge"]["verdict"] == "empty"
            continue
        v = verdicts[(gold[t.trajectory_id], t.final_answer)]
        assert t.reward == (1.0 if v == "correct" else 0.0), (t.final_answer, v, t.reward)
        assert t.info["judge"]["verdict"] == (v or "error") and t.metrics["judge_error_no_verdict"] == float(v is None)
    assert {v for _, _, _, v in judge.seen} == {"correct", "incorrect", None}  # ODDS: all but certain
    assert {t.reward for t in trajs} == {0.0, 1.0}
    # the judge decides where memrl's rule reward disagrees: ALL_GOLDS is right for the judge, not for the rule
    judged_right = [t for t in trajs if t.reward == 1.0]
    assert judged_right and all(t.final_answer == ALL_GOLDS.strip() and t.metrics["multiq_all_correct"] == 0.0
                                for t in judged_right)
    print(f"judged {len(judge.seen)}: " + ", ".join(f"{v}={sum(x[3] == v for x in judge.seen)}"
                                                    for v in ("correct", "incorrect", None))
          + f"; searches {sum(t.metrics['searches'] for t in trajs)}; segments "
          + str(sorted(len(t.segments) for t in trajs)))

    # --- the segments trained follow the published selection: 12 rows per task (algorithm.segments_per_task)
    for s, line in zip(seen, lines, strict=True):
        rows, groups = s["rows"], s["groups"]
        assert len(rows) == 12 * len(groups) == line["train/rows"] == line["dcpo/selected"]
        want = [seg for g in select_segments(groups, "published", 12, trainer_mod.selection_rng(0, s["step"]))
                for seg in g]
        key = sorted((x.trajectory_id, tuple(x.prompt_ids), tuple(x.response_ids)) for x in want)
        assert sorted((r.trajectory_id, tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows) == key
        repeats = 0
        for g in groups:
            # by hand: K = 8 trajectories, each with a segment (every reply has sampled tokens), S = 12: one row
            # each, then the S - K = 4 extra slots go once round a shuffled list of the 8 (4 <= 8): 4 trajectories
            # train 2 rows, 4 train 1; a second row is an unused segment if the trajectory has one, else a repeat
            with_seg = [t for t in g.trajectories if t.segments]
            assert len(with_seg) == 8
            per = {t.trajectory_id: [r for r in rows if r.trajectory_id == t.trajectory_id] for t in with_seg}
            assert sorted(len(v) for v in per.values()) == [1] * 4 + [2] * 4
            for t in with_seg:
                got = per[t.trajectory_id]
                distinct = len({(tuple(r.prompt_ids), tuple(r.response_ids)) for r in got})
                assert distinct == min(len(got), len(t.segments))  # a repeat only when no unused segment is left
                repeats += len(got) - distinct
        assert line["dcpo/repeated"] == repeats

    # --- metrics.jsonl counts the judge's verdicts and failures per step, as the judge saw them
    ends = [s["judged"] for s in seen]
    for i, (s, line) in enumerate(zip(seen, lines, strict=True)):
        step_seen = judge.seen[(ends[i - 1] if i else 0):ends[i]]
        step_trajs = [t for g in s["groups"] for t in g.trajectories]
        assert line["judge/correct"] == sum(v == "correct" for *_, v in step_seen)
        assert line["judge/error"] == line["judge/error_no_verdict"] == sum(v is None for *_, v in step_seen)
        assert line["judge/error_http_error"] == line["judge/error_timeout"] == line["judge/error_garbled"] == 0
        assert line["judge/excluded"] == 0  # on_failure=zero: a failed judgement stays in the group, scored 0
        assert line["reward/mean"] == pytest.approx(sum(t.reward for t in step_trajs) / len(step_trajs))
    assert sum(line["judge/error_no_verdict"] for line in lines) >= 1  # the " unsure" answers

    # --- the agent searched the public-shape service and read its documents (no id, no score in the reply)
    searches = sum(t.metrics["searches"] for t in trajs)
    assert searches >= 1 and sum(t.metrics["search_errors"] for t in trajs) == 0
    assert health()["requests"] == searches
    # the preset's published result format (workflow.tool_result_format): JSON with an 8-character id
    results = [json.loads(m["text"]) for t in trajs for m in t.info["transcript"]
               if m["kind"] == "tool" and '"result": [[' in m["text"]]
    assert results and all(list(r) == ["success", "tool_call_id", "result"] and len(r["tool_call_id"]) == 8
                           and r["result"] == [[{"document": {"title": "Peru", "text": "Lima is the capital of Peru."}}]]
                           for r in results)
