"""trainer.prefix_sharing (memrl.training.update.prefix_sharing): the trie grouping by hand-derivable cases, and the
shared forward's logprobs, entropy, loss and gradients equal to the per-row forward's on every workflow's rows.

Tolerances (float32): logprobs and entropy 1e-5 absolute, loss 1e-6 relative, gradients 1e-5 of the largest
entry (measured: logprobs 5e-7, gradients 2e-9 of 9e-3 on random rows: the same ops, the attention's sum
over masked keys in another order).
"""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

from memrl.config import ConfigError, load_config
from memrl.models.tiny import cached_tiny_model
from memrl.training.config import TrainConfig
from memrl.training.step.step_metrics import combine_step_metrics
from memrl.training.update import prefix_sharing as P
from memrl.training.update.lora import BaseReference
from memrl.training.update.packing import collate, weigh
from memrl.training.update.policy import ppo_micro_loss, token_logprobs
from memrl.types import Segment

VOCAB = 64


# ------------------------------------------------------------------------------------------- grouping


def test_two_rows_sharing_twenty_tokens_form_one_group_the_others_stay_alone():
    a, b = [1] * 20 + [2, 3], [1] * 20 + [4, 5]
    c, d = [1] * 10 + [9] * 12, [7] * 5
    assert P.share_groups([a, b, c, d], 16) == [(20, [0, 1])]
    plan = P.plan_shares([a, b, c, d], 16)
    assert plan.groups == ((0, 1),) and plan.prefix == (20,)
    assert plan.row_tokens == 22 * 3 + 5 and plan.forwarded_tokens == 22 * 3 + 5 - 20


def test_the_larger_saving_wins_and_a_tie_takes_the_larger_group():
    a, b, c = [1] * 20 + [2, 3], [1] * 20 + [4, 5], [1] * 10 + [9] * 12
    # all three share 10 tokens (saving 2 x 10) or a and b share 20 (saving 20): a tie, the larger group
    assert P.share_groups([a, b, c], 10) == [(10, [0, 1, 2])]
    a2, b2 = [1] * 30 + [2], [1] * 30 + [4]
    assert P.share_groups([a2, b2, c], 10) == [(30, [0, 1])]  # 30 saved beats 2 x 10
    # two disjoint families, sorted apart by the trie
    e, f = [5] * 18 + [1], [5] * 18 + [2]
    assert P.share_groups([a2, e, b2, f], 16) == [(30, [0, 2]), (18, [1, 3])]


def test_every_row_keeps_its_last_token_as_suffix():
    short, long = [1] * 20, [1] * 20 + [5, 5, 5]
    assert P.share_groups([short, long], 16) == [(19, [0, 1])]
    assert P.share_groups([short, list(short)], 16) == [(19, [0, 1])]  # identical rows
    assert P.plan_shares([[1] * 16, [1] * 16 + [2]], 16) is None  # 15 < 16 shareable tokens


def test_pack_shared_keeps_groups_together_within_the_budget():
    rows = [[1] * 20 + [i] for i in range(6)] + [[2] * 30, [3] * 5]
    batches = P.pack_shared(rows, 10_000, 16)
    assert sorted(i for b in batches for i in b) == list(range(8))
    assert batches == [[0, 1, 2, 3, 4, 5], [6, 7]]  # the groups, then the lone rows, longest first
    small = P.pack_shared(rows, 63, 16)  # three 21-token rows per micro-batch: the group is cut in runs of 3
    assert small == [[0, 1, 2], [3, 4, 5], [6, 7]]


# ------------------------------------------------------------------------------------------- exactness


