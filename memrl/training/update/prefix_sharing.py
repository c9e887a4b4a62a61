"""Prefix-shared training forwards (trainer.prefix_sharing): rows of a micro-batch that begin with the same
tokens forward those tokens once, in the old-logprob, reference and update passes.

Why: MemAgent's n samples of a task share their first call's prompt and every call its template and
question; multi-turn workflows' rows share far more (fold's branch and main-thread rows, the sliding
window's and ReAct's turns, summarize's parts, MemAct's segments). The per-row path forwards each shared
prefix once per row.

How, exactly and with standard attention (no packed 4D mask, whose cost is quadratic in the packed length):

1. `plan_shares`: each row's ids less its last token (so every row keeps a suffix of >= 1 token) go into a
   trie, built as a radix tree from the rows sorted lexicographically and their neighbours' longest common
   prefixes; a dynamic program over the tree picks disjoint groups of >= 2 rows sharing >= `min_tokens`
   tokens that save the most forwarded tokens ((rows - 1) x prefix per group): the micro-batch's `SharePlan`
   (memrl.training.update.packing, `MicroBatch.share`).
2. `shared_logprobs`: the groups' prefixes are forwarded once, as one right-padded batch [G, P] with the KV
   cache on (its keys and values keep their autograd graph); then every row's remaining tokens (its
   suffix; the whole row for a row in no group) as a right-padded batch [B, S] over its group's keys and
   values gathered per row, position ids continuing from the prefix length (the positions the row had
   alone), the attention mask covering the group's real prefix tokens and the row's own suffix. A row's
   logprob at a prefix position comes from its group's prefix hidden state (the last one predicts the
   row's own first suffix token), the rest from its suffix; the result is laid out [B, L-1] exactly as
   memrl.training.update.policy.token_logprobs lays out the per-row path's, so the losses, weights and masks are
   untouched, and the gradient reaches a shared prefix once per row through the gather.

The logits come from the decoder's final hidden states through the model's lm_head (full, or
`chunk_tokens` at a time with memrl.training.update.chunked_logprobs), so models whose logits are not plain
lm_head(hidden) (`split_model` names why), MoE router losses and sequence-parallel shards keep the
per-row path (`fallbacks` counts why).

The policy worker holds a `Sharer`: it packs a step's rows (`pack_shared`), gives each micro-batch its plan,
and checks the run's first shared micro-batch against the per-row forward before trusting it.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch
from transformers import DynamicCache

from memrl.model_open import cache_kwarg
from memrl.training.config import TrainConfig, prefix_sharing_blocker
from memrl.training.update import chunked_logprobs as C
from memrl.training.update.lora import BaseReference
from memrl.training.update.packing import MicroBatch, SharePlan, pack_rows
from memrl.types import Segment

log = logging.getLogger(__name__)

MAX_DEPTH = 200
"""Trie levels the grouping descends at most (deeper rows are left unshared: exact, only slower)."""

fallbacks: Counter[str] = Counter()
"""Forwards with a share plan that took the per-row path instead, by reason."""


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    i = 0
    while i + 64 <= n and a[i:i + 64] == b[i:i + 64]:  # 64 at a time in C, then token by token
        i += 64
    while i < n and a[i] == b[i]:
        i += 1
    return i


def share_groups(rows: Sequence[Sequence[int]], min_tokens: int) -> list[tuple[int, list[int]]]:
    """(prefix length, row indices) of the groups that save the most forwarded tokens: each >= 2 rows whose
    first `prefix` tokens are equal, prefix >= `min_tokens` and < every member's length; disjoint.

    The trie: sorted lexicographically, rows sharing a prefix are contiguous, and a run of sorted rows
    [lo, hi) shares exactly min(lcp[lo+1:hi]) tokens (lcp[k]: common prefix of sorted rows k-1 and k). A
    node of the radix tree is such a run; its children are the runs cut where lcp equals that minimum.
    A node either shares its prefix over all its rows, saving (rows - 1) x prefix, or leaves the choice to
    its children; the larger saving wins (ties: the larger group, one prefix forward instead of several).
    """
    keys = [list(r[:-1]) for r in rows]  # the last token stays in the suffix: >= 1 suffix token per row
    order = sorted(range(len(rows)), key=lambda i: (keys[i], i))
    lcp = [0] + [_common(keys[order[k - 1]], keys[order[k]]) for k in range(1, len(order))]

    def best(lo: int, hi: int, depth: int) -> tuple[int, list[tuple[int, list[int]]]]:
        if hi - lo < 2 or depth > MAX_DEPTH:
            return 0, []
        d = min(lcp[lo + 1:hi])
        cuts = [lo] + [k for k in range(lo + 1, hi) if lcp[k] == d] + [hi]
        saved, groups = 0, []
        for a, b in zip(cuts, cuts[1:], strict=False):
            s, g = best(a, b, depth + 1)
            saved += s
            groups += g
        own = (hi - lo - 1) * d
        if d >= min_tokens and own >= saved:
            return own, [(d, sorted(order[lo:hi]))]
        return saved, groups

    return sorted(best(0, len(order), 0)[1], key=lambda g: g[1][0])


def plan_shares(rows: Sequence[Sequence[int]], min_tokens: int) -> SharePlan | None:
    """The share plan of a micro-batch's rows (token ids each), None when no prefix is worth sharing."""
    groups = share_groups(rows, min_tokens)
    if not groups:
        return None
    return SharePlan(tuple(tuple(g) for _, g in groups), tuple(p for p, _ in groups), tuple(len(r) for r in rows))


