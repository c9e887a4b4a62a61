"""MoE routing replay (memrl.training.update.routing) on the tiny Qwen3-MoE: the routing of a recorded pass,
replayed on a model whose router now picks other experts, gives the recorded pass's log-probabilities to
float tolerance; the same model routing afresh does not.

How the router is moved, by hand: layer 0's expert 0 gets a router row that keeps its logit on the tokens
that picked it and makes it the largest logit (by 5) on every other token, so routing afresh it wins every
token. Under replay the recorded experts are used, and their gate weights (the softmax over the replayed
experts' logits, none of which changed) are the recorded pass's: the same network, to float rounding."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from transformers import AutoModelForCausalLM

from memrl.config import ConfigError, load_config
from memrl.models.tiny import cached_tiny_model
from memrl.training.config import TrainConfig
from memrl.training.ranks.workers import PolicyWorker
from memrl.training.update.packing import collate, weigh
from memrl.training.update.policy import token_logprobs
from memrl.training.update.routing import RoutingReplay, bytes_per_token, routers
from memrl.types import Segment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def moe_path():
    return str(cached_tiny_model("tiny-qwen3-moe"))


def _rows(vocab: int) -> list[Segment]:
    rng = random.Random(5)
    rows = []
    for i in range(4):
        p, n = rng.randint(4, 12), rng.randint(3, 8)
        rows.append(Segment([rng.randrange(vocab) for _ in range(p)], [rng.randrange(vocab) for _ in range(n)],
                            [-1.0] * n, advantage=0.5 if i % 2 else -0.5, trajectory_id=f"t{i}"))
    return rows


def _move_router(model: torch.nn.Module, mb, picked: torch.Tensor) -> None:
    """Layer 0's expert 0 gets a new router row w solving w . h_t = its old logit on the real tokens that
    picked it and (that token's largest logit + 5) on every other real token (h_t: the router's inputs, 192
    dimensions for ~40 tokens: least squares solves it exactly, to float rounding)."""
    router = routers(model)[0]
    seen: list[torch.Tensor] = []
    hook = router.register_forward_hook(lambda m, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        token_logprobs(model, mb)
    hook.remove()
    real = mb.attention_mask.reshape(-1).bool()
    h = seen[0].reshape(-1, seen[0].shape[-1])[real].double()
    logits = h @ router.weight.detach().double().T
    chose = (picked.long() == 0).any(-1)
    assert chose.any() and (~chose).any(), "precondition: expert 0 picked by some real tokens, not all"
    target = torch.where(chose, logits[:, 0], logits.max(-1).values + 5.0)
    w = torch.linalg.lstsq(h, target.unsqueeze(-1)).solution.squeeze(-1)
    assert (h @ w - target).abs().max() < 1e-6
    with torch.no_grad():
        router.weight[0] = w.to(router.weight.dtype)


def _layer0_picks(model: torch.nn.Module, rows: list[Segment]) -> torch.Tensor:
    """Layer 0's experts of every real token of `rows` under `model` (a recording pass)."""
    mb = collate(rows, None, 0)
    probe = RoutingReplay(model)
    with torch.no_grad(), probe.record(mb.input_ids.shape[1], [r.num_tokens for r in rows], list(range(len(rows)))):
        token_logprobs(model, mb)
    probe.close()
    return torch.cat([probe.recorded[i][0] for i in range(len(rows))])


def test_replay_gives_the_recorded_log_probs_where_free_routing_does_not(moe_path):
    model = AutoModelForCausalLM.from_pretrained(moe_path).eval()
    rows = _rows(model.config.vocab_size)
    mb = collate(rows, None, 0)
    width, lengths = mb.input_ids.shape[1], [r.num_tokens for r in rows]
    rr = RoutingReplay(model)
    assert bytes_per_token(model) == 4 * 2  # 4 MoE layers x top-2, one byte each
    with torch.no_grad(), rr.record(width, lengths, keys=list(range(4))):
        recorded, _ = token_logprobs(model, mb)
    assert [rr.recorded[i].shape for i in range(4)] == [(4, n, 2) for n in lengths]
    assert all(rr.recorded[i].dtype == torch.uint8 for i in range(4))
    moved = copy.deepcopy(model)
    rr.close()
    _move_router(moved, mb, torch.cat([rr.recorded[i][0] for i in range(4)]))
    real = mb.loss_mask > 0
    with torch.no_grad():
        free, _ = token_logprobs(moved, mb)
    assert (free - recorded)[real].abs().max() > 1e-2  # routing afresh: another network
    replay = RoutingReplay(moved)
    replay.recorded = rr.recorded
    with torch.no_grad(), replay.replay(list(range(4)), width):
        replayed, _ = token_logprobs(moved, mb)
    assert torch.allclose(replayed[real], recorded[real], atol=1e-4)
    with torch.no_grad(), replay.replay([None] * 4, width):  # no record: free routing
        assert torch.equal(token_logprobs(moved, mb)[0], free)


