"""Sampling for the transformers engine: inverse-CDF draws with per-row top-k / top-p."""

from __future__ import annotations

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
