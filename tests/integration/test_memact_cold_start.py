"""MemAct cold start and DCPO on the CPU task: the scripted agent's SFT rows are the rows RL trains (same
ids and masks for the same trajectory), and a DCPO step on memact trains exactly the selected segments."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from memrl.config import load_config
from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks
from memrl.data.tasks_jsonl import write_tasks
from memrl.demonstrators import ScriptedEngine
from memrl.demonstrators.memact import MemActDemonstrator, prune_reply, search_reply
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


@pytest.fixture(scope="module")
def task_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("memact_task")
    tasks = make_tasks(MemActTaskConfig(sub_questions=[3]), 2, seed=12)  # each task searches its own fact sheet
    write_tasks(d / "tasks.jsonl", tasks)
    return d, tasks


def _scripted(script, model):  # noqa: ANN001, ANN202
    """The run's engine: a ScriptedEngine playing `script` with the model's tokenizer."""
    from transformers import AutoTokenizer

    return ScriptedEngine(script, tokenizer=AutoTokenizer.from_pretrained(model))


def _coin_per_call(prompt: str, i: int) -> str:
    """A coin per model call (by call index): the MemAct demonstrator pruning late with probability 0.5."""
    return MemActDemonstrator(late_prob=0.5, seed=i)(prompt)


class _ScriptedTrainer(Trainer):
    """Keeps each step's groups and the rows reaching the loss (its engine: `_scripted`)."""

    def select(self, groups):
        self.seen = (groups, [])
        return super().select(groups)

    def train_rows(self, batch, **kw):
        self.seen[1].extend(batch.segments)
        return super().train_rows(batch, **kw)


def _cfg(model, out, data, budget, **extra) -> TrainConfig:
    ov = [f"model.path={model}", f"out_dir={out}", "trainer.steps=1", "workflow=memact",
          "workflow.retriever_scope=task", f"workflow.max_context_tokens={budget}",
          "workflow.max_turn_tokens=96", "workflow.no_prune_prob=0.0", "data.name=file", f"data.path={data}",
          "algorithm.name=dcpo", "algorithm.selection=spread_unused", "trainer.batch_size=2", "algorithm.kl_coef=0.0", "optim.lr=1e-4",
          "trainer.progress=false", "trainer.tensorboard=false", "trainer.dump_every=0", "trainer.seed=3"]
    return load_config(TrainConfig, ov + [f"{k}={v}" for k, v in extra.items()])


def _budget(tokenizer, tasks):
    from memrl.demonstrators.stages import calibrate_budget
    from memrl.workflows.memact import MemActConfig

    return calibrate_budget(tasks, tokenizer, MemActConfig(retriever_scope="task", max_turn_tokens=96))


def test_sft_rows_equal_the_rl_rows_of_the_same_trajectory(tiny_path, task_files, tmp_path):
    from transformers import AutoTokenizer

    from memrl.demonstrators.stages import memact_demonstrations as demonstrations
    from memrl.workflows.memact import MemActConfig

    d, tasks = task_files
    tok = AutoTokenizer.from_pretrained(tiny_path)
    budget = _budget(tok, tasks)
    # the cold start's rows: the demo's own path (the workflow's segments, as sft_train reads them)
    wf = MemActConfig(retriever_scope="task", max_context_tokens=budget, max_turn_tokens=96)
    groups = demonstrations(tasks, tok, wf, late_prob=0.0, seed=0)
    sft = [s for g in groups for s in g.trajectories[0].segments]
    # RL: DCPO over the same flawless script (every sample of a task is the same trajectory); n=4 of 4 train
    trainer = _ScriptedTrainer(assemble(_cfg(tiny_path, tmp_path / "rl", d / "tasks.jsonl", budget,
                                             **{"algorithm.n": 2, "algorithm.segments_per_task": 4}),
                                        engine=_scripted(MemActDemonstrator(late_prob=0.0), tiny_path)))
    (h,) = trainer.fit()
    rl = trainer.seen[1]
    assert h["train/rows"] == 8 == len(rl) and h["dcpo/available"] == 8
    key = lambda r: (tuple(r.prompt_ids), tuple(r.response_ids), tuple(r.loss_mask))  # noqa: E731
    assert sorted(key(r) for r in rl) == sorted(key(r) for r in sft for _ in range(2))
    # hand check of the masks: a 3-question task is search, search, prune | search, answer; mask 1 exactly on
    # the sampled ids (reply + EOS) of those turns, 0 on tool results and chat markers
    eos = 1  # each sampled reply ends with EOS
    for g, task in zip(groups, tasks, strict=True):
        first, final = g.trajectories[0].segments
        names = task.meta["entities"]
        attrs = task.meta["attributes"]
        replies = [search_reply(attrs[0], names[0]), search_reply(attrs[1], names[1])]
        facts = [(n, a, v) for n, a, v in zip(names, attrs, task.answers, strict=True)][:2]
        replies.append(prune_reply(facts, ["r1", "r2"]))
        want = sum(len(tok.encode(r, add_special_tokens=False)) + eos for r in replies)
        assert sum(first.loss_mask) == want and first.info["kind"] == "prune"
        assert first.loss_mask[0] == 1 and first.loss_mask[-1] == 1 and 0 in first.loss_mask
        assert first.info["memory"] == prune_reply(facts, []).split('"memory": "')[1].split('"')[0].strip()
        assert final.info["kind"] == "final" and g.rewards[0] == 1.0


