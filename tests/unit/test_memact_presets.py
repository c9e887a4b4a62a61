"""The MemAct DCPO presets load, validate and hold their recipes: memact_official is the public script
value for value (the table below cites each upstream flag), memact_dcpo the same sizes with memrl's rules."""

from __future__ import annotations

from functools import reduce

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate, workflow_config
from memrl.training.config import TrainConfig

SCRIPT = "DCPO/scripts/run_dcpo_7B.sh"
LOOP = "verl/experimental/agent_loop/mem_agent_loop.py"
ACTOR = "verl/trainer/config/actor/actor.yaml"
REWARD = "verl/utils/reward_score/mem_agent.py"
OPENAI = "openai.OpenAI defaults (mem_agent.py: compute_score builds its client without timeout / max_retries)"
JUDGE_URL = "http://127.0.0.1:9527/v1"  # the user's override (the preset leaves the server to them)

# The published recipe, written from the public MemAct repository (one row per preset value):
# (memrl dotted key, published value, where upstream says so: file + flag / key).
PUBLISHED = [
    ("algorithm.name", "dcpo", f"{SCRIPT}: algorithm.adv_estimator=dcpo"),
    ("trainer.batch_size", 128, f"{SCRIPT}: train_batch_size=128 -> data.train_batch_size"),
    ("trainer.mini_batches", 1, f"{SCRIPT}: actor_rollout_ref.actor.ppo_mini_batch_size=128 (= the batch: 128/128)"),
    ("algorithm.n", 8, f"{SCRIPT}: +actor_rollout_ref.rollout.actual_n=8 (trajectories per task)"),
    ("algorithm.segments_per_task", 12, f"{SCRIPT}: actor_rollout_ref.rollout.n=12 (rows per task)"),
    ("algorithm.selection", "published",
     "verl/experimental/agent_loop/agent_loop.py: AgentLoopManager._sampling_random (dcpo_sampling_strategy "
     "unset = random)"),
    ("optim.lr", 1e-6, f"{SCRIPT}: actor_rollout_ref.actor.optim.lr=1e-6"),
    ("optim.warmup_steps", 5, f"{SCRIPT}: actor_rollout_ref.actor.optim.lr_warmup_steps=5"),
    ("optim.weight_decay", 0.01, f"{ACTOR}: optim.weight_decay (unset by the script)"),
    ("optim.grad_clip", 1.0, "verl/trainer/config/actor/dp_actor.yaml: grad_clip (unset by the script)"),
    ("algorithm.kl_coef", 0.001, f"{SCRIPT}: actor_rollout_ref.actor.use_kl_loss=True, kl_loss_coef=0.001"),
    ("algorithm.kl_kind", "low_var_kl", f"{SCRIPT}: actor_rollout_ref.actor.kl_loss_type=low_var_kl"),
    ("algorithm.entropy_coef", 0.0, f"{SCRIPT}: actor_rollout_ref.actor.entropy_coeff=0"),
    ("algorithm.ppo.clip_low", 0.2, f"{ACTOR}: clip_ratio_low (unset by the script)"),
    ("algorithm.ppo.clip_high", 0.2, f"{ACTOR}: clip_ratio_high (unset by the script)"),
    ("algorithm.ppo.dual_clip_c", 3.0, f"{ACTOR}: clip_ratio_c (unset by the script)"),
    ("algorithm.loss_agg", "token-mean", f"{ACTOR}: loss_agg_mode (unset by the script)"),
    ("algorithm.dcpo.eps", 1e-6, "verl/trainer/ppo/core_algos.py: compute_dcpo_outcome_advantage epsilon"),
    ("algorithm.temperature", 0.7, f"{SCRIPT}: actor_rollout_ref.rollout.temperature=0.7"),
    ("algorithm.dynamic_sampling", False, f"{SCRIPT}: no filter_groups flag"),
    ("algorithm.old_logprobs", "trainer",
     "verl/trainer/ppo/ray_trainer.py fit: old_log_prob = actor_rollout_wg.compute_log_prob(batch) before the update"),
    ("workflow.temperature", 0.7, f"{SCRIPT}: actor_rollout_ref.rollout.temperature=0.7"),
    ("workflow.top_p", 0.95, f"{SCRIPT}: actor_rollout_ref.rollout.top_p=0.95"),
    ("workflow.max_assistant_turns", 40, f"{SCRIPT}: actor_rollout_ref.rollout.multi_turn.max_assistant_turns=40"),
    ("workflow.max_turn_tokens", 4096, f"{LOOP}: MemAgentLoop.init_class max_single_turn_tokens default 4096 "
                                       f"(the script does not set multi_turn.max_single_turn_tokens)"),
    ("workflow.max_context_tokens", 4096 + 20480,
     f"{SCRIPT}: max_prompt_length=$((1024 * 4)) + max_response_length=$((1024 * 20))"),
    ("workflow.max_tool_response_chars", 8192, f"{SCRIPT}: actor_rollout_ref.rollout.multi_turn.max_tool_response_length=8192"),
    ("workflow.tool_result_format", "published", "verl/tools/utils/search_r1_like_utils.py: "
     "perform_single_search_batch; mem_agent_loop.py: prune_actual_messages_prompt_ids (JSON results)"),
    ("workflow.excess_tool_calls", "drop", f"{LOOP}: MemAgentLoop.run, tool_calls[: self.max_parallel_calls]"),
    ("workflow.tool_parser", "published", "verl/experimental/agent_loop/tool_parser.py: HermesToolParser "
     "(multi_turn.format hermes)"),
    ("workflow.topk_rule", "published", "DCPO/tool_service/search_tool_single.py: SearchTool.execute, "
     "min(int(topk), 20); search_search_services.py: a falsy topk -> the service's default"),
    ("workflow.tool_truncation_marker", "...(truncated)...", f"{LOOP}: MemAgentLoop._call_tool, "
     "verl/trainer/config/rollout/rollout.yaml tool_response_truncate_side: middle (unset by the script)"),
    ("workflow.max_parallel_calls", 5, "DCPO/config/mem_agent_loop_config.yaml: multi_turn.max_parallel_calls"),
    ("workflow.no_prune_prob", 0.5, f"{SCRIPT}: +actor_rollout_ref.rollout.random_no_prune=True, random_no_prune_prob=0.5"),
    ("workflow.unparsable_tool_calls", "end", f"{LOOP}: MemAgentLoop.run, `if not tool_calls: break`"),
    ("workflow.unknown_tool_calls", "end", f"{LOOP}: MemAgentLoop._call_tool returns the KeyError of "
                                           "self.tools[name]; run breaks on any Exception among the results"),
    ("workflow.last_turn_runs_tools", False, f"{LOOP}: MemAgentLoop.run checks max_assistant_turns before "
                                             "running the turn's calls"),
    ("workflow.prune_id_match", "substring", f"{LOOP}: prune_actual_messages_prompt_ids, `uid in content`"),
    ("workflow.prune_turns_deletable", True, f"{LOOP}: prune_actual_messages_prompt_ids removes any assistant "
                                             "message whose tool calls all went"),
    ("workflow.failed_prune_closes_segment", True, f"{LOOP}: MemAgentLoop.run, `if prune_flag:` closes a segment"),
    ("workflow.withheld_prune_runs", True, f"{LOOP}: MemAgentLoop.run dispatches prune_context by name"),
    ("workflow.final_segment", "whole_context", f"{LOOP}: MemAgentLoop.run, the last row is "
                                                "get_trajactories(actual_messages, -1): mask 1 on every kept turn"),
    ("workflow.turn_tokens", "reencoded", f"{LOOP}: MemAgentLoop.run decodes response_ids[:-1] and re-renders "
                                          "each turn (apply_chat_template), get_trajactories trains those ids"),
    ("workflow.deleted_call_text", "cut", f"{LOOP}: prune_actual_messages_prompt_ids, content.replace("
                                          "restore_as_text(tc), '') for each deleted call of a kept turn"),
    ("workflow.prune_timing", "first", f"{LOOP}: MemAgentLoop.run runs each prune_context call inside its loop "
                                       "over tool_calls and gathers the other calls' tasks after it"),
    ("workflow.prompt_source", "row", f"{LOOP}: MemAgentLoop.run renders the row's messages (raw_prompt, "
                                      "data.return_raw_chat=True in the script) with apply_chat_template"),
    ("workflow.require_final_answer", True, f"{REWARD}: extract_solution_str reads after the last "
                                            "'FINAL_ANSWER: ', compute_score returns 0.0 when there is none"),
    ("workflow.answer_source", "final_context", "verl/experimental/agent_loop/agent_loop.py: AgentLoopManager."
                                                "generate_sequences scores decode(output[-1].response_ids)"),
    ("workflow.judge.required", True, f"{SCRIPT}: reward_model.reward_manager=mem_reward; verl/experimental/"
                                      "agent_loop/agent_loop.py scores every trajectory with compute_score"),
    ("workflow.judge.model", "gpt-oss", f"{REWARD}: compute_score model=\"gpt-oss\" (DCPO/scripts/"
                                        "reward_service.sh: --served-model-name gpt-oss)"),
    ("workflow.judge.max_tokens", 800, f"{REWARD}: compute_score max_tokens=800"),
    ("workflow.judge.temperature", 1.0, f"{REWARD}: compute_score temperature=1.0"),
    ("workflow.judge.top_p", None, f"{REWARD}: compute_score sends no top_p"),
    ("workflow.judge.correct_tag", "<ANSWER_CORRECT>", f"{REWARD}: compute_score, '<ANSWER_CORRECT>' in ..."),
    ("workflow.judge.partial_tag", "<ANSWER_PARTIAL_CORRECT>", f"{REWARD}: create_evaluation_prompt's tags"),
    ("workflow.judge.incorrect_tag", "<ANSWER_INCORRECT>", f"{REWARD}: create_evaluation_prompt's tags"),
    ("workflow.judge.verdict_rule", "contains_correct",
     f"{REWARD}: compute_score, score 1.0 iff '<ANSWER_CORRECT>' in the text after the last 'final<|message|>'"),
    ("workflow.judge.on_failure", "zero", f"{REWARD}: compute_score, any exception -> score 0.0"),
    ("workflow.judge.timeout_s", 600.0, f"{OPENAI}: timeout 600 s"),
    ("workflow.judge.retries", 2, f"{OPENAI}: max_retries 2"),
    ("engine.name", "vllm", f"{SCRIPT}: actor_rollout_ref.rollout.name=vllm"),
    ("engine.vllm.gpu_memory_utilization", 0.7, f"{SCRIPT}: actor_rollout_ref.rollout.gpu_memory_utilization=0.7"),
    ("model.gradient_checkpointing", True, f"{SCRIPT}: actor_rollout_ref.model.enable_gradient_checkpointing=True"),
    ("trainer.save_every", 40, f"{SCRIPT}: trainer.save_freq=40"),
]