def _cfg(model: str, tmp, replay: str) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", f"out_dir={tmp}", "algorithm.kl_coef=0",
                                     "algorithm.old_logprobs=trainer", f"algorithm.routing_replay={replay}",
                                     "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=60",
                                     "trainer.progress=false"])


@pytest.mark.parametrize("replay", ["r2", "none"])
def test_r2_update_replays_the_old_logprob_pass(moe_path, tmp_path, replay):
    """The worker's old-logprob pass records (r2); its router is then moved as above (standing in for
    whatever moves the routing between the passes); the update's forward with r2 matches the recorded log-probs
    (mismatch/current_vs_old ~ 0), without r2 it does not."""
    w = PolicyWorker(_cfg(moe_path, tmp_path, replay))
    rows = _rows(w.model.config.vocab_size)
    for r, lp in zip(rows, w.old_logprobs(rows), strict=True):
        r.old_logprobs = lp
    if replay == "r2":
        assert len(w.routing.recorded) == 4
    _move_router(w.model, collate(rows, None, 0), _layer0_picks(w.model, rows))
    out = w.train_rows(weigh(rows, "token-mean"))
    diff = out["mismatch/current_vs_old/abs_logprob_diff_mean"]
    if replay == "r2":
        assert diff < 1e-4
    else:
        assert diff > 1e-3


def test_r2_settings_are_refused_where_they_cannot_work(moe_path, tmp_path):
    from memrl.errors import UserError

    cfg = load_config(TrainConfig, [f"model.path={moe_path}", "algorithm.routing_replay=r2"])
    with pytest.raises(ConfigError, match=r"^algorithm.routing_replay=r2 does not support algorithm.old_logprobs=engine"):
        cfg.check()
    dense = str(cached_tiny_model("tiny"))
    with pytest.raises(UserError, match="algorithm.routing_replay=r2: .*needs a mixture-of-experts model"):
        PolicyWorker(_cfg(dense, tmp_path, "r2"))


def _rollout(path: str, stagger: bool = False) -> list[Segment]:
    """4 calls through the hf engine (padded cache, batched) recording its routing (r3), as segments;
    `stagger`: the last two arrive while the first two decode (a second prefill merged into the batch). Few
    enough tokens (under 192, the hidden size) for _move_router's exact solve."""
    import asyncio

    from memrl.engines.base import SamplingParams
    from memrl.engines.hf import HFEngine
    from memrl.training.update.routing import EngineRouting
    from memrl.workflows.chunked import call_segment

    eng = HFEngine(path, max_batch_size=8, max_wait_ms=0.0 if stagger else 50.0, seed=0, deterministic=not stagger,
                   kv_cache="padded")  # r3 records the padded cache's forwards
    eng.routing = EngineRouting(eng.model)
    rng = random.Random(7)
    prompts = [[rng.randrange(eng.vocab_size) for _ in range(rng.randint(4, 12))] for _ in range(4)]

    async def run():
        if not stagger:
            return await asyncio.gather(*(eng.generate(p, SamplingParams(max_tokens=6, seed=i))
                                          for i, p in enumerate(prompts)))
        first = [asyncio.ensure_future(eng.generate(p, SamplingParams(max_tokens=24, seed=i)))
                 for i, p in enumerate(prompts[:2])]
        while eng.stats.decode_steps < 3:  # the first two are decoding
            await asyncio.sleep(0.001)
        rest = [eng.generate(p, SamplingParams(max_tokens=16, seed=2 + i)) for i, p in enumerate(prompts[2:])]
        return list(await asyncio.gather(*first, *rest))

    outs = asyncio.run(run())
    if stagger:  # a later prefill merged into the decoding batch of 4 rows (the late two arrive together or,
        # on a loaded machine, one engine step apart: two or three prefills)
        assert eng.stats.prefill_calls in (2, 3) and eng.stats.batch_sizes[4] > 0
    asyncio.run(eng.close())
    segs = [call_segment(p, o, 0, {}) for p, o in zip(prompts, outs, strict=True)]
    for i, s in enumerate(segs):
        s.advantage, s.trajectory_id = (0.5 if i % 2 else -0.5), f"t{i}"
    return segs


