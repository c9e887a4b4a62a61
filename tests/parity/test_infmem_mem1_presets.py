"""The infmem_official and mem1_official presets hold the published runs value for value (where memrl can).

Tables written from the published scripts (each row: memrl dotted key, published value, upstream file +
flag), checked against `load_config(TrainConfig, [], preset=NAME)`; then what the infmem preset's reward
and retrieval give on a hand-made case, derived by hand from the released code (recurrent/impls/infmem.py,
verl/workers/reward_manager/thread.py) in the comments.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from functools import cache, reduce

import pytest
from doubles import ScriptedEngine

from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig
from memrl.types import Group, Task
from memrl.workflows.infmem import SPEC, parse_plan, reward, run
from memrl.workflows.rollouts import score_groups

SH = "infmem_4B.sh"  # UCMP13753/InfMem
PY = "recurrent/impls/infmem.py"
VERL = "verl/trainer/config/ppo_trainer.yaml"
M1 = "Mem1/train/train_ppo.sh"  # MIT-MI/MEM1
GEN = "Mem1/train/rollout/llm_agent/generation_think.py"
MY = "Mem1/train/verl/trainer/config/ppo_trainer.yaml"

PUBLISHED: dict[str, list[tuple[str, object, str]]] = {
    "infmem_official": [
        ("workflow.name", "infmem", f"{SH}: recurrent.enable=infmem"),
        ("workflow.chunk_tokens", 5000, f"{SH}: recurrent.infmem.config.chunk_size=5000"),
        ("workflow.max_chunks", 8, f"{VERL}: recurrent.infmem.config.max_chunks"),
        ("workflow.max_memory_tokens", 1536, f"{SH}: recurrent.infmem.config.max_memorization_length=1536"),
        ("workflow.max_plan_tokens", 1536, f"{PY}: plan calls use gen_max_tokens_memorization"),
        ("workflow.max_final_tokens", 1536, f"{PY}: the final call uses gen_max_tokens_memorization"),
        ("workflow.temperature", 1.0, f"{SH}: actor_rollout_ref.rollout.temperature=1"),
        ("workflow.top_p", 1.0, f"{SH}: actor_rollout_ref.rollout.top_p=1.0"),
        ("workflow.truncation", "centre", f"{SH}: data.truncation='center'"),
        ("workflow.retrieve_passage_tokens", 500, f"{PY}: retrieve_chunk_size default 500"),
        ("workflow.retrieve_top_k", 5, f"{PY}: TOP_K = 5, safe_int default 5"),
        ("workflow.require_top_k", True, f"{PY}: args['top_k'] read without a default"),
        ("workflow.retrieval_scorer", "okapi_published", f"{PY}: BM25Okapi(retrieve_docs) on untokenized strings"),
        ("workflow.max_retrieved_chars", 12000, f"{PY}: MAX_RETRIEVED_LENGTH=12000"),
        ("workflow.tool_name", "retrievesearch", f"{PY}: get_bm25search_tool_schema"),
        ("workflow.call_format", "qwen_agent", f"{PY}: _parse_function_calls_from_text"),
        ("workflow.stop_marker", "STOP", f"{PY}: 'STOP' in text"),
        ("workflow.planner_frame", "open_user", f"{PY}: _conversations_to_batch_ids, strip_last_token_if_match"),
        ("workflow.memory_write", "after_think", f"{PY}: extract_memory_from_generation"),
        ("workflow.max_steps_count", "floor", f"{PY}: ctx_length // chunk_size"),
        ("workflow.early_stop_end", "batch", f"{PY}: InfMem.end reads self.step, the batch's step counter"),
        ("workflow.first_step_rule", "published", f"{PY}: end, first_time_answer_in_mem != 0"),
        ("workflow.early_stop_gamma", 0.6, f"{PY}: self.gamma = 0.6"),
        ("workflow.outcome_weight", 0.6, "verl/workers/reward_manager/thread.py: given_score + 0.6 * comp_score"),
        ("workflow.early_stop_weight", 0.6, f"{PY}: end, 0.6 * early_stop_reward"),
        ("workflow.call_protocol_weight", 0.5, f"{PY}: end, 0.5 * all_function_call_success"),
        ("workflow.memory_protocol_weight", 0.5, f"{PY}: end, 0.5 * all_memory_finished"),
        ("workflow.reward", "verl_hotpotqa", "verl/utils/reward_score/hotpotqa.py"),
        ("workflow.require_template_files", True, "the published prompts are the user's to supply"),
        ("data.shuffle", False, f"{SH}: data.shuffle=False"),
        ("algorithm.name", "grpo", f"{SH}: algorithm.adv_estimator=grpo"),
        ("algorithm.n", 4, f"{SH}: actor_rollout_ref.rollout.n=4"),
        ("algorithm.norm_by_std", False, f"{SH}: algorithm.grpo_use_adv=False"),
        ("algorithm.clip_high", 0.2, f"{SH}: actor.clip_ratio_high=0.20"),
        ("algorithm.kl_coef", 0.001, f"{SH}: actor.kl_loss_coef=0.001"),
        ("algorithm.kl_kind", "low_var_kl", f"{SH}: actor.kl_loss_type=low_var_kl"),
        ("algorithm.entropy_coef", 0.0, f"{SH}: actor.entropy_coeff=0.000"),
        ("optim.lr", 1e-6, f"{SH}: actor.optim.lr=1e-6"),
        ("optim.warmup_steps", 20, f"{SH}: actor.optim.lr_warmup_steps=20"),
        ("trainer.batch_size", 128, f"{SH}: data.train_batch_size=128"),
        ("trainer.mini_batches", 16, f"{SH}: actor.ppo_mini_batch_size=8 -> 128 / 8"),
        ("trainer.mini_batch_ranks", 8, f"{SH}: NNODES=1 x NGPUS_PER_NODE=8"),
        ("trainer.save_every", 50, f"{SH}: trainer.save_freq=50"),
        ("val.samples", 4, f"{SH}: val_kwargs.n=4"),
        ("val.top_p", 0.7, f"{SH}: val_kwargs.top_p=0.7"),
        ("val.before_train", False, f"{SH}: trainer.val_before_train=False"),
    ],
    "mem1_official": [
        ("workflow.name", "mem1", f"{GEN}: LLMGenerationManager"),
        ("workflow.max_turns", 6, f"{M1}: MAX_TURNS=6"),
        ("workflow.max_turn_tokens", 1000, f"{M1}: data.max_response_length=1000"),
        ("workflow.max_obs_tokens", 1000, f"{M1}: data.max_obs_length=1000"),
        ("workflow.topk", 3, f"{M1}: retriever.topk=3"),
        ("workflow.max_context_tokens", 4096, f"{M1}: data.max_prompt_length=4096 ({GEN} _update_rolling_state)"),
        ("workflow.context_cap", "rolling", f"{GEN}: _update_rolling_state cuts the whole rolling history"),
        ("workflow.state_tag", "think", f"{GEN}: _calculate_kept_lengths keeps the reply from <think>"),
        ("workflow.result_format", "published", f"{GEN}: _passages2string"),
        ("workflow.reward_scale", "sum", "Mem1/train/verl/utils/reward_score/qa_multiple.py compute_score_em"),
        ("workflow.context", "latest_state", f"{GEN}: mask_using_kept_lengths"),
        ("data.shuffle", True, f"{M1}: data.shuffle_train_dataloader=True"),
        ("algorithm.n", 1, f"{M1}: actor_rollout_ref.rollout.n_agent=1"),
        ("algorithm.kl_coef", 0.001, f"{M1}: algorithm.kl_ctrl.kl_coef=0.001"),
        # issue 59 item 10: what the script leaves to Mem1/train/verl/trainer/config/ppo_trainer.yaml
        ("workflow.top_p", 0.95, f"{MY}: rollout.top_p=0.95; vllm_rollout.py passes every SamplingParams key"),
        ("algorithm.entropy_coef", 0.001, f"{MY}: actor.entropy_coeff=0.001"),
        ("algorithm.old_logprobs", "trainer", "Mem1/train/verl/trainer/ppo/ray_trainer.py fit: compute_log_prob"),
        ("algorithm.ppo.clip_high", 0.2, f"{MY}: actor.clip_ratio=0.2 (one range both ways)"),
        ("algorithm.ppo.dual_clip_c", None, "Mem1/train/verl/trainer/ppo/core_algos.py compute_policy_loss: no dual clip"),
        ("optim.lr", 1e-6, f"{M1}: actor.optim.lr=1e-6"),
        ("optim.warmup_steps", 25, f"{M1}: lr_warmup_steps_ratio=0.05 x total_training_steps=500"),
        ("trainer.steps", 500, f"{M1}: trainer.total_training_steps=500"),
        ("trainer.batch_size", 128, f"{M1}: data.train_batch_size=128"),
        ("trainer.mini_batches", 2, f"{M1}: actor.ppo_mini_batch_size=64 -> 128 / 64"),
        ("trainer.save_every", 20, f"{M1}: trainer.save_freq=20"),
    ],
}
ROWS = [(name, *row) for name, rows in PUBLISHED.items() for row in rows]
TEMPLATES = ["workflow.plan_template=PLAN {problem} {history} {memory}",
             "workflow.memory_template=MEM {problem} {history} {retrieved} {chunk} {memory}",
             "workflow.final_template=FIN {problem} {memory}",
             "workflow.plan_system=SYS"]


@cache
def _config(name: str):
    tpl = TEMPLATES if name == "infmem_official" else []
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu", *tpl], preset=name)
    return cfg, validate(cfg)[1]


@pytest.mark.parametrize("name, key, value, source", ROWS, ids=[f"{n}:{k}" for n, k, _, _ in ROWS])
def test_preset_is_the_published_run(name, key, value, source):
    cfg, wf = _config(name)
    section, *path = key.split(".")
    if key == "workflow.name":
        got = cfg.workflow["name"]
    else:
        got = reduce(getattr, path, wf if section == "workflow" else getattr(cfg, section))
    assert got == value and type(got) is type(value), f"{name}: {key}={got!r}, published {value!r} ({source})"


def test_infmem_preset_without_the_plan_prompt_fails_naming_the_field():
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu", *TEMPLATES[1:]],
                      preset="infmem_official")
    with pytest.raises(ConfigError, match=r"workflow\.plan_template_file is required"):
        validate(cfg)
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu", *TEMPLATES[:3]],
                      preset="infmem_official")
    with pytest.raises(ConfigError, match=r"workflow\.plan_system_file is required"):
        validate(cfg)


def test_infmem_never_stopped_trajectory_scored_at_the_batch_step():
    """infmem.py: `self.step` counts the batch's memory stages (update: += 1 after each), so at `InfMem.end`
    it is the most memory steps any trajectory of the generation batch took. A: 3 chunks, never stops,
    the answer first in memory at step 1 (first_time_answer_in_mem = 1); B: 7 chunks, never finds it. End:
    d = 7 - 1 = 6, early_stop = min(1, 0.6^5) = 0.07776 (A's own count would give 0.6^(3 - 1 - 1) = 0.6).
    A's calls are well formed and every memory has </think>: given = 0.6 * 0.07776 + 0.5 + 0.5, outcome 1
    (boxed Paris): mixed = 1.6 + 0.6 * 0.07776."""
    _, wf = _config("infmem_official")
    wf = dataclasses.replace(wf, chunk_tokens=6, retrieve_passage_tokens=6, temperature=0.0)
    plan = "\u273fFUNCTION\u273f: retrievesearch\n\u273fARGS\u273f: {\"query\": \"city\", \"top_k\": 1}"
    a_task = Task("a", "Where?", "Paris is a city.", ["Paris"])  # 16 characters: 3 chunks of 6
    b_task = Task("b", "Where?", "Paris is a city. Rome too. Oslo is cold.", ["Lima"])  # 40: 7 chunks
    a_replies = [plan, "</think>x", plan, "</think>Paris", plan, "</think>Paris", r"\boxed{Paris}"]
    b_replies = [r for _ in range(7) for r in (plan, "</think>x")] + [r"\boxed{x}"]
    a = asyncio.run(run(a_task, ScriptedEngine(a_replies), wf, random.Random(0)))
    b = asyncio.run(run(b_task, ScriptedEngine(b_replies), wf, random.Random(0)))
    assert [len(t.info["memories"]) for t in (a, b)] == [3, 7]
    groups = [Group("a", [a], task=a_task), Group("b", [b], task=b_task)]
    (sa,), (sb,) = asyncio.run(score_groups(SPEC, groups))
    assert sa.metrics["infmem_early_stop"] == pytest.approx(0.6 ** 5)
    assert sa.reward == pytest.approx(0.6 * 1 + 0.6 * 0.6 ** 5 + 0.5 + 0.5)
    # scored alone (or under memrl's early_stop_end=own): its own 3 steps, 0.6
    assert reward(a_task, a).metrics["infmem_early_stop"] == pytest.approx(0.6)


def test_infmem_plan_prompt_has_the_function_call_system_turn():
    """infmem.py action (plan stage): conv = [{"role": "user", "content": txt}], then
    `_process_messages_for_function_call(conv, self.functions)` (Qwen-Agent's preprocess_fncall_messages
    puts the function-call text in a system turn before it), `_conversations_to_batch_ids` renders it
    without a generation prompt and drops the last id, `strip_last_token_if_match` drops <|im_end|>: the
    prompt is the system turn, then the user turn left open right after its content."""
    _, wf = _config("infmem_official")
    wf = dataclasses.replace(wf, chunk_tokens=6, retrieve_passage_tokens=6, temperature=0.0,
                             plan_system='SYS {"name": "retrievesearch"}')  # read as it is: braces stay
    engine = ScriptedEngine(["STOP", r"\boxed{Paris}"])
    asyncio.run(run(Task("t", "Where?", "Paris is a city.", ["Paris"]), engine, wf, random.Random(0)))
    plan = engine.calls[0].prompt_text
    # the character tokenizer's template renders <role>content</role>; the user turn is cut after its content
    assert plan.startswith('<system>SYS {"name": "retrievesearch"}</system><user>PLAN Where? ')
    assert not plan.endswith("</user>") and "<assistant>" not in plan
    # memrl's chat frame with the same system turn: the user turn closed, the assistant's generation prompt
    engine = ScriptedEngine(["STOP", r"\boxed{Paris}"])
    asyncio.run(run(Task("t", "Where?", "Paris is a city.", ["Paris"]), engine,
                    dataclasses.replace(wf, planner_frame="chat"), random.Random(0)))
    assert engine.calls[0].prompt_text == plan + "</user><assistant>"


def test_infmem_preset_trajectory_reward_by_hand():
    """Under the preset's rules: a planner that calls retrievesearch without top_k (invalid in the released
    code: KeyError -> all_function_call_success = 0, the question searched with top_k 5), a memory reply
    without </think> at step 1 (all_memory_finished = 0, the memory kept), the answer written at step 0
    and a STOP at step 2. Released reward: early_stop = min(1, 0.6^(2 - 0 - 1)) = 0.6 (stopped: the
    step-0 quirk does not apply), given = 0.6 * 0.6 + 0.5 * 0 + 0.5 * 0 = 0.36; outcome 1 (verl_hotpotqa on
    a boxed "Paris"); mixed = 0.36 + 0.6 * 1 = 0.96."""
    _, wf = _config("infmem_official")
    wf = dataclasses.replace(wf, chunk_tokens=6, retrieve_passage_tokens=6, temperature=0.0)
    task = Task("t", "Where?", "Paris is a city. Rome too.", ["Paris"])
    bad = "\u273fFUNCTION\u273f: retrievesearch\n\u273fARGS\u273f: {\"query\": \"city\"}"
    engine = ScriptedEngine([bad, "</think>Paris", "", "no tag", "STOP", r"\boxed{Paris}"])
    traj = asyncio.run(run(task, engine, wf, random.Random(0)))
    assert [s.info["kind"] for s in traj.segments] == ["plan", "memory", "plan", "memory", "plan", "final"]
    assert traj.segments[0].info["retrievals"] == [{"query": "Where?", "top_k": 5, "well_formed": False}]
    score = reward(task, traj)
    assert score.metrics == {"infmem_outcome": 1.0, "infmem_early_stop": pytest.approx(0.6),
                             "infmem_calls_ok": 0.0, "infmem_memories_ok": 0.0}
    assert score.reward == pytest.approx(0.6 * 0.6 + 0.6 * 1.0)


def test_infmem_top_k_read_as_safe_int():
    """infmem.py `safe_int`: int(value) if that is >= 1, else 5; json.loads gives true for a JSON true, and
    int(True) = 1; int(2.9) = 2; "3" -> 3; "x", 0 and "-2" -> 5."""
    _, wf = _config("infmem_official")
    call = "\u273fFUNCTION\u273f: retrievesearch\n\u273fARGS\u273f: {{\"query\": \"q\", \"top_k\": {}}}"
    got = [parse_plan(call.format(v), "Q", wf).calls[0][1] for v in ("true", "2.9", '"3"', '"x"', "0", '"-2"')]
    assert got == [1, 2, 3, 5, 5, 5]
