"""Sampling for the transformers engine: inverse-CDF draws with per-row top-k / top-p, and the step that
chooses every live row's next token from a batch's logits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


def sample_rows(logp: torch.Tensor, u: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Inverse-CDF sampling of one token per row from log-probs [R, V] with per-row top-k / top-p.

    u [R] are uniforms in [0, 1). Rows without truncation use the full distribution (vocabulary order);
    truncated rows sort by probability, keep the top_k and the smallest prefix reaching top_p mass.
    """
    r, v = logp.shape
    probs = logp.exp()
    needs = [j for j in range(r) if 0 < top_k[j] < v or top_p[j] < 1.0]
    out = torch.empty(r, dtype=torch.long, device=logp.device)
    plain = [j for j in range(r) if j not in set(needs)]
    if plain:
        pidx = torch.tensor(plain, dtype=torch.long, device=logp.device)
        cdf = probs.index_select(0, pidx).cumsum(-1)
        x = (u.index_select(0, pidx) * cdf[:, -1]).unsqueeze(1)
        pick = torch.searchsorted(cdf, x, right=True).squeeze(1).clamp(max=v - 1)
        out.index_copy_(0, pidx, pick)
    if needs:
        nidx = torch.tensor(needs, dtype=torch.long, device=logp.device)
        p = probs.index_select(0, nidx)
        sp, order = p.sort(dim=-1, descending=True)
        ranks = torch.arange(v, device=logp.device)[None, :]
        k = torch.tensor([top_k[j] if 0 < top_k[j] < v else v for j in needs], device=logp.device)
        tp = torch.tensor([top_p[j] for j in needs], dtype=sp.dtype, device=logp.device)
        before = sp.cumsum(-1) - sp  # mass strictly before each token
        keep = (ranks < k[:, None]) & (before < tp[:, None])
        keep[:, 0] = True
        sp = sp * keep
        cdf = sp.cumsum(-1)
        x = (u.index_select(0, nidx) * cdf[:, -1]).unsqueeze(1)
        last = keep.sum(-1, keepdim=True) - 1
        pos = torch.minimum(torch.searchsorted(cdf, x, right=True), last)
        out.index_copy_(0, nidx, order.gather(1, pos).squeeze(1))
    return out


def sample_into(batch: Any, logits: torch.Tensor, rng: torch.Generator, stats: Any,
                finish: Callable[[Any, int, str], None]) -> None:
    """Sample one token per live row of `batch` from float32 logits [B, V]; record token, logprob and the
    first-token wait on its request, and call `finish(batch, row, "stop" | "length")` on a row that ends.

    logprob = log_softmax(logits / T)[token] before top-k / top-p truncation (memrl.engines.base); a
    request with a seed draws its uniforms from its own generator, the others from `rng`."""
    t0 = time.perf_counter()
    try:
        _sample_live_rows(batch, logits, rng, stats, finish)
    finally:
        stats.sample_s += time.perf_counter() - t0


def _sample_live_rows(batch: Any, logits: torch.Tensor, rng: torch.Generator, stats: Any,
                      finish: Callable[[Any, int, str], None]) -> None:
    rows = [i for i, d in enumerate(batch.done) if not d]
    idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
    sub = logits.index_select(0, idx) if len(rows) < logits.shape[0] else logits
    params = [batch.requests[i].sampling for i in rows]
    temps = torch.tensor([p.logprob_temperature for p in params], dtype=torch.float32, device=sub.device)
    scaled = sub / temps[:, None]
    logp = torch.log_softmax(scaled, dim=-1)
    tokens = torch.argmax(sub, dim=-1)
    sampled = [j for j, p in enumerate(params) if not p.greedy]
    if sampled:
        sidx = torch.tensor(sampled, dtype=torch.long, device=sub.device)
        u = torch.tensor([_uniform(batch.requests[rows[j]], rng) for j in sampled], dtype=torch.float64)
        u = u.clamp_(max=1 - 2**-24).to(sub.device, torch.float32)  # stays < 1 in float32
        choice = sample_rows(
            logp.index_select(0, sidx), u,
            [params[j].top_k for j in sampled], [params[j].top_p for j in sampled],
        )
        tokens = tokens.index_copy(0, sidx, choice)
    chosen_lp = logp.gather(1, tokens[:, None]).squeeze(1)
    tok_list, lp_list = tokens.tolist(), chosen_lp.tolist()
    new_last = batch.last.clone()
    for j, i in enumerate(rows):
        req = batch.requests[i]
        if req.future.cancelled():  # the caller gave up: stop spending compute on the row
            batch.done[i] = True
            continue
        tok = tok_list[j]
        req.tokens.append(tok)
        req.logprobs.append(lp_list[j])
        stats.generated_tokens += 1
        if len(req.tokens) == 1:
            wait = time.monotonic() - req.submitted
            stats.first_tokens += 1
            stats.first_token_wait_s += wait
            stats.max_first_token_s = max(stats.max_first_token_s, wait)
        if tok in req.stop_ids:
            finish(batch, i, "stop")
        elif len(req.tokens) >= req.max_new:
            finish(batch, i, "length")
    new_last.index_copy_(0, idx, tokens)
    batch.last = new_last


def _uniform(req: Any, rng: torch.Generator) -> float:
    gen = req.generator if req.generator is not None else rng
    return float(torch.rand((), generator=gen, dtype=torch.float64))
