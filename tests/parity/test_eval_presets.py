"""The published-eval presets (memagent_eval_official, rememr1_eval_official, vime_eval_official).

1. Every value a preset sets is checked against a table written by reading the published scripts; each
   row cites the upstream file and the flag / line it comes from (paths relative to each repository:
   MemAgent = BytedTsinghua-SIA/MemAgent, ReMemR1 = syr-cn/ReMemR1, vime = yzeyu71/vime). A preset key
   without a row, or a row without a key, fails.
2. `requires_templates`: a preset run without the user's prompt files is a one-line error naming them.
3. End to end: `memrl eval --preset X` through the CLI (a scripted engine with the character tokenizer
   in place of the model, so every reply and every expected score is written here by hand) with
   template files in the published style (our own wording, the published placeholders).
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
import yaml
from doubles import ScriptedEngine

from memrl.cli import main
from memrl.config import ConfigError, load_config, preset_path
from memrl.data.memagent_files import write_eval_json
from memrl.eval import runner
from memrl.eval.runner import EvalConfig, read_results, workflow_config
from memrl.types import Task

MA = "BytedTsinghua-SIA/MemAgent taskutils/memory_eval"
RR = "syr-cn/ReMemR1 taskutils/memory_eval"
VI = "yzeyu71/vime examples/mem_agent"

# (key, value, where it comes from). "workflow.*" keys are read from the parsed workflow config.
TABLES: dict[str, list[tuple[str, object, str]]] = {
    "memagent_eval_official": [
        ("requires_templates", True, "the prompts are utils/recurrent.py TEMPLATE / TEMPLATE_FINAL (user-supplied)"),
        ("golds", "first", f"{MA}/ruler_hqa.py get_pred: item['answer'] = item['answers'][0]"),
        # run.py MemoryAgent_7B_5k_1k / _14B_: method="recurrent"; ruler_hqa.py: --api recurrent ->
        # `from utils import extract_answer` (the text after the last "the answer is")
        ("extract", "answer_is", f"{MA}/run.py MemoryAgent_*: method='recurrent' + ruler_hqa.py get_pred"),
        ("metric_rules", "memagent", f"{MA}/ruler_hqa.py calc_metrics + utils/__init__.py update_answer"),
        ("failed_requests", "drop_or_empty", f"{MA}/ruler_hqa.py get_pred: if output == '': continue"),
        ("strip_text", True, f"{MA}/utils/recurrent.py async_query_llm: context.strip(), input.strip()"),
        ("workflow.name", "memagent", f"{MA}/utils/recurrent.py async_query_llm (memory loop, no recall)"),
        ("workflow.template_style", "str_format", f"{MA}/utils/recurrent.py: TEMPLATE.format(prompt=..., ...)"),
        ("workflow.template_strip", False, f"{MA}/utils/recurrent.py: TEMPLATE ends with a newline"),
        ("workflow.chunk_tokens", 5000, f"{MA}/run.py MemoryAgent_*: RECURRENT_CHUNK_SIZE=5000"),
        # RECURRENT_MAX_CONTEXT_LEN=100000000000: input_ids longer than 1e11 tokens never occur -> no cut
        ("workflow.max_chunks", 0, f"{MA}/run.py MemoryAgent_*: RECURRENT_MAX_CONTEXT_LEN=100000000000"),
        ("workflow.max_memory_tokens", 1024, f"{MA}/run.py MemoryAgent_*: RECURRENT_MAX_NEW=1024"),
        ("workflow.max_final_tokens", 1024, f"{MA}/utils/recurrent.py: final call max_tokens=RECURRENT_MAX_NEW"),
        ("workflow.temperature", 0.7, f"{MA}/ruler_hqa.py get_pred: temperature=0.7"),
        ("workflow.top_p", 0.95, f"{MA}/ruler_hqa.py get_pred: top_p=0.95"),
        ("workflow.top_k", -1, f"{MA}/utils/recurrent.py: no top_k in the request"),
        ("workflow.no_memory_text", "No previous memory", f"{MA}/utils/recurrent.py NO_MEMORY"),
        # memory, _ = extract_solution(reply): the reply itself (no </think>), "" stays ""
        ("workflow.empty_memory", "empty", f"{MA}/utils/recurrent.py async_query_llm: memory = the reply"),
        # extract_solution: with "</think>" in the reply, the text after the last one, stripped
        ("workflow.memory_text", "after_think", f"{MA}/utils/__init__.py extract_solution (FORCE_THINK unset)"),
    ],
    "rememr1_eval_official": [
        ("requires_templates", True, "the prompts are utils/rememr1.py TEMPLATE / TEMPLATE_FINAL_BOXED"),
        ("golds", "first", f"{RR}/test_qa.py get_pred: item['answer'] = item['answers'][0]"),
        ("extract", "boxed_published", f"{RR}/test_qa.py get_pred: --api rememr1 -> extract_boxed_answer"),
        ("metric_rules", "memagent", f"{RR}/test_qa.py calc_metrics + utils/__init__.py (MemAgent's file)"),
        ("failed_requests", "drop_or_empty", f"{RR}/test_qa.py get_pred: if output == '': continue"),
        ("strip_text", True, f"{RR}/utils/rememr1.py async_query_llm: context.strip(), input.strip()"),
        ("workflow.name", "rememr1", f"{RR}/run_eval.py ReMemR1_3B / ReMemR1_7B: method='rememr1'"),
        ("workflow.template_style", "str_format", f"{RR}/utils/rememr1.py: TEMPLATE.format(...)"),
        ("workflow.template_strip", False, f"{RR}/utils/rememr1.py: TEMPLATE ends with a newline"),
        ("workflow.chunk_tokens", 5000, f"{RR}/run_eval.py ReMemR1_*: RECURRENT_CHUNK_SIZE=5000"),
        ("workflow.max_chunks", 0, f"{RR}/run_eval.py ReMemR1_*: RECURRENT_MAX_CONTEXT_LEN=100000000000"),
        ("workflow.max_memory_tokens", 2048, f"{RR}/run_eval.py ReMemR1_*: RECURRENT_MAX_NEW=2048"),
        ("workflow.max_final_tokens", 2048, f"{RR}/utils/rememr1.py: final call max_tokens=RECURRENT_MAX_NEW"),
        ("workflow.temperature", 0.7, f"{RR}/test_qa.py get_pred: temperature=0.7"),
        ("workflow.top_p", 0.95, f"{RR}/test_qa.py get_pred: top_p=0.95"),
        ("workflow.top_k", -1, f"{RR}/utils/rememr1.py: no top_k in the request"),
        ("workflow.no_memory_text", "No previous memory", f"{RR}/utils/rememr1.py NO_MEMORY"),
        ("workflow.no_recall_text", "No memory was recalled.", f"{RR}/utils/rememr1.py NO_RECALLED_MEMORY"),
        ("workflow.memory_rule", "strip_recall", f"{RR}/utils/rememr1.py _parse_update_memory2"),
        ("workflow.empty_memory", "empty", f"{RR}/utils/rememr1.py: memory = cleaned.strip(), also ''"),
        ("workflow.query_rule", "greedy_line", f"{RR}/utils/rememr1.py _parse_recall_query: r'<recall>(.+)</recall>'"),
        ("workflow.scorer", "tfidf", f"{RR}/utils/tf_idf_retriever.py TfidfRetriever"),
        # history_memory.add(memory) comes before recall_query / top1_retrieve in the same step
        ("workflow.recall_candidates", "with_current", f"{RR}/utils/rememr1.py async_query_llm: add, then retrieve"),
        # top1_retrieve = retrieve(top_k=1)[0][0]: corpus[argsort(sims)[-1]], returned at any score
        ("workflow.min_recall_score", -1.0, f"{RR}/utils/tf_idf_retriever.py top1_retrieve (no threshold)"),
        # TfidfVectorizer(tokenizer=<tokenizer.tokenize of the lowercased text, "Ġ" removed>); history_memory
        # is a set (the empty memory too); a tie goes to the argsort's last (set order: not fixed)
        ("workflow.recall_scoring", "released", f"{RR}/utils/tf_idf_retriever.py TfidfRetriever._llm_tokenizer"),
    ],
    "vime_eval_official": [
        ("requires_templates", True, "the prompts are eval_ruler_hqa.py _MEMORY_TEMPLATE / _FINAL_TEMPLATE"),
        ("golds", "first", f"{VI}/eval_ruler_hqa.py run_eval: gold = item['answers'][0]"),
        ("extract", "boxed_last300", f"{VI}/eval_ruler_hqa.py run_eval: _extract_boxed(response[-300:])"),
        ("metric_rules", "vime", f"{VI}/eval_ruler_hqa.py run_eval: _f1_score, _exact_match, _sub_exact_match"),
        ("failed_requests", "drop", f"{VI}/eval_ruler_hqa.py run_eval: an exception -> None, counted in n_err"),
        ("strip_text", True, f"{VI}/eval_ruler_hqa.py _recurrent_infer: input.strip(), context.strip()"),
        ("workflow.name", "memagent", f"{VI}/run-eval.sh API=recurrent -> eval_ruler_hqa.py _recurrent_infer"),
        ("workflow.template_style", "str_format", f"{VI}/eval_ruler_hqa.py: _MEMORY_TEMPLATE.format(...)"),
        ("workflow.template_strip", False, f"{VI}/eval_ruler_hqa.py: _MEMORY_TEMPLATE ends with a newline"),
        # run-eval.sh sources _common.sh, which exports MEM_CHUNK_TOKENS=${MEM_CHUNK_TOKENS:-2048}
        ("workflow.chunk_tokens", 2048, f"{VI}/_common.sh MEM_CHUNK_TOKENS=2048"),
        # _common.sh exports MEM_MAX_CHUNKS=64, winning over eval_ruler_hqa.py's os.getenv default 512
        ("workflow.max_chunks", 64, f"{VI}/_common.sh MEM_MAX_CHUNKS=64"),
        ("workflow.truncation", "head", f"{VI}/eval_ruler_hqa.py _recurrent_infer: chunks[:MAX_CHUNKS]"),
        ("workflow.max_memory_tokens", 1024, f"{VI}/_common.sh MEM_MAX_MEMORY=1024"),
        ("workflow.max_final_tokens", 256, f"{VI}/_common.sh MEM_MAX_FINAL=256"),
        ("workflow.temperature", 0.7, f"{VI}/run-eval.sh TEMPERATURE=0.7 (--temperature)"),
        ("workflow.top_p", 0.95, f"{VI}/run-eval.sh TOP_P=0.95 (--top-p)"),
        ("workflow.top_k", -1, f"{VI}/eval_ruler_hqa.py _chat_once: no top_k in the payload"),
        ("workflow.no_memory_text", "No previous memory", f"{VI}/eval_ruler_hqa.py _NO_MEMORY"),
        ("workflow.empty_memory", "keep_previous", f"{VI}/eval_ruler_hqa.py: _strip_stop_tokens(raw) or memory"),
    ],
}

MEMAGENT_TEMPLATES = (
    # our wording, the published placeholders and str.format syntax ({{ }} is a literal brace)
    "Question: {prompt}\nNotes so far:\n{memory}\nPassage:\n{chunk}\nWrite the new notes.\n",
    "Question: {prompt}\nNotes:\n{memory}\nEnd with \"Therefore, the answer is X\" {{no braces}}.\n",
)
VIME_TEMPLATES = (
    MEMAGENT_TEMPLATES[0],
    "Question: {prompt}\nNotes:\n{memory}\nPut the answer in \\boxed{{}}.\n",
)
REMEMR1_TEMPLATES = (
    "Question: {prompt}\nRecalled:\n{recalled_memory}\nNotes so far:\n{memory}\nPassage:\n{chunk}\n"
    "Think in <thinking></thinking>, write <update>notes</update>, ask <recall>query</recall> if needed.\n",
    "Question: {prompt}\nRecalled:\n{recalled_memory}\nNotes:\n{memory}\nPut the answer in \\boxed{{}}.\n",
)


def _template_files(tmp_path: Path, texts: tuple[str, str]) -> list[str]:
    mem, fin = tmp_path / "memory.txt", tmp_path / "final.txt"
    mem.write_text(texts[0])
    fin.write_text(texts[1])
    return [f"workflow.memory_template_file={mem}", f"workflow.final_template_file={fin}"]


def _value(cfg: EvalConfig, spec, wf, key: str):
    """A table key's resolved value: EvalConfig fields, the workflow's name, or its parsed config field."""
    if key == "workflow.name":
        return spec.name
    if key.startswith("workflow."):
        return getattr(wf, key.split(".", 1)[1])
    return getattr(cfg, key)


@pytest.mark.parametrize("preset", sorted(TABLES))
def test_preset_values_match_the_published_scripts(preset, tmp_path):
    texts = REMEMR1_TEMPLATES if preset.startswith("rememr1") else MEMAGENT_TEMPLATES
    cfg = load_config(EvalConfig, _template_files(tmp_path, texts), preset=preset)
    spec, wf = workflow_config(cfg)
    for key, expected, source in TABLES[preset]:
        got = _value(cfg, spec, wf, key)
        assert got == expected and type(got) is type(expected), f"{preset} {key}: {got!r} != {expected!r} ({source})"
    # every key the preset file sets has a row, and every row is a key the file sets
    raw = yaml.safe_load(preset_path(preset).read_text())
    keys = {k for k in raw if k != "workflow"} | {f"workflow.{k}" for k in raw["workflow"]}
    assert keys == {row[0] for row in TABLES[preset]}


@pytest.mark.parametrize("preset", sorted(TABLES))
def test_preset_without_templates_is_one_line_error(preset, tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(EvalConfig, [], preset=preset)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("workflow.memory_template_file, workflow.final_template_file must be set: "
                          "this config has requires_templates=true")
    # one of the two given: only the other is named
    mem = tmp_path / "m.txt"
    mem.write_text(MEMAGENT_TEMPLATES[0])
    with pytest.raises(ConfigError, match=r"^workflow.final_template_file must be set"):
        load_config(EvalConfig, [f"workflow.memory_template_file={mem}"], preset=preset)


def test_inline_templates_satisfy_requires_templates():
    cfg = load_config(EvalConfig, ["workflow.memory_template=M {prompt} {memory} {chunk}",
                                   "workflow.final_template=F {prompt} {memory}"], preset="vime_eval_official")
    assert cfg.requires_templates and cfg.workflow["memory_template"].startswith("M ")
    # memrl's own default: no templates needed
    assert load_config(EvalConfig, []).requires_templates is False


def test_cli_without_templates_exits_2_with_one_line(tmp_path, capsys):
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task("q0", "Q?", "ctx", ["a"], meta={"num_docs": 2})])
    rc = main(["eval", "--preset", "memagent_eval_official", "--model", str(tmp_path), "--out",
               str(tmp_path / "out"), str(data)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1
    assert "workflow.memory_template_file, workflow.final_template_file must be set" in err


# ------------------------------------------------------------------ the published metric rules


@pytest.mark.parametrize(
    "pred, gold, memrl, memagent, vime",
    [
        # empty prediction: memrl 0; MemAgent's `if item["pred"] else 0` -> 0; vime: "" in "paris" -> sub_em 1
        ("", "Paris", (0, 0, 0), (0, 0, 0), (0, 1, 0)),
        # F1 = 2 * (1 * 1/2) / (1 + 1/2) = 2/3; MemAgent rounds it per question to 0.67
        ("Lovelace", "Ada Lovelace", (0, 1, 2 / 3), (0, 1, 0.67), (0, 1, 2 / 3)),
        # yes/no gold: MemAgent's and memrl's F1 give 0 when they differ; vime's: P 1/3, R 1 -> 2(1/3)/(4/3) = 0.5
        ("yes it is", "yes", (0, 1, 0), (0, 1, 0), (0, 1, 0.5)),
        # curly quotes are not string.punctuation: published "“paris”" != "paris" (em 0, one token
        # "“paris”" -> f1 0; sub_em "paris" in "“paris”" -> 1); memrl drops Unicode punctuation -> 1, 1, 1
        ("\u201cParis\u201d", "Paris", (1, 1, 1), (0, 1, 0), (0, 1, 0)),
        # "The" normalizes to "": published sub_em "" in "paris" -> 1 (the guard only sees "The"); memrl 0
        ("The", "Paris", (0, 0, 0), (0, 1, 0), (0, 1, 0)),
    ],
)
def test_metric_rules(pred, gold, memrl, memagent, vime):
    from memrl.rewards.published_metrics import published_qa_metrics
    from memrl.rewards.qa import qa_metrics

    def triple(m):
        return (m["em"], m["sub_em"], m["f1"])

    assert triple(qa_metrics(pred, [gold])) == pytest.approx(memrl)
    assert triple(published_qa_metrics(pred, [gold], "memagent")) == memagent  # exact: already rounded
    assert triple(published_qa_metrics(pred, [gold], "vime")) == pytest.approx(vime)


def test_metric_rules_best_over_golds_and_checked():
    from memrl.rewards.published_metrics import published_qa_metrics

    # golds=any: each metric is the best over the golds ("Lovelace" == the second gold)
    assert published_qa_metrics("Lovelace", ["Ada Lovelace", "Lovelace"], "memagent") == {
        "em": 1.0, "sub_em": 1.0, "f1": 1.0}
    with pytest.raises(ValueError, match="metric_rules must be one of memrl, memagent, vime, got 'squad'"):
        published_qa_metrics("x", ["x"], "squad")
    with pytest.raises(ConfigError, match="metric_rules='squad' is not allowed: must be one of memrl, memagent, vime"):
        load_config(EvalConfig, ["metric_rules=squad"])


def test_metric_rules_round_a_task_metric_like_ruler_general():
    """MemAgent's ruler_general.py get_pred: sub_em = calc_metrics = round(string_match_all, 2) per
    question, 0 when no prediction was read; memrl keeps the fraction."""
    from memrl.types import Trajectory

    task = Task("r0", "q", "ctx", ["123", "456", "789"], meta={"metric": "string_match_all"})
    traj = Trajectory(task_id="r0", trajectory_id="r0-0", segments=[], final_answer="",
                      info={"answer_text": "Therefore, the answer is 123 and 999."})
    # "123 and 999" holds 1 of the 3 references: 1/3 -> memagent 0.33, memrl 0.333...
    _, m = runner.score_prediction(task, traj, "first", "answer_is", "memagent")
    assert m["string_match_all"] == 0.33
    _, m = runner.score_prediction(task, traj, "first", "answer_is", "memrl")
    assert m["string_match_all"] == pytest.approx(1 / 3)
    # no "the answer is": no prediction -> 0 under memagent (the references are not in "" either way)
    traj.info["answer_text"] = "123 456"
    _, m = runner.score_prediction(task, traj, "first", "answer_is", "memagent")
    assert m["string_match_all"] == 0.0


def test_metric_rules_are_part_of_the_scoring_record(tmp_path):
    """A directory scored with metric_rules=memagent refuses to resume under memrl's rules (and back)."""
    from memrl.engines import EngineConfig
    from memrl.errors import UserError

    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task("q0", "number 0", "ctx", ["Ada Lovelace"], meta={"num_docs": 2})])

    def cfg(**kw):
        return EvalConfig(workflow={"name": "memagent", "chunk_tokens": 40}, engine=EngineConfig(model="scripted"),
                          progress=False, **kw)

    reply = ScriptedEngine(lambda p, _: "note" if "<section>" in p else "\\boxed{Lovelace}")
    rows = runner.evaluate([str(data)], tmp_path / "a", cfg(metric_rules="memagent"), engine=reply)
    assert rows[0]["f1"] == 0.67
    with pytest.raises(UserError, match="scoring differ"):
        runner.evaluate([str(data)], tmp_path / "a", cfg(), engine=reply)
    rows = runner.evaluate([str(data)], tmp_path / "b", cfg(), engine=reply)
    assert rows[0]["f1"] == pytest.approx(2 / 3)


