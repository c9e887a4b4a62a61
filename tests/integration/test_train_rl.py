"""RL training end to end on the tiny model (CPU): weights change, checkpoints load, resume is exact."""

from __future__ import annotations

import pytest
import torch
from doubles import register_parity_workflow

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


register_parity_workflow("memagent_parity")


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _cfg(model: str, out, steps: int, **extra: str) -> TrainConfig:
    ov = [
        f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memagent_parity",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6",
        "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=3", "algorithm.kl_coef=0.01", "algorithm.entropy_coef=0.001",
        "optim.lr=1e-3", "optim.warmup_steps=2", "trainer.save_every=2", "trainer.token_budget=600",
        "trainer.progress=false", "trainer.tensorboard=false", "engine.name=hf",
    ] + [f"{k}={v}" for k, v in extra.items()]
    return load_config(TrainConfig, ov)


def test_three_steps_change_weights_and_save_loadable_checkpoint(tiny_path, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    before = AutoModelForCausalLM.from_pretrained(tiny_path).state_dict()
    trainer = Trainer(assemble(_cfg(tiny_path, tmp_path / "run", 3)))
    history = trainer.fit()
    assert len(history) == 3
    assert all(h["train/micro_batches"] >= 2 for h in history)  # the token budget split every batch
    ckpt = tmp_path / "run" / "checkpoints" / "step_000003"
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_000003"
    loaded = AutoModelForCausalLM.from_pretrained(ckpt)
    AutoTokenizer.from_pretrained(ckpt)
    after = loaded.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed, "RL steps did not change any weight"
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, after[k])
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 3 and '"reward/mean"' in lines[0] and '"loss/kl"' in lines[0]


def test_resume_is_exact(tiny_path, tmp_path):
    straight = Trainer(assemble(_cfg(tiny_path, tmp_path / "a", 4)))
    hist_a = straight.fit()
    first = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 2)))
    first.fit()
    resumed = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 4), resume=True))
    hist_b = resumed.fit()
    assert resumed.state.position == straight.state.position
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    sa, sb = straight.parts.workers.opt.state_dict()["state"], resumed.parts.workers.opt.state_dict()["state"]
    for i in sa:
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa[i][k], sb[i][k])
    for x, y in zip(hist_a[2:], hist_b, strict=True):
        assert x["reward/mean"] == y["reward/mean"] and x["loss/total"] == y["loss/total"]