def test_dcpo_step_on_memact_trains_exactly_the_selected_segments(tiny_path, task_files, tmp_path):
    from transformers import AutoTokenizer

    from memrl.algorithms.selection import spread_unused_segments

    d, tasks = task_files
    budget = _budget(AutoTokenizer.from_pretrained(tiny_path), tasks)
    # a coin per model call (by call index): samples of one task differ, some prune (2 segments, reward 1),
    # some prune late and overflow (1 segment, reward 0)
    trainer = _ScriptedTrainer(assemble(_cfg(tiny_path, tmp_path / "rl", d / "tasks.jsonl", budget,
                                    **{"algorithm.n": 4, "algorithm.segments_per_task": 5}),
                                        engine=_scripted(_coin_per_call, tiny_path)))
    (h,) = trainer.fit()
    groups, rows = trainer.seen
    counts = sorted(len(t.segments) for g in groups for t in g.trajectories)
    assert set(counts) == {1, 2}, counts  # both outcomes occur
    for g in groups:
        for t in g.trajectories:
            assert g.rewards[g.trajectories.index(t)] == float(len(t.segments) == 2)
    rng = random.Random("dcpo:3:0")  # the trainer's: trainer.seed 3, step 0, one rng over the groups in order
    want = [s for g in groups for s in spread_unused_segments(g, 5, rng)]
    key = lambda r: (r.trajectory_id, tuple(r.prompt_ids), tuple(r.response_ids))  # noqa: E731
    assert sorted(key(r) for r in rows) == sorted(key(s) for s in want)
    assert len(rows) == h["train/rows"] == h["dcpo/selected"] == sum(min(5, len(g.segments())) for g in groups)
    assert h["dcpo/available"] == sum(counts)
    assert h["dcpo/pruned_share"] == sum(c == 2 for c in counts) / len(counts)
    # every selected segment carries its trajectory's DCPO advantage
    for g in groups:
        rs = g.rewards
        mean = sum(rs) / len(rs)
        std = (sum((r - mean) ** 2 for r in rs) / (len(rs) - 1)) ** 0.5
        for t, r in zip(g.trajectories, rs, strict=True):
            for s in t.segments:
                assert s.advantage == pytest.approx((r - mean) / (std + 1e-6))


def test_late_scripted_agent_overflows_the_budget(tiny_path, task_files):
    from transformers import AutoTokenizer

    from memrl.demonstrators.stages import memact_demonstrations as demonstrations
    from memrl.workflows.memact import MemActConfig

    d, tasks = task_files
    tok = AutoTokenizer.from_pretrained(tiny_path)
    budget = _budget(tok, tasks)
    wf = MemActConfig(retriever_scope="task", max_context_tokens=budget, max_turn_tokens=96)
    late = [g.trajectories[0] for g in demonstrations(tasks, tok, wf, late_prob=1.0, seed=0)]
    assert all(t.info["stop"] == "context_budget" and t.metrics["searches"] == 3 and t.reward == 0.0 for t in late)
    assert all(len(t.segments) == 1 and t.metrics["prunes"] == 0 for t in late)
    wide = [g.trajectories[0] for g in demonstrations(tasks, tok, replace(wf, max_context_tokens=10**6), 1.0, 0)]
    assert all(t.reward == 1.0 for t in wide)  # with room for three results the late agent is right


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_dcpo_memact_step_on_cuda(tiny_path, task_files, tmp_path):
    """One DCPO step of the scripted MemAct agent with the policy on CUDA: the selected rows train there."""
    import torch
    from transformers import AutoTokenizer

    d, tasks = task_files
    budget = _budget(AutoTokenizer.from_pretrained(tiny_path), tasks)
    trainer = _ScriptedTrainer(assemble(_cfg(tiny_path, tmp_path / "rl", d / "tasks.jsonl", budget,
                                    **{"algorithm.n": 4, "algorithm.segments_per_task": 5,
                                       "model.device": "cuda"}),
                                        engine=_scripted(_coin_per_call, tiny_path)))
    before = _initial_state(tiny_path)
    (h,) = trainer.fit()
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert h["train/rows"] == h["dcpo/selected"] == len(trainer.seen[1]) > 0
    after = {k: v.detach().cpu() for k, v in trainer.model.state_dict().items()}
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the step moved the weights


def _initial_state(path):
    from transformers import AutoModelForCausalLM

    return {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(path).state_dict().items()}