# ------------------------------------------------------------------ end to end through the CLI


def _run_cli(monkeypatch, tmp_path, preset, texts, tasks, script, n_docs=2):
    """`memrl eval --preset <preset>` with the scripted engine in place of the model; (rows by question
    number, summary.csv row, engine)."""
    engine = ScriptedEngine(script)
    monkeypatch.setattr(runner, "make_eval_engine", lambda sec: engine)
    data = tmp_path / f"eval_{n_docs}.json"
    write_eval_json(data, tasks)
    out = tmp_path / "out"
    rc = main(["eval", "--preset", preset, "--model", "scripted", "--out", str(out), "--no-progress",
               str(data), *_template_files(tmp_path, texts)])
    assert rc == 0
    rows = {int(re.search(r"number (\d+)", r["question"]).group(1)): r for r in read_results(out / "results.jsonl")}
    with open(out / "summary.csv") as f:
        (summary,) = list(csv.DictReader(f))
    return rows, summary, engine


def _qnum(prompt: str) -> int:
    return int(re.search(r"Question: number (\d+)", prompt).group(1))


def _check_summary(summary, n, em, acc, f1):
    assert int(summary["questions"]) == n
    assert float(summary["em"]) == pytest.approx(em, abs=0.01)
    assert float(summary["accuracy"]) == pytest.approx(acc, abs=0.01)
    assert float(summary["f1"]) == pytest.approx(f1, abs=0.01)