def _logprobs(model, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """log_softmax(logits)[token] of each completion token under `model` (T = 1)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None]).squeeze(1)


def test_resume_with_http_engine_samples_from_the_checkpoint(tiny_path, tmp_path):
    """A server started on the INITIAL model: the resumed trainer must load the checkpoint into it before
    its first rollout (the bug: the first resumed step sampled from the initial policy)."""
    from doubles import CompletionServer
    from transformers import AutoModelForCausalLM

    from memrl.engines.hf import HFEngine
    from memrl.training.checkpoints.checkpoint import latest_checkpoint

    Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 2))).fit()
    ckpt = latest_checkpoint(tmp_path / "b" / "checkpoints")
    with CompletionServer(HFEngine(tiny_path, max_batch_size=64, seed=0, deterministic=False)) as server:
        cfg = _cfg(tiny_path, tmp_path / "b", 3, **{"engine": "openai", "engine.openai.base_url": server.url})
        Trainer(assemble(cfg, resume=True)).fit()
        events = list(server.events)
    assert events[0] == ("load", str((tmp_path / "b" / "engine_weights").resolve()))
    first = next(e for e in events if e[0] == "complete")
    _, prompt, tokens, served = first
    at_ckpt = _logprobs(AutoModelForCausalLM.from_pretrained(ckpt), prompt, tokens)
    at_init = _logprobs(AutoModelForCausalLM.from_pretrained(tiny_path), prompt, tokens)
    served = torch.tensor(served)
    assert torch.allclose(served, at_ckpt, atol=1e-4), (served - at_ckpt).abs().max()
    assert (served - at_init).abs().max() > 1e-2  # the initial policy would be told apart
    # after the resumed step's update the server got the new weights too, then the run ended
    assert [e[0] for e in events].count("load") == 2 and events[-1][0] == "load"


class _RecordingTrainer(Trainer):
    """Keeps each step's groups and the rows that reach the loss, to check DCPO's selection."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, list, list]] = []  # (step, groups, rows)

    def select(self, groups):
        self.seen.append((self.step, groups, []))
        return super().select(groups)

    def train_rows(self, batch, **kw):
        self.seen[-1][2].extend(batch.segments)
        return super().train_rows(batch, **kw)


def _dcpo(**extra: str) -> dict[str, str]:
    return {"algorithm.name": "dcpo", "algorithm.n": "3", "algorithm.selection": "spread_unused",
            "algorithm.segments_per_task": "4", **extra}


def test_dcpo_step_trains_exactly_the_selected_segments(tiny_path, tmp_path):
    import random

    from memrl.algorithms.selection import spread_unused_segments

    trainer = _RecordingTrainer(assemble(_cfg(tiny_path, tmp_path / "d", 2, **_dcpo(**{"trainer.seed": "7"}))))
    history = trainer.fit()
    assert [s for s, _, _ in trainer.seen] == [0, 1]
    for (step, groups, rows), h in zip(trainer.seen, history, strict=True):
        assert len(groups) == 2 and all(len(g.trajectories) == 3 for g in groups)  # algorithm.n per task
        # one memory chunk + the final answer: 2 segments per trajectory, 6 per group, 4 of them train
        assert all(len(t.segments) == 2 for g in groups for t in g.trajectories)
        rng = random.Random(f"dcpo:7:{step}")
        want = [s for g in groups for s in spread_unused_segments(g, 4, rng)]
        key = [(s.trajectory_id, tuple(s.prompt_ids), tuple(s.response_ids)) for s in want]
        got = [(r.trajectory_id, tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows]
        assert sorted(got) == sorted(key) and len(set(key)) == 8
        assert h["train/rows"] == 8 and h["dcpo/selected"] == 8 and h["dcpo/available"] == 12
        assert h["dcpo/segments_per_trajectory"] == 2 and h["dcpo/pruned_share"] == 1.0
        assert h["rollout/segments"] == 12


def test_dcpo_group_with_fewer_segments_than_n_trains_each_once(tiny_path, tmp_path):
    trainer = _RecordingTrainer(assemble(_cfg(tiny_path, tmp_path / "f", 1, **_dcpo(**{"algorithm.segments_per_task": "12"}))))
    (h,) = trainer.fit()
    (_, groups, rows) = trainer.seen[0]
    every = sorted((s.trajectory_id, tuple(s.prompt_ids)) for g in groups for s in g.segments())
    assert sorted((r.trajectory_id, tuple(r.prompt_ids)) for r in rows) == every
    assert h["train/rows"] == 12 == h["dcpo/selected"] == h["dcpo/available"]


@pytest.mark.parametrize("selection, rows", [("spread_unused", 8), ("published", 8)])
def test_dcpo_resume_is_exact(tiny_path, tmp_path, selection, rows):
    sel = {"algorithm.selection": selection}
    straight = Trainer(assemble(_cfg(tiny_path, tmp_path / "a", 2, **_dcpo(**sel))))
    hist_a = straight.fit()
    Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 1, **_dcpo(**sel, **{"trainer.save_every": "1"})))).fit()
    resumed = Trainer(assemble(_cfg(tiny_path, tmp_path / "b", 2, **_dcpo(**sel)), resume=True))
    hist_b = resumed.fit()
    assert len(hist_b) == 1 and resumed.state.position == straight.state.position
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    x, y = hist_a[1], hist_b[0]
    assert x["loss/total"] == y["loss/total"] and x["dcpo/selected"] == y["dcpo/selected"] == rows


def test_dcpo_published_selection_trains_exactly_its_rows_repeats_included(tiny_path, tmp_path):
    import random

    from memrl.algorithms.selection import published_segments

    # 3 trajectories of 2 segments per task, 7 rows: one each, then 4 slots cycle over the shuffled 3
    # (positions 0, 1, 2, 0): the first of the cycle gets 2 more, so it has no unused segment left for the
    # second and repeats one: exactly 1 repeated row per group, 2 per step
    sel = {"algorithm.selection": "published", "algorithm.segments_per_task": "7", "trainer.seed": "7"}
    trainer = _RecordingTrainer(assemble(_cfg(tiny_path, tmp_path / "p", 1, **_dcpo(**sel))))
    (h,) = trainer.fit()
    (step, groups, rows) = trainer.seen[0]
    rng = random.Random(f"dcpo:7:{step}")
    want = [s for g in groups for s in published_segments(g, 7, rng)]
    key = [(s.trajectory_id, tuple(s.prompt_ids), tuple(s.response_ids)) for s in want]
    got = [(r.trajectory_id, tuple(r.prompt_ids), tuple(r.response_ids)) for r in rows]
    assert sorted(got) == sorted(key) and len(rows) == 14 == h["train/rows"] == h["dcpo/selected"]
    assert h["dcpo/repeated"] == 2 and len(set(key)) == 12
