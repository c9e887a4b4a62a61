"""The fold_official preset holds the published FoldGRPO recipe value for value (each row cites where
upstream says so: FoldAgent scripts/train_bc_qwen3_8b.sh, agents/fold_agent.py, or the paper's section 3.2
where both are silent)."""

from __future__ import annotations

from functools import reduce

import pytest

from memrl.config import load_config
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig

SCRIPT = "scripts/train_bc_qwen3_8b.sh"
AGENT = "agents/fold_agent.py"
PAPER = "arXiv 2510.11967 section 3.2"
FORK = "sunnweiwei/verl@1a68434 verl/trainer/config"
PUBLISHED = [
    ("algorithm.name", "foldgrpo", f"{SCRIPT}: algorithm.adv_estimator=foldgrpo"),
    ("algorithm.n", 8, f"{SCRIPT}: actor_rollout_ref.rollout.n=8"),
    ("trainer.batch_size", 32, f"{SCRIPT}: data.train_batch_size=32"),
    ("trainer.steps", 100, f"{SCRIPT}: trainer.total_training_steps=100"),
    ("trainer.save_every", 10, f"{SCRIPT}: trainer.save_freq=10"),
    ("trainer.mini_batches", 1, f"{SCRIPT}: ppo_mini_batch_size=128 >= train_batch_size=32"),
    ("workflow.max_assistant_turns", 100, f"{SCRIPT}: plugin.max_turn=100"),
    ("workflow.max_turn_tokens", 2048, f"{SCRIPT}: plugin.turn_max_new_tokens=2048"),
    ("workflow.max_context_tokens", 40960, f"{SCRIPT}: MAX_LENGTH=40960 (8192 + 32768)"),
    ("workflow.max_branches", 10, f"{SCRIPT}: plugin.max_session=10"),
    ("workflow.scope_unjudged", "out", "agents/verifier.py judge_scope: no <good> / <fine> in the reply -> -1"),
    ("workflow.branch_turn_budget", "own", f"{AGENT}: react(max_turn=max_turn); iteration += branch turns"),
    ("workflow.response_budget", 32768, "agents/utils.py Agent.step: max_len = first prompt + response_length"),
    ("workflow.min_call_tokens", 10, "agents/utils.py CallLLM._create_completion: max_tokens < 10 -> skip"),
    ("workflow.overlong_mask", False, f"{AGENT}: process_reward and is_train -> mask_rollout = False"),
    ("algorithm.foldgrpo.process_rewards", ["unfolded", "no_branch", "scope", "failure"],
     f"{SCRIPT}: plugin.process_reward='[flat,scope]'; {AGENT}: the terms set on a success"),
    # 0.5 x response_length (32768) unfolded tokens, as a share of the 40960-token budget: 16384 / 40960
    ("algorithm.foldgrpo.unfolded_fraction", 0.4, f"{AGENT}: > config.response_length * 0.5"),
    ("algorithm.foldgrpo.unfolded_penalty", 1.0, f"{AGENT}: set_process_reward(bad_turn, -1)"),
    ("algorithm.foldgrpo.scope_reward", 0.2, f"{AGENT}: set_process_reward(..., -0.2 / 0.2)"),
    ("algorithm.foldgrpo.failure_penalty", 1.0, f"{AGENT}: set_process_reward(i - 1, -1) on tool errors"),
    ("algorithm.foldgrpo.success_only", True, f"{AGENT}: process_item sets the terms under `if score[1] > 0`"),
    ("algorithm.foldgrpo.combine", "replace", "agents/utils.py: Agent.set_process_reward overwrites a turn's value"),
    ("algorithm.foldgrpo.failure_rows", "branch", f"{AGENT}: the tool-error loop runs over `branches`"),
    ("algorithm.foldgrpo.unfolded_spares", "called", f"{AGENT}: bad_turn skips turns holding <function=branch>"),
    ("algorithm.kl_coef", 0.0, f"{PAPER}: no KL term"),
    ("algorithm.ppo.clip_low", 0.2, f"{PAPER}: clip low 0.2"),
    ("algorithm.ppo.clip_high", 0.28, f"{PAPER}: clip high 0.28"),
    ("optim.lr", 1e-6, f"{PAPER}: learning rate 1e-6"),
    # the pinned verl fork (sunnweiwei/verl@1a68434), where the script sets nothing (issue 59 item 1)
    ("optim.warmup_steps", 0, f"{FORK} optim/fsdp.yaml: lr_warmup_steps=-1, lr_warmup_steps_ratio=0.0, constant"),
    ("optim.weight_decay", 0.01, f"{FORK} optim/fsdp.yaml: weight_decay=0.01"),
    ("optim.grad_clip", 1.0, f"{FORK} optim/fsdp.yaml: clip_grad=1.0"),
    ("algorithm.old_logprobs", "trainer", "sunnweiwei/verl@1a68434 verl/trainer/ppo/ray_trainer.py fit: compute_log_prob"),
    ("engine.name", "vllm", f"{SCRIPT}: actor_rollout_ref.rollout.name=vllm"),
]


@pytest.mark.parametrize("key, value, source", PUBLISHED, ids=[k for k, _, _ in PUBLISHED])
def test_fold_official_is_the_published_recipe(key, value, source):
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu"], preset="fold_official")
    _, wf = validate(cfg)
    section, *path = key.split(".")
    root = wf if section == "workflow" else getattr(cfg, section)
    got = reduce(getattr, path, root)
    assert got == value and type(got) is type(value), f"{key}={got!r}, published {value!r} ({source})"
    # 0.4 of the budget is the published 0.5 of the response length
    assert cfg.algorithm.foldgrpo.unfolded_fraction * wf.max_context_tokens == 0.5 * 32768