def test_memagent_eval_official_end_to_end(monkeypatch, tmp_path):
    # 12,000 characters = 12,000 tokens of the character tokenizer: chunks of 5000, 5000, 2000 (no cap)
    context = "A" * 5000 + "B" * 5000 + "C" * 2000
    answers = [["Paris", "City of Light"], ["Ada Lovelace", "Lovelace"], ["1969"], ["blue whale"]]
    finals = [
        "Reasoning. Therefore, the answer is Paris.",
        "Therefore, the answer is Lovelace.",
        "\\boxed{1969}",  # no "the answer is": no prediction under answer_is
        "<think>the answer is krill</think> The Answer is big; the answer is **Blue Whale**.",
    ]
    tasks = [Task(f"q{i}", f"number {i}", context, a, meta={"num_docs": 2}) for i, a in enumerate(answers)]

    def script(prompt: str, _: int) -> str:
        i = _qnum(prompt)
        if "Passage:" not in prompt:
            return finals[i]
        letter = re.search(r"Passage:\n(.)", prompt).group(1)
        return "" if (i == 0 and letter == "A") else f"note {letter}"

    rows, summary, engine = _run_cli(monkeypatch, tmp_path, "memagent_eval_official", MEMAGENT_TEMPLATES,
                                     tasks, script)
    # 4 questions x (3 memory calls + 1 final), every call sampled at T 0.7 / top-p 0.95, 1024 new tokens
    assert len(engine.calls) == 16
    assert {(c.sampling.temperature, c.sampling.top_p, c.sampling.max_tokens) for c in engine.calls} == {(0.7, 0.95, 1024)}
    q0 = [c.prompt_text for c in engine.calls if _qnum(c.prompt_text) == 0]
    # the first memory is "No previous memory"; q0's empty first reply gives an EMPTY memory (empty_memory=empty)
    assert "Notes so far:\nNo previous memory\nPassage:\nA" in q0[0]
    assert "Notes so far:\n\nPassage:\nB" in q0[1]
    # str_format: {{no braces}} renders as {no braces}; the file's final newline is part of the prompt
    final = next(p for p in q0 if "Notes:\n" in p)
    assert final.endswith("Notes:\nnote C\nEnd with \"Therefore, the answer is X\" {no braces}.\n</user><assistant>")
    # answer_is, scored against answers[0] only:
    #  q0 "Paris" -> em 1, sub_em 1, f1 1
    #  q1 "Lovelace" vs "Ada Lovelace": em 0, sub_em 1 ("lovelace" in "ada lovelace"), f1 = 2*(1*0.5)/1.5 = 2/3
    #     (golds=any would give em 1 through "Lovelace")
    #  q2 "" (no phrase): 0, 0, 0
    #  q3 after </think>, "*" removed, text after the LAST "the answer is" = "Blue Whale." -> "Blue Whale": 1, 1, 1
    assert [rows[i]["prediction"] for i in range(4)] == ["Paris", "Lovelace", "", "Blue Whale"]
    assert [rows[i]["em"] for i in range(4)] == [1.0, 0.0, 0.0, 1.0]
    assert [rows[i]["sub_em"] for i in range(4)] == [1.0, 1.0, 0.0, 1.0]
    assert rows[1]["f1"] == 0.67  # metric_rules=memagent: rounded to 2 decimals per question
    # table: em 2/4 = 50, accuracy 3/4 = 75, f1 (1 + 0.67 + 0 + 1)/4 = 66.75
    _check_summary(summary, 4, 50.0, 75.0, 66.75)