def pack_shared(rows: Sequence[Sequence[int]], token_budget: int, min_tokens: int) -> list[list[int]]:
    """memrl.training.update.packing.pack_rows, keeping the rows of a shared prefix together: the groups of the whole
    share (`share_groups`) and the lone rows are the units, longest first, each micro-batch growing while
    rows x longest row stays within the budget; a group too big for one micro-batch is cut into runs that
    fit. The groups come first and the lone rows get micro-batches of their own: mixed in, a lone row's
    whole length would set the padded width of every suffix (measured: it ate MemAgent's gain). Every
    index appears exactly once."""
    if token_budget < 1:
        raise ValueError(f"pack_shared: token_budget must be >= 1, got {token_budget}")
    grouped = share_groups(rows, min_tokens)
    taken = {i for _, g in grouped for i in g}
    size = [len(r) for r in rows]
    groups = sorted((g for _, g in grouped), key=lambda u: (-max(size[i] for i in u), u[0]))
    lone = sorted(([i] for i in range(len(rows)) if i not in taken), key=lambda u: (-size[u[0]], u[0]))
    batches: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for unit in groups + [[]] + lone:  # [] closes the last micro-batch of groups
        if not unit:
            if cur:
                batches.append(cur)
            cur, cur_max = [], 0
            continue
        longest = max(size[i] for i in unit)
        if cur and max(cur_max, longest) * (len(cur) + len(unit)) > token_budget:
            batches.append(cur)
            cur, cur_max = [], 0
        per = max(1, token_budget // longest)
        if len(unit) > per:  # a group larger than a micro-batch: runs of `per` rows, the rest goes on
            if cur:
                batches.append(cur)
                cur, cur_max = [], 0
            while len(unit) > per:
                batches.append(unit[:per])
                unit = unit[per:]
        cur += unit
        cur_max = max(cur_max, longest)
    if cur:
        batches.append(cur)
    return batches


# ------------------------------------------------------------------------------------------- the forward


def why_not(model: Any, router_aux: Any, position_ids: Any) -> str | C.HeadSplit:
    """The model's decoder and head when the shared forward applies, else the reason it does not."""
    if router_aux is not None:
        return "an MoE router loss (output_router_logits counts tokens, shared ones once)"
    if position_ids is not None:
        return "a sequence-parallel shard"
    base = _base(model)
    checkpointing = (base.is_activation_checkpointing if hasattr(base, "is_activation_checkpointing")
                     else getattr(base, "is_gradient_checkpointing", False))
    if checkpointing and base.training:
        return "gradient checkpointing (its layers drop the KV cache in training)"
    return C.split_model(model)


def _base(model: Any) -> Any:
    """The transformers model inside `model` (plain, PEFT-wrapped, or a LoRA policy's BaseReference)."""
    inner = model.model if isinstance(model, BaseReference) else model
    return inner.get_base_model() if hasattr(inner, "peft_config") and hasattr(inner, "get_base_model") else inner


def fell_back(reason: str) -> None:
    """Count a forward that took the per-row path; log its reason once."""
    if not fallbacks[reason]:
        log.warning("trainer.prefix_sharing: per-row forward: %s", reason)
    fallbacks[reason] += 1


def _forward(model: Any, split: C.HeadSplit, cache: Any = None, **kwargs: Any) -> tuple[torch.Tensor, Any]:
    """The decoder's last hidden state (chunked_logprobs.capture_final_hidden) and the KV cache of the model's
    own forward (one position's logits): through the model so PEFT's adapters, a BaseReference's adapters-off
    context and FSDP2's root gathering all apply."""
    if cache is not None:
        kwargs[cache_kwarg(_base(model))] = cache  # `cache` (transformers 5.24), else `past_key_values`
    with C.capture_final_hidden(model, split, "prefix sharing") as grabbed:
        out = model(logits_to_keep=1, use_cache=True, **kwargs)
    return grabbed[0], out.cache if "cache" in out else out.past_key_values


def _cache_per_row(cache: Any, index: torch.Tensor) -> DynamicCache:
    """A fresh cache holding each row's group's prefix keys and values (`index`: the group of each row)."""
    out = DynamicCache()
    for i, layer in enumerate(cache.layers):
        out.update(layer.keys.index_select(0, index), layer.values.index_select(0, index), i)
    return out


def _head_logprobs(split: C.HeadSplit, h: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool, chunk_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logprob (and entropy) [N] of hidden states `h` [N, H] predicting `targets` [N], as the per-row path
    computes them: lm_head(h).float() / T, log_softmax; `chunk_tokens` > 0 a chunk at a time."""
    if chunk_tokens > 0:
        lp, ent = C.ChunkedHeadLogprobs.apply(h, split.head.weight, split.head.bias, targets, temperature,
                                              chunk_tokens, with_entropy)
        return lp, ent if with_entropy else None
    z = split.head(h).float()
    if temperature != 1.0:
        z = z / temperature
    logp = torch.log_softmax(z, dim=-1)
    lp = logp.gather(-1, targets[:, None]).squeeze(-1)
    return lp, (-(logp.exp() * logp).sum(-1) if with_entropy else None)


def shared_logprobs(model: Any, split: C.HeadSplit, plan: SharePlan, input_ids: torch.Tensor, targets: torch.Tensor,
                    first: int, temperature: float, with_entropy: bool, chunk_tokens: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_logprobs' [B, L-1] logprobs (and entropy) of a right-padded micro-batch under `plan`, each shared
    prefix forwarded once. Positions before `first` (no row trains there) and past a row's end are 0."""
    dev = input_ids.device
    b, width = targets.shape
    group_of = [-1] * b
    pre_of = [0] * b
    for g, (rows, p) in enumerate(zip(plan.groups, plan.prefix, strict=True)):
        for r in rows:
            group_of[r], pre_of[r] = g, p
    # 1. the prefixes, once each
    p_max = max(plan.prefix)
    pre_ids = torch.zeros((len(plan.groups), p_max), dtype=torch.long, device=dev)
    pre_att = torch.zeros_like(pre_ids)
    for g, (rows, p) in enumerate(zip(plan.groups, plan.prefix, strict=True)):
        pre_ids[g, :p] = input_ids[rows[0], :p]
        pre_att[g, :p] = 1
    h_pre, cache = _forward(model, split, input_ids=pre_ids, attention_mask=pre_att)
    # 2. every row's suffix over its group's cache (a lone row: over nothing, group 0's keys masked out)
    s_max = max(n - p for n, p in zip(plan.lengths, pre_of, strict=True))
    suf_ids = torch.zeros((b, s_max), dtype=torch.long, device=dev)
    suf_att = torch.zeros_like(suf_ids)
    for r in range(b):
        n, p = plan.lengths[r], pre_of[r]
        suf_ids[r, : n - p] = input_ids[r, p:n]
        suf_att[r, : n - p] = 1
    index = torch.tensor([max(g, 0) for g in group_of], device=dev)
    row_pre_att = pre_att.index_select(0, index) * torch.tensor([g >= 0 for g in group_of], device=dev)[:, None]
    pos = torch.tensor(pre_of, device=dev)[:, None] + torch.arange(s_max, device=dev)[None, :]
    h_suf, _ = _forward(model, split, input_ids=suf_ids, attention_mask=torch.cat([row_pre_att, suf_att], 1),
                        position_ids=pos, cache=_cache_per_row(cache, index))
    # 3. the positions that need logprobs, as one flat list: each group's prefix positions before its last
    # once (the same tokens for every member), then per row its last prefix position and its suffix
    src = torch.full((b, width), -1, dtype=torch.long)  # flat index of each [row, t] (-1: a 0)
    hid: list[torch.Tensor] = []
    tgt: list[torch.Tensor] = []
    at = 0
    for g, (rows, p) in enumerate(zip(plan.groups, plan.prefix, strict=True)):
        lo = first
        if p - 1 > lo:
            hid.append(h_pre[g, lo: p - 1])
            tgt.append(targets[rows[0], lo: p - 1])
            for r in rows:
                src[r, lo: p - 1] = torch.arange(at, at + p - 1 - lo)
            at += p - 1 - lo
    for r in range(b):
        n, p, g = plan.lengths[r], pre_of[r], group_of[r]
        if g >= 0 and p - 1 >= first:
            hid.append(h_pre[g, p - 1: p])
            tgt.append(targets[r, p - 1: p])
            src[r, p - 1] = at
            at += 1
        lo = max(first, p)
        if n - 1 > lo:
            hid.append(h_suf[r, lo - p: n - 1 - p])
            tgt.append(targets[r, lo: n - 1])
            src[r, lo: n - 1] = torch.arange(at, at + n - 1 - lo)
            at += n - 1 - lo
    if not hid:
        zero = torch.zeros((b, width), device=dev)
        return zero, zero.clone() if with_entropy else None
    lp, ent = _head_logprobs(split, torch.cat(hid), torch.cat(tgt), temperature, with_entropy, chunk_tokens)
    where = src.to(dev).view(-1) % (at + 1)  # -1 -> the appended 0

    def place(x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x, x.new_zeros(1)]).index_select(0, where).view(b, width)

    return place(lp), None if ent is None else place(ent)


# ------------------------------------------------------------------------------------------- the worker's side


def min_tokens_for(cfg: TrainConfig, model: Any, world_size: int = 1) -> int:
    """trainer.prefix_sharing: the shortest prefix shared (trainer.prefix_min_tokens), 0 when off or when
    the run or the model rules it out (auto; "always" was refused at config time, except for the model and
    for ranks started outside trainer.num_workers: `world_size` > 1, whose forwards must match in number)."""
    t = cfg.trainer
    if t.prefix_sharing == "never" or prefix_sharing_blocker(cfg):
        return 0
    if world_size > 1:
        if t.prefix_sharing == "always":
            log.warning("trainer.prefix_sharing=always: every row forwarded whole: %d ranks (FSDP ranks must run "
                        "as many forwards)", world_size)
        return 0
    split = why_not(model, None, None)
    if not isinstance(split, C.HeadSplit):
        log.warning("trainer.prefix_sharing=%s: every row forwarded whole: %s", t.prefix_sharing, split)
        return 0
    return t.prefix_min_tokens


class Sharer:
    """A policy worker's prefix sharing over a run: how it packs rows into micro-batches of `token_budget`
    tokens and which micro-batches get a share plan. `min_tokens`: the shortest prefix shared, 0 when sharing
    is off (by the config, the model, or a failed self-check). `low_precision`: bfloat16 weights or compute
    (the self-check's looser tolerance). `logprobs(a, b)`: the policy's logprobs of micro-batches a and b (no
    gradient), for the self-check."""

    def __init__(self, cfg: TrainConfig, model: Any, token_budget: int, low_precision: bool,
                 logprobs: Callable[[MicroBatch, MicroBatch], tuple[torch.Tensor, torch.Tensor]],
                 world_size: int = 1) -> None:
        self.min_tokens = min_tokens_for(cfg, model, world_size)
        self.token_budget, self.low_precision, self.logprobs = token_budget, low_precision, logprobs
        self.checked = False
        self.check: dict[str, float] = {}  # the first shared micro-batch's self-check, logged once (`take_check`)

    def pack(self, rows: list[Segment]) -> list[list[int]]:
        """Micro-batches of `rows` by the token budget; with prefix sharing the rows of a shared prefix together."""
        if self.min_tokens:
            return pack_shared([s.prompt_ids + s.response_ids for s in rows], self.token_budget, self.min_tokens)
        return pack_rows(rows, self.token_budget)

    def share(self, mb: MicroBatch, rows: list[Segment]) -> MicroBatch:
        """`mb` (collated from `rows`) with its share plan when prefix sharing is on and some prefix is worth it.
        The run's first such micro-batch is checked against the per-row forward first (`self_check`)."""
        plan = plan_shares([s.prompt_ids + s.response_ids for s in rows], self.min_tokens) if self.min_tokens else None
        if plan is None:
            return mb
        shared = replace(mb, share=plan)
        if not self.checked:
            self.checked = True
            if not self.self_check(mb, shared):
                return mb
        return shared

    def self_check(self, mb: MicroBatch, shared: MicroBatch) -> bool:
        """Whether the shared forward's logprobs of `mb`'s trained tokens equal the per-row forward's: in float32
        the largest |difference| within 1e-3; in bfloat16 (weights or compute) the mean |difference| within 0.1,
        since there the two forwards' different matmul shapes round differently at every layer (SmolLM2-135M,
        30 layers: shared vs per-row max 0.23, mean 0.026, while the per-row bfloat16 forward itself is max
        0.32, mean 0.028 from float32's), and a wrong share is off by nats on most tokens. When not, prefix
        sharing is off for the run."""
        per_row, mine = self.logprobs(mb, shared)
        n = float(mb.loss_mask.sum())
        err = (per_row - mine).abs() * mb.loss_mask
        diff = float(err.max()) if n else 0.0
        mean = float(err.sum()) / n if n else 0.0
        ok = mean <= 0.1 if self.low_precision else diff <= 1e-3  # NaN fails too
        self.check = {"perf/prefix_check_max_diff": diff, "perf/prefix_check_mean_diff": mean,
                      "perf/prefix_check_failed": float(not ok)}
        if not ok:
            log.warning("trainer.prefix_sharing: the shared forward's logprobs differ from the per-row forward's by "
                        "%.3g at most, %.3g on average on the first shared micro-batch (allowed: %s); every row is "
                        "forwarded whole for the rest of the run", diff, mean,
                        "a mean of 0.1 in bfloat16" if self.low_precision else "1e-3 on each token")
            self.min_tokens = 0
        return ok

    def take_check(self) -> dict[str, float]:
        """The self-check's metrics (perf/prefix_check_max_diff, _mean_diff, _failed) once, in the step
        that ran it; {} in every other step."""
        out, self.check = self.check, {}
        return out
