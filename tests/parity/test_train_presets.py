"""The published-recipe training presets hold the published runs value for value.

One table per preset, written from the published scripts (each row: memrl dotted key, published value,
upstream file + flag), checked against `load_config(TrainConfig, [], preset=NAME)`; then the update
schedule and advantages each preset implies on hand-made batches (derived by hand in the comments).
"""

from __future__ import annotations

from functools import cache, reduce

import pytest

from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig
from memrl.training.step.schedule import optimizer_steps
from memrl.types import Group, Segment, Trajectory

MA = "run_memory_7B.sh"  # BytedTsinghua-SIA/MemAgent
VERL = "verl/trainer/config/ppo_trainer.yaml"
RM = "scripts/1_run_train_ReMemR1_3B.sh and _7B.sh"  # syr-cn/ReMemR1
COMMON = "examples/mem_agent/_common.sh"  # vime
RUN4B = "examples/mem_agent/run-qwen3-4b-train.sh"
CONVERT = "examples/mem_agent/custom_convert.py"
ROLLOUT = "examples/mem_agent/rollout.py"
ARGS = "vime/utils/arguments.py"

# The loss and optimizer of verl's actor, as both verl forks' scripts set them (MemAgent and ReMemR1 alike).
_VERL_ACTOR = [
    ("algorithm.loss", "ppo", f"{VERL}: actor policy loss (vanilla PPO clip)"),
    ("algorithm.clip_low", 0.2, f"{VERL}: actor.clip_ratio_low (unset by the script)"),
    ("algorithm.clip_high", 0.2, "actor_rollout_ref.actor.clip_ratio_high=0.20"),
    ("algorithm.dual_clip_c", 3.0, f"{VERL}: actor.clip_ratio_c (unset by the script)"),
    ("algorithm.loss_agg", "token-mean", f"{VERL}: actor.loss_agg_mode (unset by the script)"),
    ("algorithm.kl_coef", 0.001, "actor.use_kl_loss=True actor.kl_loss_coef=0.001"),
    ("algorithm.kl_kind", "low_var_kl", "actor.kl_loss_type=low_var_kl"),
    ("algorithm.entropy_coef", 0.0, "actor.entropy_coeff=0.000"),
    ("algorithm.norm_by_std", False, "algorithm.grpo_use_adv=False"),
    ("algorithm.n", 16, "actor_rollout_ref.rollout.n=16"),
    ("algorithm.temperature", 1.0, "actor_rollout_ref.rollout.temperature=1"),
    ("algorithm.dynamic_sampling", False, "no filter_groups flag"),
    ("algorithm.old_logprobs", "trainer",
     "verl/trainer/ppo/ray_trainer.py fit: old_log_prob = actor_rollout_wg.compute_log_prob(batch) before the update"),
    ("optim.lr", 1e-6, "actor.optim.lr=1e-6"),
    ("optim.warmup_steps", 20, "actor.optim.lr_warmup_steps=20 (warmup_style constant)"),
    ("optim.weight_decay", 0.01, f"{VERL}: actor.optim.weight_decay"),
    ("optim.weight_decay_scope", "all", "verl/workers/fsdp_workers.py: optim.AdamW(actor_module_fsdp.parameters())"),
    ("optim.beta1", 0.9, "verl/workers/fsdp_workers.py: AdamW betas default (0.9, 0.999)"),
    ("optim.beta2", 0.999, "verl/workers/fsdp_workers.py: AdamW betas default (0.9, 0.999)"),
    ("optim.grad_clip", 1.0, f"{VERL}: actor.grad_clip"),
    ("trainer.batch_size", 128, "data.train_batch_size=128"),
    ("trainer.mini_batches", 16, "actor.ppo_mini_batch_size=8: 128 / 8 optimizer steps per batch"),
    ("trainer.mini_batch_split", "rows", "verl/workers/actor/dp_actor.py update_policy -> recurrent/utils.py td_split"),
    ("trainer.mini_batch_rows", 0, "no row-count schedule in verl"),
    ("data.name", "file", "data.train_files"),
    ("data.shuffle", False, "data.shuffle=False"),
    ("workflow.chunk_tokens", 5000, "recurrent.memory.config.chunk_size=5000"),
    ("workflow.max_chunks", 8, f"{VERL}: recurrent.memory.config.max_chunks"),
    ("workflow.temperature", 1.0, "actor_rollout_ref.rollout.temperature=1"),
    ("workflow.truncation", "centre", "data.truncation='center'"),
    ("workflow.empty_memory", "empty", "recurrent/impls/memory.py / memory_revisit.py MemoryAgent.update"),
    ("workflow.template_style", "memrl", "recurrent/utils.py TokenTemplate: no str.format on the template"),
    ("workflow.prompt_assembly", "spliced",
     "recurrent/utils.py TokenTemplate.format: the template's pieces and the values encoded apart, ids spliced"),
    ("workflow.reward", "verl_hotpotqa", "verl/utils/reward_score/hotpotqa.py compute_score"),
    ("workflow.require_template_files", True, "the published prompts are the user's to supply"),
    ("model.gradient_checkpointing", True, "actor_rollout_ref.model.enable_gradient_checkpointing=True"),
    ("engine.name", "vllm", "actor_rollout_ref.rollout.name=vllm (ReMemR1: sglang, served here by vLLM)"),
    ("engine.vllm.gpu_memory_utilization", 0.6, "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"),
]