def test_rememr1_eval_official_end_to_end(monkeypatch, tmp_path):
    context = "A" * 5000 + "B" * 2000  # two memory steps (5000 + 2000 tokens)
    answers = [["Paris", "Lutetia"], ["Ada Lovelace", "Lovelace"], ["New York"]]
    finals = [
        "<think>maybe \\boxed{Rome}</think>So \\boxed{Paris}",  # after </think>: Paris
        "\\boxed{Lovelace}",  # answers[0] only: em 0, sub_em 1, f1 2/3
        "It is \\boxed New York$ ok",  # the published "\boxed ans" form up to "$": New York
    ]
    tasks = [Task(f"q{i}", f"number {i}", context, a, meta={"num_docs": 2}) for i, a in enumerate(answers)]

    def script(prompt: str, _: int) -> str:
        i = _qnum(prompt)
        if "Passage:" not in prompt:
            return finals[i]
        if re.search(r"Passage:\n(.)", prompt).group(1) == "A":
            return "<thinking>t</thinking>\n<update>alpha fact</update>"
        # q1 asks for words no memory holds: the released top-1 still returns a memory (all scores 0). With
        # recall_scoring=released the tie goes to the last candidate in SHA-256 order of the texts (memrl's
        # stand-in for the released set order): "<update>beta</update>" (step 1's own memory, a candidate
        # under with_current) 7bb2c1c6... before step 0's memory ce52f21b... -> step 0's memory
        return "<update>beta</update><recall>zzz</recall>" if i == 1 else "<update>beta</update><recall>alpha fact</recall>"

    rows, summary, engine = _run_cli(monkeypatch, tmp_path, "rememr1_eval_official", REMEMR1_TEMPLATES,
                                     tasks, script)
    assert len(engine.calls) == 9
    assert {(c.sampling.temperature, c.sampling.top_p, c.sampling.max_tokens) for c in engine.calls} == {(0.7, 0.95, 2048)}
    m0 = "<thinking>t</thinking>\n<update>alpha fact</update>"
    for i, recalled in ((0, m0), (1, m0)):
        prompts = [c.prompt_text for c in engine.calls if _qnum(c.prompt_text) == i]
        # strip_recall: the whole reply (thinking and tags included) is the memory
        assert f"Notes so far:\n{m0}\nPassage:\nB" in prompts[1]
        final = next(p for p in prompts if "Notes:\n" in p)
        # q0: "alpha fact" finds step 0's memory; q1: see the script. The memory is step 1's reply
        # minus its recall block.
        assert (f"Recalled:\n{recalled}\nNotes:\n<update>beta</update>\n"
                "Put the answer in \\boxed{}.\n</user>") in final
    assert [rows[i]["prediction"] for i in range(3)] == ["Paris", "Lovelace", "New York"]
    assert [rows[i]["em"] for i in range(3)] == [1.0, 0.0, 1.0]
    assert rows[1]["f1"] == 0.67  # metric_rules=memagent: rounded to 2 decimals per question
    # table: em 2/3 = 66.67, accuracy 3/3 = 100, f1 (1 + 0.67 + 1)/3 = 89.0
    _check_summary(summary, 3, 200 / 3, 100.0, 89.0)