def _model(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def _random_rows(seed: int = 0) -> list[Segment]:
    rng = random.Random(seed)
    base = [rng.randrange(3, VOCAB) for _ in range(30)]
    rows = []
    for i in range(6):
        p = base[: rng.randint(18, 30)] + [rng.randrange(3, VOCAB) for _ in range(rng.randint(0, 5))]
        r = rng.randint(2, 9)
        rows.append(Segment(p, [rng.randrange(3, VOCAB) for _ in range(r)], [-1.0] * r, loss_mask=[1] * r,
                            advantage=rng.uniform(-1, 1), trajectory_id=f"t{i}"))
    rows.append(Segment([5] * 7, [6] * 3, [-1.0] * 3, loss_mask=[1] * 3, advantage=0.5, trajectory_id="x"))
    return rows


def _assert_same(model, rows: list[Segment], min_tokens: int = 16, chunk: int = 0, budget: int = 1 << 20) -> int:
    """Per micro-batch of pack_shared: logprobs, entropy, loss and every gradient of the shared forward equal
    the per-row forward's; returns the tokens the shared forwards saved."""
    batch = weigh(rows, "token-mean")
    saved = 0
    for idx in P.pack_shared([s.prompt_ids + s.response_ids for s in rows], budget, min_tokens):
        mb = collate([rows[i] for i in idx], [batch.weights[i] for i in idx])
        plan = P.plan_shares([rows[i].prompt_ids + rows[i].response_ids for i in idx], min_tokens)
        if plan is None:
            continue
        saved += plan.row_tokens - plan.forwarded_tokens
        shared = dataclasses.replace(mb, share=plan)
        with torch.no_grad():
            lp1, e1 = token_logprobs(model, mb, 0.7, with_entropy=True, chunk_tokens=chunk)
            lp2, e2 = token_logprobs(model, shared, 0.7, with_entropy=True, chunk_tokens=chunk)
        m = mb.loss_mask.bool()
        assert m.any()
        torch.testing.assert_close(lp2[m], lp1[m], atol=1e-5, rtol=0)
        torch.testing.assert_close(e2[m], e1[m], atol=1e-5, rtol=0)
        out = []
        for x in (mb, shared):
            model.zero_grad()
            part = ppo_micro_loss(model, x, 0.7, entropy_coef=0.01, chunk_tokens=chunk)
            part.loss.backward()
            out.append((float(part.loss.detach()), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
        assert out[1][0] == pytest.approx(out[0][0], rel=1e-6, abs=1e-9)
        top = max(float(g.abs().max()) for g in out[0][1])
        assert len(out[0][1]) == len(out[1][1])
        for g1, g2 in zip(out[0][1], out[1][1], strict=True):
            torch.testing.assert_close(g2, g1, atol=1e-5 * top, rtol=0)
    return saved


@pytest.mark.parametrize("chunk", [0, 5])
def test_random_rows_full_and_chunked_head(chunk):
    assert _assert_same(_model(), _random_rows(), chunk=chunk) == 5 * 21


@pytest.fixture(scope="module")
def tiny():
    return AutoModelForCausalLM.from_pretrained(cached_tiny_model("tiny")).float().eval()


@pytest.mark.parametrize("workflow,n", [("memagent", 4), ("fold", 1), ("summarize", 1), ("sliding_window", 1),
                                        ("memact", 1)])
def test_every_workflows_rows(tiny, workflow, n):
    from memrl.demonstrators.rows import workflow_rows

    budget = 800 if workflow == "summarize" else None  # 2 tasks: a part row and two final rows
    rows = workflow_rows(workflow, 1 if workflow in ("fold", "sliding_window") else 2, n=n, sub_questions=2,
                         padding_words=20, max_context_tokens=budget)
    for i, s in enumerate(rows):  # a varied advantage per row (the scripted rows carry none)
        s.advantage = (i % 5 - 2) / 2 or 0.25
    assert _assert_same(tiny, rows, budget=4096) > 0


def test_chunked_head_on_fold_rows(tiny):
    from memrl.demonstrators.rows import workflow_rows

    rows = workflow_rows("fold", 1, sub_questions=2, padding_words=20)
    for i, s in enumerate(rows):
        s.advantage = 0.5 - i % 2
    assert _assert_same(tiny, rows, chunk=64, budget=4096) > 0


def test_lora_policy_and_its_adapters_off_reference():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                init_lora_weights=False))
    assert _assert_same(model, _random_rows()) > 0
    ref, rows = BaseReference(model), _random_rows(1)
    mb = collate(rows, weigh(rows, "token-mean").weights)
    shared = dataclasses.replace(mb, share=P.plan_shares([s.prompt_ids + s.response_ids for s in rows], 16))
    with torch.no_grad():
        m = mb.loss_mask.bool()
        torch.testing.assert_close(token_logprobs(ref, shared)[0][m], token_logprobs(ref, mb)[0][m], atol=1e-5, rtol=0)


def test_what_it_cannot_share_takes_the_per_row_path():
    rows = _random_rows()
    mb = collate(rows, weigh(rows, "token-mean").weights)
    shared = dataclasses.replace(mb, share=P.plan_shares([s.prompt_ids + s.response_ids for s in rows], 16))
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=128)).eval()
    before = sum(P.fallbacks.values())
    with torch.no_grad():
        assert torch.equal(token_logprobs(gpt2, shared)[0], token_logprobs(gpt2, mb)[0])
    assert sum(P.fallbacks.values()) == before + 1
    assert "MoE router loss" in P.why_not(_model(), [], None)
    assert P.why_not(_model(), None, torch.zeros(1)) == "a sequence-parallel shard"


# ------------------------------------------------------------------------------------------- the trainer


def _cfg(tmp_path, *extra):
    return load_config(TrainConfig, [f"model.path={cached_tiny_model('tiny')}", f"out_dir={tmp_path}",
                                     "trainer.progress=false", *extra])


@pytest.mark.parametrize("what,override", [("trainer.num_workers > 1", "trainer.num_workers=2"),
                                           ("model.gradient_checkpointing", "model.gradient_checkpointing=true"),
                                           ("trainer.router_aux_loss_coef > 0", "trainer.router_aux_loss_coef=0.001")])