PUBLISHED: dict[str, list[tuple[str, object, str]]] = {
    "memagent_official": [
        *((k, v, f"{MA}: {s}") for k, v, s in _VERL_ACTOR),
        ("workflow.name", "memagent", f"{MA}: recurrent.enable=memory (recurrent/impls/memory.py)"),
        ("algorithm.name", "grpo", f"{MA}: algorithm.adv_estimator=grpo"),
        ("algorithm.credit", "broadcast", f"{MA}: every call of a trajectory gets the trajectory's advantage"),
        ("workflow.max_memory_tokens", 1024, f"{VERL}: recurrent.memory.config.max_memorization_length"),
        ("workflow.max_final_tokens", 1024, f"{VERL}: recurrent.memory.config.max_final_response_length"),
        ("workflow.top_p", 1.0, f"{MA}: actor_rollout_ref.rollout.top_p=1.0"),
        ("trainer.save_every", 10, f"{MA}: trainer.save_freq=10"),
        ("trainer.mini_batch_ranks", 32, f"{MA}: NNODES=4 x NGPUS_PER_NODE=8 (recurrent/utils.py graceful_padding)"),
        ("trainer.loss_weights", "per_rank",
         "verl/workers/actor/dp_actor.py update_policy: each rank's token mean, gradients averaged over ranks"),
    ],
    "rememr1_official": [
        *((k, v, f"{RM}: {s}") for k, v, s in _VERL_ACTOR),
        ("workflow.name", "rememr1", f"{RM}: recurrent.memory.path=recurrent/impls/memory_revisit.py"),
        ("algorithm.name", "rememr1", f"{RM}: algorithm.adv_estimator=grpo + ray_trainer.py fit's state term"),
        ("algorithm.alpha", 0.8, f"{RM}: ALPHA=0.8, algorithm.alpha=$ALPHA"),
        ("algorithm.state_term", "released", "verl/trainer/ppo/ray_trainer.py fit: the step reward tiled over 2 columns"),
        ("workflow.max_memory_tokens", 2048, f"{VERL}: recurrent.memory.config.max_memorization_length"),
        ("workflow.max_final_tokens", 2048, f"{VERL}: recurrent.memory.config.max_final_response_length"),
        ("workflow.top_p", 0.999, f"{RM}: actor_rollout_ref.rollout.top_p=0.999"),
        ("workflow.memory_rule", "strip_recall", "recurrent/impls/memory_revisit.py _parse_update_memory"),
        ("workflow.query_rule", "greedy_line", "recurrent/impls/memory_revisit.py _parse_recall_query"),
        ("workflow.callback_rule", "released", "verl/trainer/ppo/metric_utils.py compute_action_rewards"),
        ("workflow.format_rule", "released", "verl/trainer/ppo/metric_utils.py compute_format_rewards"),
        ("workflow.memory_gain_rule", "released",
         "verl/trainer/ppo/metric_utils.py compute_action_rewards: update_reward_score"),
        ("workflow.scorer", "tfidf", "recurrent/impls/memory_revisit.py: the recall scorer"),
        ("workflow.recall_scoring", "released",
         "recurrent/impls/tf_idf_retriever.py TfidfRetriever (subword terms; memory_revisit.py keeps a set)"),
        ("workflow.min_recall_score", -1.0, "recurrent/impls/tf_idf_retriever.py top1_retrieve: no threshold"),
        ("trainer.save_every", 20, f"{RM}: trainer.save_freq=20"),
        ("trainer.mini_batch_ranks", 32, f"{RM}: N_NODE=4 x N_GPU=8 (the 7B script; the 3B one runs 16 ranks)"),
        ("trainer.loss_weights", "per_rank",
         "verl/workers/actor/dp_actor.py update_policy: each rank's token mean, gradients averaged over ranks"),
    ],
    "memagent_vime": [
        ("workflow.name", "memagent", f"{COMMON}: --custom-generate-function-path examples.mem_agent.rollout.generate"),
        ("workflow.chunk_tokens", 2048, f"{COMMON}: MEM_CHUNK_TOKENS=2048"),
        ("workflow.max_chunks", 64, f"{COMMON}: MEM_MAX_CHUNKS=64"),
        ("workflow.max_memory_tokens", 1024, f"{COMMON}: MEM_MAX_MEMORY=1024"),
        ("workflow.max_final_tokens", 256, f"{COMMON}: MEM_MAX_FINAL=256"),
        ("workflow.temperature", 1.0, f"{COMMON}: --rollout-temperature 1.0"),
        ("workflow.top_p", 1.0, f"{COMMON}: --rollout-top-p 1.0"),
        ("workflow.truncation", "head", f"{ROLLOUT}: generate, chunks[:MAX_CHUNKS]"),
        ("workflow.empty_memory", "keep_previous", f"{ROLLOUT}: generate, an empty reply keeps the memory"),
        ("workflow.template_style", "str_format", f"{ROLLOUT}: _MEMORY_TEMPLATE.format(...)"),
        ("workflow.reward", "verl_hotpotqa", f"{ROLLOUT}: reward_func (MemAgent's rule; box found before lowercasing)"),
        ("workflow.require_template_files", True, "the published prompts are the user's to supply"),
        ("data.name", "file", f"{COMMON}: --prompt-data"),
        ("data.shuffle", True, f"{COMMON}: --rollout-shuffle"),
        ("algorithm.name", "grpo", f"{COMMON}: --advantage-estimator grpo"),
        ("algorithm.n", 8, f"{RUN4B}: N_SAMPLES_PER_PROMPT=8"),
        ("algorithm.norm_by_std", True, f"{CONVERT}: / (std + 1e-6) under {ARGS} grpo_std_normalization default True"),
        ("algorithm.eps", 1e-6, f"{CONVERT}: std + 1e-6"),
        ("algorithm.credit", "split", f"{CONVERT}: normalized_rewards[i] / len(turns)"),
        ("algorithm.loss", "ppo", f"{ARGS}: --loss-type policy_loss"),
        ("algorithm.clip_low", 0.2, f"{COMMON}: --eps-clip 0.2"),
        ("algorithm.clip_high", 0.3, f"{COMMON}: --eps-clip-high 0.3"),
        ("algorithm.dual_clip_c", None, f"{ARGS}: --eps-clip-c default None"),
        ("algorithm.loss_agg", "seq-mean-token-mean", f"{ARGS}: --calculate-per-token-loss unset (sum_of_sample_mean)"),
        ("algorithm.kl_coef", 0.001, f"{COMMON}: --use-kl-loss --kl-loss-coef 0.001"),
        ("algorithm.kl_kind", "low_var_kl", f"{COMMON}: --kl-loss-type low_var_kl"),
        ("algorithm.entropy_coef", 0.0, f"{ARGS}: --entropy-coef default 0.0"),
        ("algorithm.temperature", 1.0, f"{COMMON}: --rollout-temperature 1.0"),
        ("algorithm.dynamic_sampling", False, f"{COMMON}: no dynamic sampling filter"),
        ("algorithm.old_logprobs", "trainer", f"{ARGS}: --use-rollout-logprobs default False: the actor recomputes them"),
        ("optim.lr", 1e-6, f"{COMMON}: --lr 1e-6"),
        ("optim.warmup_steps", 0, f"{COMMON}: --lr-decay-style constant, no --lr-warmup-iters"),
        ("optim.weight_decay", 0.1, f"{COMMON}: --weight-decay 0.1"),
        ("optim.weight_decay_scope", "matrices", "Megatron-LM megatron/core/optimizer _get_param_groups: no decay "
                                                 "on biases and 1-D parameters"),
        ("optim.beta1", 0.9, f"{COMMON}: --adam-beta1 0.9"),
        ("optim.beta2", 0.98, f"{COMMON}: --adam-beta2 0.98"),
        ("optim.grad_clip", 1.0, f"{ARGS}: --clip-grad reset to 1.0"),
        ("trainer.steps", 100, f"{RUN4B}: NUM_ROLLOUT=100"),
        ("trainer.batch_size", 8, f"{RUN4B}: ROLLOUT_BATCH_SIZE=8"),
        ("trainer.mini_batches", 1, f"{RUN4B}: the schedule is --global-batch-size"),
        ("trainer.mini_batch_rows", 64, f"{RUN4B}: GLOBAL_BATCH_SIZE=64 ({CONVERT}: one row per model call)"),
        ("trainer.mini_batch_rows_tail", "drop", f"{CONVERT}: rows trimmed to a multiple of global_batch_size"),
        ("trainer.save_every", 50, f"{RUN4B}: SAVE_INTERVAL=50"),
        ("model.gradient_checkpointing", True, f"{COMMON}: --recompute-granularity full"),
        ("engine.name", "vllm", f"{COMMON}: vime.rollout.vllm_rollout.generate_rollout"),
        ("engine.vllm.gpu_memory_utilization", 0.7, f"{COMMON}: --vllm-gpu-memory-utilization 0.7"),
    ],
}
ROWS = [(name, *row) for name, rows in PUBLISHED.items() for row in rows]
TEMPLATES = ["workflow.memory_template=M {prompt} {recalled_memory} {memory} {chunk}",
             "workflow.final_template=F {prompt} {recalled_memory} {memory}"]


