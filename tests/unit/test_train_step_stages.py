"""One `Trainer.train_step` on CPU without a model: `Trainer(assemble(...))` over a ScriptedEngine and stub
workers. The stages run in the open (sample -> score -> advantages -> selection -> update -> sync) and
every value is checked by hand: rewards, step rewards, ReMemR1 advantages, the rows the workers get."""

from __future__ import annotations

from pathlib import Path

from doubles import CharTokenizer, ScriptedEngine

from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer
from memrl.types import Task


class StubWorkers:
    """The worker-group calls a step makes, recorded; no model."""

    def __init__(self) -> None:
        self.rows: list[list] = []
        self.closed = False

    def train_rows(self, batch, step_scheduler=True):  # noqa: ANN001, ANN201
        # one weight per row, from the driver (token-mean: 1 / the mini-batch's trained tokens, every row)
        total = sum(s.num_trained_tokens for s in batch.segments)
        assert batch.weights == [1.0 / total] * len(batch.segments) and batch.batch_rows == len(batch.segments)
        self.rows.append(list(batch.segments))
        return {"train/rows": float(len(batch.segments)), "train/loss": 0.0}

    def weights_for_engines(self):  # noqa: ANN201
        return {}

    def close(self) -> None:
        self.closed = True


def _config(tmp_path: Path) -> TrainConfig:
    cfg = TrainConfig()
    cfg.out_dir = str(tmp_path / "run")
    cfg.model.path = "stub"  # the stub workers load nothing; the config is checked as any run's
    cfg.data.name, cfg.data.path, cfg.data.shuffle = "file", "unused.jsonl", False
    cfg.workflow = {"name": "memagent", "chunk_tokens": 100, "max_memory_tokens": 50, "max_final_tokens": 50}
    a = cfg.algorithm
    a.name, a.n, a.selection = "rememr1", 2, "all"
    a.rememr1.alpha, a.rememr1.norm_by_std, a.rememr1.state_term = 0.8, False, "paper"
    cfg.trainer.batch_size, cfg.trainer.concurrency, cfg.trainer.dump_every = 1, 1, 1
    return cfg


def _trainer(tmp_path: Path, script: list[str], workflow=None) -> tuple[Trainer, StubWorkers, ScriptedEngine]:  # noqa: ANN001
    cfg = _config(tmp_path)
    tok = CharTokenizer()
    engine = ScriptedEngine(script, tokenizer=tok)
    workers = StubWorkers()
    tasks = [Task("q0", "Where is the tower?", "The tower is in Paris.", ["Paris"])]
    parts = assemble(cfg, workflow=workflow, workers=workers, engine=engine, tokenizer=tok, tasks=tasks)
    return Trainer(parts), workers, engine


def test_one_train_step_hand_checked(tmp_path):
    # concurrency 1: q0#0 makes calls 0-1 (memory, final), then q0#1 calls 2-3
    trainer, workers, engine = _trainer(tmp_path, ["Paris", "\\boxed{Paris}", "nothing", "\\boxed{Rome}"])
    try:
        metrics = trainer.train_step()
    finally:
        trainer.parts.runtime.close()
    assert len(engine.calls) == 4 and engine.weight_updates == 1  # one sync after the update
    (rows,) = workers.rows  # one optimizer step with every segment (selection "all")
    assert metrics["reward/mean"] == 0.5 and metrics["reward/accuracy"] == 0.5
    # ReMemR1, alpha 0.8, no std division: A_out = r - mean = +-0.5; A_state: memory key [1, 0] -> +-0.5,
    # final key [1, 1] -> 0; A = 0.8 * A_out + (1 - 0.8) * A_state
    mem0, fin0 = 0.8 * 0.5 + (1 - 0.8) * 0.5, 0.8 * 0.5
    mem1, fin1 = 0.8 * -0.5 + (1 - 0.8) * -0.5, 0.8 * -0.5
    assert [r.advantage for r in rows] == [mem0, fin0, mem1, fin1]
    assert [r.trajectory_id for r in rows] == ["q0@e0#0", "q0@e0#0", "q0@e0#1", "q0@e0#1"]
    eos = [1]
    assert [r.response_ids for r in rows] == [CharTokenizer().encode(t) + eos for t in
                                              ("Paris", "\\boxed{Paris}", "nothing", "\\boxed{Rome}")]
    assert metrics["advantage/max"] == mem0 and metrics["advantage/min"] == mem1
    # MemAgent's own trajectory metrics under their names; no other workflow's
    assert metrics["rollout/answer_seen"] == 0.5 and metrics["rollout/answer_kept"] == 0.5
    assert metrics["rollout/memory_tokens_mean"] == (len("Paris") + 1 + len("nothing") + 1) / 2
    assert metrics["rollout/segments"] == 4.0 and metrics["train/rows"] == 4.0
    assert not any(k.startswith("judge/") for k in metrics)
    # the dump (every step here) reads the question from the group's Task; the records keep step rewards
    import json

    dumped = [json.loads(x) for x in (Path(trainer.parts.out) / "trajectories.jsonl").read_text().splitlines()]
    assert [d["question"] for d in dumped] == ["Where is the tower?"] * 2
    assert [[s["step_reward"] for s in d["steps"]] for d in dumped] == [[1.0, 1.0], [0.0, 1.0]]
    assert trainer.dumped_rows == dumped