def test_always_refuses_what_it_cannot_share(tmp_path, what, override):
    extra = ["rollout.num_engines=1"] if "num_workers" in override else []
    with pytest.raises(ConfigError) as e:
        _cfg(tmp_path, "trainer.prefix_sharing=always", override, *extra).check()
    assert f"trainer.prefix_sharing=always does not support {what}" in str(e.value) and "\n" not in str(e.value)
    _cfg(tmp_path, "trainer.prefix_sharing=auto", override, *extra).check()  # auto: per-row forwards for that run


def _worker_rows():
    from memrl.demonstrators.rows import workflow_rows

    rows = workflow_rows("memact", 2, sub_questions=2, padding_words=20)
    for i, s in enumerate(rows):
        s.advantage = 0.5 - i % 2
    return rows


def test_worker_self_checks_then_shares_and_counts_forwarded_tokens(tmp_path):
    from memrl.training.ranks.workers import PolicyWorker

    rows = _worker_rows()
    w = PolicyWorker(_cfg(tmp_path, "trainer.prefix_sharing=always", "trainer.token_budget=4096",
                          "algorithm.temperature=0.7"))
    assert w.sharer.min_tokens == 16
    out = w.train_rows(weigh(rows, "token-mean"))
    assert out["perf/prefix_check_failed"] == 0.0 and out["perf/prefix_check_max_diff"] < 1e-4
    assert out["train/tokens"] == sum(s.num_tokens for s in rows)
    assert 0 < out["train/forwarded_tokens"] < out["train/tokens"]
    again = w.train_rows(weigh(rows, "token-mean"))
    assert "perf/prefix_check_failed" not in again  # checked once per run
    merged = combine_step_metrics([out, again])
    assert merged["train/forwarded_tokens"] == 2 * out["train/forwarded_tokens"]


def test_a_failed_self_check_turns_sharing_off_for_the_run(tmp_path, monkeypatch):
    from memrl.training.ranks.workers import PolicyWorker

    def wrong(*args, **kwargs):
        lp, ent = real(*args, **kwargs)
        return lp + 1.0, ent

    real = P.shared_logprobs
    monkeypatch.setattr(P, "shared_logprobs", wrong)
    rows = _worker_rows()
    w = PolicyWorker(_cfg(tmp_path, "trainer.prefix_sharing=always", "trainer.token_budget=4096"))
    out = w.train_rows(weigh(rows, "token-mean"))
    assert out["perf/prefix_check_failed"] == 1.0 and out["perf/prefix_check_max_diff"] == pytest.approx(1.0)
    assert w.sharer.min_tokens == 0 and out["train/forwarded_tokens"] == out["train/tokens"]


def test_never_forwards_every_row_whole(tmp_path):
    from memrl.training.ranks.workers import PolicyWorker

    rows = _worker_rows()
    w = PolicyWorker(_cfg(tmp_path, "trainer.prefix_sharing=never", "trainer.token_budget=4096"))
    out = w.train_rows(weigh(rows, "token-mean"))
    assert w.sharer.min_tokens == 0 and out["train/forwarded_tokens"] == out["train/tokens"]
    assert "perf/prefix_check_failed" not in out


@pytest.mark.parametrize(
    ("low", "delta", "ok", "mean"),
    [
        # bfloat16: one trained token off by 0.25 of four -> max 0.25, mean 0.0625 <= 0.1: kept
        (True, [0.25, 0.0, 0.0, 0.0], True, 0.0625),
        # bfloat16: every token off by 0.2 -> mean 0.2 > 0.1: off
        (True, [0.2, -0.2, 0.2, -0.2], False, 0.2),
        # float32: one token off by 0.002 > 1e-3: off, though the mean is 0.0005
        (False, [0.002, 0.0, 0.0, 0.0], False, 0.0005),
    ],
)
def test_self_check_tolerance_by_precision(low, delta, ok, mean):
    from types import SimpleNamespace

    per_row = torch.tensor([[-1.0, -2.0, -3.0, -4.0, -5.0]])
    mine = per_row + torch.tensor([[*delta, 7.0]])  # the last position is not trained (mask 0)
    sharer = object.__new__(P.Sharer)
    sharer.low_precision, sharer.min_tokens, sharer.logprobs = low, 64, lambda a, b: (per_row, mine)
    mb = SimpleNamespace(loss_mask=torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]]))
    assert sharer.self_check(mb, mb) is ok
    assert sharer.check["perf/prefix_check_mean_diff"] == pytest.approx(mean, abs=1e-6)
    assert sharer.check["perf/prefix_check_max_diff"] == pytest.approx(max(abs(d) for d in delta), abs=1e-6)
    assert sharer.min_tokens == (64 if ok else 0)