def _official(*extra: str):
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu",
                                    f"workflow.judge.url={JUDGE_URL}", *extra], preset="memact_official")
    _, wf = validate(cfg)
    return cfg, wf


@pytest.mark.parametrize("key, value, source", PUBLISHED, ids=[k for k, _, _ in PUBLISHED])
def test_official_preset_is_the_published_recipe(key, value, source):
    cfg, wf = _official()
    section, *path = key.split(".")
    root = wf if section == "workflow" else getattr(cfg, section)
    got = reduce(getattr, path, root)
    assert got == value and type(got) is type(value), f"{key}={got!r}, published {value!r} ({source})"


def test_official_preset_needs_the_judge_url_and_says_so():
    with pytest.raises(ConfigError) as e:
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu"],
                             preset="memact_official"))
    msg = str(e.value)
    assert "\n" not in msg and "workflow.judge.url is required" in msg and "workflow.judge.required=false" in msg
    _, wf = _official()
    assert wf.judge.url == JUDGE_URL and wf.judge.rubric_file is None and wf.tool_schemas_file is None
    # opting out of the judge (memrl's rule reward) is the named switch
    _, wf = validate(load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu",
                                               "workflow.judge.required=false"], preset="memact_official"))
    assert wf.judge.url is None


def test_official_preset_sets_every_rollout_switch_to_its_published_value():
    from memrl.workflows.memact import MemActConfig

    _, wf = _official()
    switches = ("unparsable_tool_calls", "unknown_tool_calls", "last_turn_runs_tools", "prune_id_match",
                "prune_turns_deletable", "failed_prune_closes_segment", "withheld_prune_runs", "final_segment",
                "answer_source", "tool_truncation_marker", "topk_rule",
                "tool_parser", "excess_tool_calls", "tool_result_format", "turn_tokens", "deleted_call_text",
                "prune_timing")
    table = {k.split(".", 1)[1] for k, _, _ in PUBLISHED if k.startswith("workflow.")}
    assert set(switches) <= table
    defaults = MemActConfig()
    assert all(getattr(wf, s) != getattr(defaults, s) for s in switches)  # memrl's defaults are the other values