def test_a_swapped_outcome_reward_keeps_the_step_rewards_rememr1_needs(tmp_path):
    """The rememr1 estimator takes the step rewards the score stage returns (WorkflowSpec.step_rewards),
    so replacing the outcome reward no longer leaves it without them."""
    import dataclasses

    from memrl.training.assemble import workflow_config

    spec, wf = workflow_config(_config(tmp_path))
    swapped = dataclasses.replace(spec, reward=lambda task, traj: 1.0 if "Paris" in traj.final_answer else 0.25)
    trainer, workers, _ = _trainer(tmp_path, ["Paris", "\\boxed{Paris}", "nothing", "\\boxed{Rome}"],
                                   workflow=(swapped, wf))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.parts.runtime.close()
    # outcome 1 / 0.25 -> A_out = +-0.375; step rewards as before -> A_state +-0.5 (memory), 0 (final)
    (rows,) = workers.rows
    assert metrics["reward/mean"] == (1.0 + 0.25) / 2
    assert [r.advantage for r in rows] == [0.8 * 0.375 + (1 - 0.8) * 0.5, 0.8 * 0.375,
                                           0.8 * -0.375 + (1 - 0.8) * -0.5, 0.8 * -0.375]


class RecomputingWorkers(StubWorkers):
    """StubWorkers with the recompute of algorithm.old_logprobs=trainer: every response token gets -0.25."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, int]] = []  # (rows asked, optimizer steps taken before)

    def old_logprobs(self, rows):  # noqa: ANN001, ANN201
        self.calls.append((len(rows), len(self.rows)))
        return [[-0.25] * len(r.response_ids) for r in rows]

    def train_rows(self, batch, step_scheduler=True):  # noqa: ANN001, ANN201
        assert all(s.old_logprobs == [-0.25] * len(s.response_ids) for s in batch.segments)
        return super().train_rows(batch, step_scheduler)


def test_old_logprobs_recomputed_once_before_the_first_optimizer_step(tmp_path):
    cfg = _config(tmp_path)
    cfg.algorithm.old_logprobs = "trainer"
    tok = CharTokenizer()
    engine = ScriptedEngine(["Paris", "\\boxed{Paris}", "nothing", "\\boxed{Rome}"], tokenizer=tok)
    workers = RecomputingWorkers()
    tasks = [Task("q0", "Where is the tower?", "The tower is in Paris.", ["Paris"])]
    trainer = Trainer(assemble(cfg, workers=workers, engine=engine, tokenizer=tok, tasks=tasks))
    try:
        metrics = trainer.train_step()
    finally:
        trainer.parts.runtime.close()
    # one call over the step's 4 rows (2 trajectories x memory + final), before any optimizer step
    assert workers.calls == [(4, 0)] and len(workers.rows) == 1 and len(workers.rows[0]) == 4
    assert 0 <= metrics["time/old_logprobs_s"] <= metrics["time/update_s"]
