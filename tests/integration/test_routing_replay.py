"""MoE routing replay (memrl.training.routing) on the tiny Qwen3-MoE: the routing of a recorded pass,
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
from memrl.training.packing import collate, weigh
from memrl.training.policy import token_logprobs
from memrl.training.routing import RoutingReplay, bytes_per_token, routers
from memrl.training.workers import PolicyWorker
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
    picked = [torch.zeros(0, 2)]
    if replay == "r2":
        assert len(w.routing.recorded) == 4
        picked = [w.routing.recorded[id(r)][0] for r in rows]
    else:
        probe = RoutingReplay(w.model)
        with torch.no_grad(), probe.record(collate(rows, None, 0).input_ids.shape[1], [r.num_tokens for r in rows],
                                           list(range(4))):
            token_logprobs(w.model, collate(rows, None, 0))
        probe.close()
        picked = [probe.recorded[i][0] for i in range(4)]
    _move_router(w.model, collate(rows, None, 0), torch.cat(picked))
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