def test_published_sizes_in_memact_dcpo():
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl"], preset="memact_dcpo")
    a = cfg.algorithm
    assert (a.name, a.n, a.selection, a.segments_per_task, a.temperature) == ("dcpo", 8, "spread_unused", 12, 0.7)
    _, wf = workflow_config(cfg)
    assert (wf.max_assistant_turns, wf.temperature, wf.top_p, wf.no_prune_prob) == (40, 0.7, 0.95, 0.5)
    assert (wf.max_context_tokens, wf.max_turn_tokens, wf.max_tool_response_chars) == (4096 + 20480, 20480, 8192)
    assert (cfg.engine.name, cfg.model.device, cfg.data.name) == ("vllm", "cuda", "file")
    assert (wf.unparsable_tool_calls, wf.prune_id_match, wf.prune_turns_deletable) == ("reply_error", "exact", False)


def test_cpu_memact_dcpo_preset_validates():
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl"], preset="memact_dcpo_cpu")
    spec, wf = validate(cfg)
    a = cfg.algorithm
    assert spec.name == "memact" and (a.name, a.n, a.selection, a.segments_per_task) == ("dcpo", 8, "spread_unused", 12)
    assert wf.temperature == cfg.algorithm.temperature == 1.0 and wf.no_prune_prob == 0.0
    assert wf.retriever_scope == "task" and wf.retriever_corpus is None  # every task searches its own facts
    assert wf.answer_instruction and (cfg.engine.name, cfg.model.device) == ("hf", "cpu")


def test_preset_bad_override_names_the_field():
    with pytest.raises(ConfigError, match="algorithm.n must be >= 2"):
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t", "algorithm.n=1"], preset="memact_dcpo_cpu"))
    with pytest.raises(ConfigError, match="algorithm.segments_per_task=12 must be >= algorithm.n=16"):
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t", "algorithm.n=16"], preset="memact_dcpo_cpu"))
    with pytest.raises(ConfigError, match="algorithm.actual_n .* was removed"):
        load_config(TrainConfig, ["model.path=x", "algorithm.actual_n=8"], preset="memact_dcpo")