@cache
def _config(name: str):
    """The preset as `memrl train` reads it, with the user's templates (inline here; files in the integration
    test) and the paths a run needs. Read-only for the callers (cached)."""
    tpl = [t.replace(" {recalled_memory}", "") for t in TEMPLATES] if name != "rememr1_official" else TEMPLATES
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


def test_each_preset_loads_bare_and_names_its_published_values():
    for name in PUBLISHED:
        cfg = load_config(TrainConfig, [], preset=name)  # no overrides at all: the preset alone
        assert cfg.model.device == "cuda" and cfg.model.dtype == "bfloat16" and cfg.engine.name == "vllm"


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_official_preset_without_template_files_fails_naming_the_file_field(name):
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu"], preset=name)
    with pytest.raises(ConfigError, match=r"workflow\.memory_template_file is required \(workflow\."
                                          r"require_template_files=true"):
        validate(cfg)
    # the memory prompt alone is not enough: the final one is named next
    cfg = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu", TEMPLATES[0]],
                      preset=name)
    with pytest.raises(ConfigError, match=r"workflow\.final_template_file is required"):
        validate(cfg)


def test_memrl_presets_and_defaults_do_not_require_template_files():
    for name in ("memagent_grpo", "memagent_grpo_8gpu", "demo_cpu"):
        validate(load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu"], preset=name))


# ------------------------------------------------------------------ the schedule each preset implies


def _batch(tasks: int, n: int, memory_calls) -> list[Group]:
    """`tasks` groups of `n` trajectories; trajectory j of group g makes memory_calls(g, j) memory calls,
    then one final call. Reward 1 for trajectory 0 of each group, 0 for the others."""
    groups = []
    for g in range(tasks):
        trajs = []
        for j in range(n):
            k = memory_calls(g, j)
            segs = [Segment([1], [2], [-1.0], step=t, info={"kind": "memory"}) for t in range(k)]
            segs.append(Segment([1], [2], [-1.0], step=k, info={"kind": "final"}))
            trajs.append(Trajectory(f"q{g}", f"q{g}#{j}", segs, reward=1.0 if j == 0 else 0.0))
        groups.append(Group(f"q{g}", trajs))
    return groups


def _steps(cfg, groups: list[Group]) -> list[list[Segment]]:
    t = cfg.trainer
    return optimizer_steps([g.segments() for g in groups], t.mini_batches, t.mini_batch_split, t.mini_batch_rows,
                           t.mini_batch_rows_tail)


@pytest.mark.parametrize("name", ["memagent_official", "rememr1_official"])
def test_verl_presets_take_16_optimizer_steps_on_verls_row_cut(name):
    cfg, _ = _config(name)
    # 128 tasks x 16 trajectories; trajectory j of group g reads 1 + (g % 3) chunks.
    # Groups with g % 3 == 0, 1, 2: 43, 43, 42 (of 0..127); rows per trajectory 2, 3, 4.
    # Rows: 16 * (43 * 2 + 43 * 3 + 42 * 4) = 16 * 383 = 6128; 6128 / 16 = 383 per step exactly.
    groups = _batch(128, 16, lambda g, j: 1 + g % 3)
    steps = _steps(cfg, groups)
    assert [len(s) for s in steps] == [383] * 16
    # verl's order: every trajectory's first memory call comes first (2048 of them), so the first 5 steps
    # (5 * 383 = 1915 rows) are first calls only; the 2048 finals come last: the last 5 steps (1915) and the
    # last 133 rows of the 11th step, whose first 383 - 133 = 250 rows are memory calls.
    kinds = [[s.info["kind"] for s in step] for step in steps]
    assert all(s.info["kind"] == "memory" and s.step == 0 for st in steps[:5] for s in st)
    assert kinds[10].count("memory") == 250 and kinds[10][250:] == ["final"] * 133
    assert all(set(k) == {"final"} for k in kinds[11:])


def test_vime_preset_steps_every_64_rows_and_drops_the_tail():
    cfg, _ = _config("memagent_vime")
    # 8 tasks x 8 trajectories; trajectory j makes 1 + j % 3 memory calls, so rows 2, 3, 4, 2, 3, 4, 2, 3 = 23 per
    # group, 184 per batch: 184 // 64 = 2 steps of 64 rows; the last 56 rows are dropped (vime's trim).
    groups = _batch(8, 8, lambda g, j: 1 + j % 3)
    steps = _steps(cfg, groups)
    assert [len(s) for s in steps] == [64, 64]
    flat = [s for g in groups for s in g.segments()]
    assert [id(s) for st in steps for s in st] == [id(s) for s in flat[:128]]  # batch order, no reordering
    # memrl's default keeps the tail as a third, smaller step
    kept = optimizer_steps([g.segments() for g in groups], every_rows=64, tail="step")
    assert [len(s) for s in kept] == [64, 64, 56]
    # fewer rows than 64 (one group: 23): vime keeps them all, trim_to == 0 -> total
    assert [len(s) for s in _steps(cfg, groups[:1])] == [23]
    # 128 rows exactly: nothing to drop
    assert [len(s) for s in optimizer_steps([[Segment([1], [2], [0.0])] * 128], every_rows=64, tail="drop")] == [64, 64]


def test_unknown_tail_is_an_error():
    with pytest.raises(ValueError, match="unknown mini-batch tail 'keep'"):
        optimizer_steps([[Segment([1], [2], [0.0])]], every_rows=1, tail="keep")
    with pytest.raises(ConfigError, match=r"trainer\.mini_batch_rows_tail='keep' is not allowed: must be one of step, drop"):
        load_config(TrainConfig, ["trainer.mini_batch_rows_tail=keep"])


def _advantages(name: str, groups: list[Group]) -> list[list[float]]:
    from memrl.algorithms.advantages import compute_group_advantages
    from memrl.training.assemble import algorithm_options

    cfg, _ = _config(name)
    compute_group_advantages(groups, cfg.algorithm.name, algorithm_options(cfg)[0])
    return [[s.advantage for s in t.segments] for t in groups[0].trajectories]


def test_advantages_the_presets_give():
    # One group, rewards [1, 0, 0, 0, 0, 0, 0, 0] (n = 8 here for both), trajectory j with 1 + j % 3 memory calls.
    # MemAgent (grpo_use_adv=False): A = r - mean = 0.875 / -0.125, on every row of the trajectory.
    adv = _advantages("memagent_official", _batch(1, 8, lambda g, j: 1 + j % 3))
    assert adv[0] == [0.875] * 2 and adv[1] == [-0.125] * 3 and adv[2] == [-0.125] * 4
    # vime: (r - mean) / (std + 1e-6), std unbiased: sum of squares 0.875^2 + 7 * 0.125^2 = 0.875, / 7 = 0.125,
    # std = sqrt(0.125) = 0.3535534; A_0 = 0.875 / 0.3535544 = 2.4748667; split over the rows: / 2 (2 rows),
    # the others -0.125 / 0.3535544 = -0.3535524, / 3 and / 4.
    adv = _advantages("memagent_vime", _batch(1, 8, lambda g, j: 1 + j % 3))
    a0, a1 = 0.875 / (0.125 ** 0.5 + 1e-6), -0.125 / (0.125 ** 0.5 + 1e-6)
    assert adv[0] == pytest.approx([a0 / 2] * 2, rel=1e-12) and a0 == pytest.approx(2.4748667, rel=1e-6)
    assert adv[1] == pytest.approx([a1 / 3] * 3, rel=1e-12) and adv[2] == pytest.approx([a1 / 4] * 4, rel=1e-12)