def test_vime_eval_official_end_to_end(monkeypatch, tmp_path):
    # 64 chunks of 2048 tokens and 500 more: head truncation keeps chunks 0..63, the tail is never read
    context = "x" * (64 * 2048) + "TAILWORD" * 62 + "zzzz"
    answers = [["Paris", "Lutetia"], ["Oslo"], ["Ada Lovelace", "Lovelace"], ["1969"]]
    finals = [
        "\\boxed{Paris}",
        # the published "\boxed ans" form (memrl's extract=boxed reads no box here); the 300-character
        # window is tested in test_rewards_parity.py (a reply here is at most 256 tokens = characters)
        "It is \\boxed Oslo$ ok",
        "\\boxed{Lovelace}",
        "no box at all",  # no prediction: vime's sub_em still counts it ("" is in every gold)
    ]
    tasks = [Task(f"q{i}", f"number {i}", context, a, meta={"num_docs": 2}) for i, a in enumerate(answers)]
    steps: dict[int, int] = {}

    def script(prompt: str, _: int) -> str:
        i = _qnum(prompt)
        if "Passage:" not in prompt:
            return finals[i]
        k = steps[i] = steps.get(i, -1) + 1
        return "   " if k == 1 else f"note{k}"  # step 1 replies nothing: the previous memory stays

    rows, summary, engine = _run_cli(monkeypatch, tmp_path, "vime_eval_official", VIME_TEMPLATES, tasks, script)
    assert len(engine.calls) == 4 * 65
    assert all("TAILWORD" not in c.prompt_text for c in engine.calls)
    mem = [c for c in engine.calls if "Passage:" in c.prompt_text]
    fin = [c for c in engine.calls if "Passage:" not in c.prompt_text]
    assert {(c.sampling.temperature, c.sampling.top_p, c.sampling.max_tokens) for c in mem} == {(0.7, 0.95, 1024)}
    assert {(c.sampling.temperature, c.sampling.top_p, c.sampling.max_tokens) for c in fin} == {(0.7, 0.95, 256)}
    q0 = [c.prompt_text for c in mem if _qnum(c.prompt_text) == 0]
    assert "Notes so far:\nnote0\nPassage:" in q0[2]  # after the empty step-1 reply
    assert all(r["metrics"]["tokens_read"] == 64 * 2048 and r["metrics"]["truncated"] == 1.0 for r in rows.values())
    #  q0 "Paris" -> 1, 1, 1; q1 "Oslo" -> 1, 1, 1; q2 "Lovelace" vs "Ada Lovelace" -> em 0, sub_em 1, f1 2/3
    #  q3 "" -> em 0, sub_em 1 (metric_rules=vime), f1 0; memrl's rules give sub_em 0
    assert [rows[i]["prediction"] for i in range(4)] == ["Paris", "Oslo", "Lovelace", ""]
    assert (rows[3]["em"], rows[3]["sub_em"], rows[3]["f1"]) == (0.0, 1.0, 0.0)
    # table: em 2/4 = 50, accuracy 4/4 = 100, f1 (1 + 1 + 2/3 + 0)/4 = 66.67 (unrounded)
    _check_summary(summary, 4, 50.0, 100.0, 200 / 3)