@pytest.mark.parametrize("stagger", [False, True])
def test_r3_replays_the_engine_routing_in_the_trainer(moe_path, stagger):
    """The hf engine's recorded experts (every fed token: prompt + generated - 1, 4 layers x top-2 bytes each)
    replayed on a trainer model whose router was moved give the engine's own sampling log-probs to float
    tolerance; routing afresh does not. Staggered: requests admitted while others decode (merged batches)."""
    segs = _rollout(moe_path, stagger)
    assert [tuple(s.routing.shape) for s in segs] == [(4, s.num_tokens - 1, 2) for s in segs]
    model = AutoModelForCausalLM.from_pretrained(moe_path).eval()
    mb = collate(segs, None, 0)
    real = mb.loss_mask > 0
    engine_lp = mb.old_logprobs[real]
    with torch.no_grad():
        same, _ = token_logprobs(model, mb)
    assert torch.allclose(same[real], engine_lp, atol=1e-4)  # the same weights: the engine's numbers
    _move_router(model, mb, _layer0_picks(model, segs))
    rr = RoutingReplay(model)
    rr.recorded = {i: s.routing for i, s in enumerate(segs)}
    with torch.no_grad():
        free, _ = token_logprobs(model, mb)
        with rr.replay(list(range(4)), mb.input_ids.shape[1]):
            replayed, _ = token_logprobs(model, mb)
    assert (free[real] - engine_lp).abs().max() > 1e-2
    assert torch.allclose(replayed[real], engine_lp, atol=1e-4)


@pytest.mark.parametrize("replay", ["r3", "none"])
def test_r3_update_log_probs_equal_the_rollouts(moe_path, tmp_path, replay):
    """In the worker's update (old logprobs = the engine's), mismatch/hf/abs_logprob_diff_mean compares the
    update's forward with the rollout's log-probs: below 1e-4 with r3 on the moved router, above 1e-3 without."""
    segs = _rollout(moe_path)
    cfg = load_config(TrainConfig, [f"model.path={moe_path}", f"out_dir={tmp_path}", "algorithm.kl_coef=0",
                                    f"algorithm.routing_replay={replay}", "optim.lr=1e-3", "optim.warmup_steps=0",
                                    "trainer.token_budget=60", "trainer.progress=false", "engine.hf.kv_cache=padded"])
    cfg.check()
    w = PolicyWorker(cfg)
    _move_router(w.model, collate(segs, None, 0), _layer0_picks(w.model, segs))
    diff = w.train_rows(weigh(segs, "token-mean"))["mismatch/hf/abs_logprob_diff_mean"]
    assert diff < 1e-4 if replay == "r3" else diff > 1e-3


def test_r3_settings_are_refused_where_they_cannot_work(moe_path):
    for extra, what in ((["engine.name=vllm"], "engine.name=vllm"),
                        (["engine.hf.kv_cache=slots"], "engine.hf.kv_cache=slots")):
        cfg = load_config(TrainConfig, [f"model.path={moe_path}", "algorithm.routing_replay=r3", *extra])
        with pytest.raises(ConfigError, match=f"^algorithm.routing_replay=r3 does not support {what}"):
            cfg.check()


@pytest.mark.parametrize("replay", ["r2", "r3"])
def test_one_memagent_rl_step_replays_every_row(moe_path, tmp_path, replay):
    """End to end (assemble -> Trainer): the memagent calls' rows all carry the rollout's experts (r3: the hf
    engine recorded them, one byte per layer and top-k slot per fed token) or the old-logprob pass's (r2),
    and the step trains on them."""
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    cfg = load_config(TrainConfig, [
        f"model.path={moe_path}", f"out_dir={tmp_path}", "trainer.steps=1", "workflow=memagent",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6", "workflow.max_final_tokens=3",
        "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8", "trainer.batch_size=2", "algorithm.n=2",
        "optim.lr=1e-3", "optim.warmup_steps=0", "trainer.token_budget=600", "trainer.progress=false",
        "trainer.loggers=[jsonl]", "engine.name=hf", "algorithm.old_logprobs=trainer",
        f"algorithm.routing_replay={replay}", "engine.hf.kv_cache=padded"])
    trainer = Trainer(assemble(cfg))
    worker = trainer.parts.workers.handles[0].worker
    (step,) = trainer.fit()
    assert step["train/rows"] == 8 and len(worker.routing.recorded) == 8
    shapes = [tuple(t.shape) for t in worker.routing.recorded.values()]
    assert all(s[0] == 4 and s[2] == 2 for s in shapes)
    assert step["mismatch/current_vs_old/abs_logprob_diff_mean"] < 1e-4  # the first step: the same network
