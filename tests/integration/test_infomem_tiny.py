"""InfoMem's final-memory reward on the real tiny model: the gain the trainer's workers measure is the
per-token log-likelihood difference a direct forward of the policy gives, and one training step with
algorithm.model_reward=infomem scores every trajectory in the score stage, logging its cost."""

from __future__ import annotations

import pytest
import torch

from memrl.config import load_config
from memrl.rewards.memory_gain import infomem_reward
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.ranks.workers import build_workers
from memrl.training.trainer import Trainer
from memrl.types import Group, Segment, Task, Trajectory
from memrl.workflows import memagent
from memrl.workflows.chunked import template_prompt_ids

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _answer_logprobs(model, prompt: list[int], answer: list[int]) -> list[float]:
    """log_softmax(logits)[a_t] of each answer token after `prompt`, one plain forward (T = 1)."""
    ids = torch.tensor([prompt + answer])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
    return [float(logp[len(prompt) - 1 + t, a]) for t, a in enumerate(answer)]


def test_gain_matches_a_direct_forward(tiny_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_path)
    cfg = load_config(TrainConfig, [f"model.path={tiny_path}", "algorithm.kl_coef=0", "trainer.token_budget=4096"])
    wf = memagent.MemAgentConfig()
    _, fin = wf.templates()
    task = Task("t", "Where is the tower?", "", ["Paris"])
    trajs = []
    for k, memory in enumerate(["The tower is in Paris.", "Nothing useful was read."]):
        prompt = template_prompt_ids(tok, fin, wf.prompt_assembly, wf.enable_thinking, problem=task.question,
                                     memory=memory)
        final = Segment(prompt, [5], [-0.1], step=1, info={"kind": "final", "memory": memory})
        trajs.append(Trajectory("t", f"t#{k}", [final], reward=1.0))
    group = Group("t", trajs, task)

    def prompts(t, traj):
        return memagent.memory_prompts(t, traj, wf, tok)

    without = prompts(task, trajs[0])[1]
    assert without == template_prompt_ids(tok, fin, wf.prompt_assembly, wf.enable_thinking, problem=task.question,
                                          memory=wf.no_memory_text)
    workers = build_workers(cfg)
    try:
        out = infomem_reward([group], scorer=workers.old_logprobs, memory_prompts=prompts, tokenizer=tok,
                             coef=0.5, normalize="minmax")
    finally:
        workers.close()
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    answer = tok.encode("\\boxed{Paris}", add_special_tokens=False)
    base = _answer_logprobs(model, without, answer)
    expected = []
    for traj in trajs:
        lp = _answer_logprobs(model, traj.segments[-1].prompt_ids, answer)
        expected.append(sum(lp) / len(lp) - sum(base) / len(base))
    assert out.values[0] == pytest.approx(expected, abs=1e-5)
    assert expected[0] != pytest.approx(expected[1], abs=1e-6)  # the memories differ, so do their gains
    # minmax over the two successes: the larger gain gets +0.5, the other +0
    hi = 0 if expected[0] > expected[1] else 1
    assert out.rewards[0][hi] == pytest.approx(1.5) and out.rewards[0][1 - hi] == pytest.approx(1.0)
    assert out.metrics["infomem/tokens"] == 2 * (2 * len(answer)) + 2 * len(without) + sum(
        len(t.segments[-1].prompt_ids) for t in trajs)


def test_one_training_step_scores_in_the_score_stage(tiny_path, tmp_path):
    ov = [f"model.path={tiny_path}", f"out_dir={tmp_path / 'run'}", "trainer.steps=1", "workflow=memagent",
          "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
          "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
          "algorithm.kl_coef=0", "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf",
          "trainer.save_every=0", "algorithm.model_reward=infomem",
          "algorithm.infomem.success=0",  # the untrained tiny model never answers right: score every trajectory
          "trainer.dump_every=1"]
    trainer = Trainer(assemble(load_config(TrainConfig, ov)))
    history = trainer.fit()
    m = history[0]
    assert m["infomem/scored"] == 4.0  # 2 tasks x 2 trajectories
    assert m["infomem/tokens"] > 0 and m["time/model_reward_s"] > 0
    import json

    rows = [json.loads(line) for line in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert rows and all("outcome_reward" in r["metrics"] and "infomem" in r["metrics"] for r in rows)


def test_a_workflow_without_a_final_memory_is_refused_before_any_work(tiny_path):
    from memrl.config import ConfigError
    from memrl.training.assemble import validate

    cfg = load_config(TrainConfig, [f"model.path={tiny_path}", "workflow=rememr1", "algorithm.model_reward=infomem"])
    with pytest.raises(ConfigError, match="workflow=rememr1 does not keep"):
        validate(cfg)