@pytest.mark.slow
def test_vime_eval_official_on_a_tiny_model(tmp_path):
    """The preset through `memrl eval` on a real (tiny, random) local model: sampled at T 0.7 / top-p 0.95
    with the user's str_format templates; the rows are scored by boxed_last300 against answers[0] under
    vime's metric rules.
    The budgets are cut (8 new tokens) only to keep the run short on a CPU."""
    import json

    from memrl.models.tiny import cached_tiny_model
    from memrl.rewards.extract import extract_prediction
    from memrl.rewards.published_metrics import published_qa_metrics

    model = cached_tiny_model("tiny")
    data = tmp_path / "eval_2.json"
    write_eval_json(data, [Task(f"q{i}", f"number {i}", "Paris is in France. " * 30, ["Paris", "France"],
                                meta={"num_docs": 2}) for i in range(3)])
    out = tmp_path / "out"
    rc = main(["eval", "--preset", "vime_eval_official", "--model", str(model), "--out", str(out), "--no-progress",
               str(data), *_template_files(tmp_path, VIME_TEMPLATES), "workflow.max_memory_tokens=8",
               "workflow.max_final_tokens=8", "engine.max_batch_size=1"])
    assert rc == 0
    saved = json.loads((out / "eval_config.json").read_text())
    wf = saved["workflow_config"]
    assert (wf["temperature"], wf["top_p"], wf["chunk_tokens"], wf["max_chunks"], wf["truncation"]) == (
        0.7, 0.95, 2048, 64, "head")
    assert saved["scoring"] == {"golds": "first", "extract": "boxed_last300", "metric_rules": "vime"}
    rows = read_results(out / "results.jsonl")
    assert len(rows) == 3
    for r in rows:
        assert r["model_calls"] == 2  # 600 characters are one 2048-token chunk, then the final call
        assert r["prediction"] == extract_prediction(r["answer_text"], "boxed_last300")
        m = published_qa_metrics(r["prediction"], ["Paris"], "vime")
        assert (r["em"], r["sub_em"], r["f1"]) == (m["em"], m["sub_em"], m["f1"])
    with open(out / "summary.csv") as f:
        (summary,) = list(csv.DictReader(f))
    assert int(summary["questions"]) == 3


def test_recall_candidates_with_current_searches_the_steps_own_memory():
    """ReMemR1 `recall_candidates=with_current` (the released evaluation: utils/rememr1.py adds m_t to
    history_memory before top1_retrieve) against `earlier` (steps < t only), with word overlap scores."""
    import asyncio
    import random

    from memrl.workflows.rememr1 import ReMemR1Config, run

    task = Task("t1", "Q?", "abcdefghijkl", ["x"])  # 3 chunks of 4 characters
    replies = [
        "<update>alpha</update><recall>alpha beta gamma</recall>",
        "<update>beta</update><recall>beta gamma</recall>",
        "<update>gamma</update><recall>gamma alpha</recall>",
        r"\boxed{x}",
    ]

    def recalled(mode: str):
        c = ReMemR1Config(chunk_tokens=4, temperature=0.0, scorer="word_overlap", recall_candidates=mode,
                          memory_template="P:{problem}|R:{recalled_memory}|M:{memory}|C:{chunk}",
                          final_template="P:{problem}|R:{recalled_memory}|M:{memory}|answer:")
        traj = asyncio.run(run(task, ScriptedEngine(list(replies)), c, random.Random(0)))
        return [(s.info["recalled_memory"], s.info["recalled_step"]) for s in traj.segments[:3]]

    # earlier: step 0 has no history; step 1 sees {alpha}: no overlap; step 2 sees {alpha, beta}: alpha
    assert recalled("earlier") == [(None, None), (None, None), ("alpha", 0)]
    # with_current: step 0 "alpha beta gamma" vs {alpha}: 1/3 -> alpha; step 1 "beta gamma" vs {alpha, beta}:
    # beta 1/2; step 2 "gamma alpha" vs {alpha, beta, gamma}: alpha 1/2 = gamma 1/2 -> the most recent, gamma
    assert recalled("with_current") == [("alpha", 0), ("beta", 1), ("gamma", 2)]
    with pytest.raises(ValueError, match="ReMemR1Config.recall_candidates must be one of earlier, with_current"):
        ReMemR1Config(recall_candidates="all")
