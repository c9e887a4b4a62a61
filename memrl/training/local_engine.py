"""A small in-process transformers engine for the trainer: concurrent `generate` calls are gathered
into one left-padded, KV-cached batch (a micro-batcher on the asyncio loop).

This is the trainer's fallback when `memrl.engines.hf.HFEngine` is not available. It follows the
engine protocol (memrl.engines.base) and its logprob convention: log_softmax(logits / T) of the sampled
token, T = 1 when greedy, before top-k / top-p truncation. Sampling is seeded per request
(`SamplingParams.seed`), so a rollout is reproducible given the same requests in the same batches.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from memrl.engines.base import Completion, EngineError, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: SamplingParams
    future: asyncio.Future


@dataclass
class EngineStats:
    """Counters: calls served, batches run, tokens generated and prompt tokens read."""

    calls: int = 0
    batches: int = 0
    generated_tokens: int = 0
    prompt_tokens: int = 0
    extra: dict[str, float] = field(default_factory=dict)


class LocalEngine:
    """Batched generation with a transformers causal LM, in this process (CPU or one GPU)."""

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.stats = EngineStats()
        self._pending: list[_Request] = []
        self._scheduled = False
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos = {int(eos)} if eos is not None else set()
        pad = getattr(tokenizer, "pad_token_id", None)
        self._pad = int(pad if pad is not None else (eos or 0))

    async def generate(self, prompt_ids: list[int], sampling: SamplingParams) -> Completion:
        if not prompt_ids:
            raise EngineError("LocalEngine.generate: empty prompt")
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._pending.append(_Request(list(prompt_ids), sampling, fut))
        if not self._scheduled:
            self._scheduled = True
            # Runs after every coroutine already scheduled has had its turn to enqueue a request.
            loop.call_soon(self._flush)
        return await fut

    def _flush(self) -> None:
        self._scheduled = False
        pending, self._pending = self._pending, []
        groups: dict[tuple, list[_Request]] = {}
        for r in pending:
            s = r.sampling
            groups.setdefault((s.temperature, s.top_p, s.top_k, s.max_tokens, s.stop_token_ids), []).append(r)
        for reqs in groups.values():
            reqs.sort(key=lambda r: len(r.prompt_ids))
            for i in range(0, len(reqs), self.max_batch_size):
                batch = reqs[i : i + self.max_batch_size]
                try:
                    outs = self.generate_batch([r.prompt_ids for r in batch], batch[0].sampling,
                                               [r.sampling.seed for r in batch])
                except Exception as e:  # noqa: BLE001 - handed to every waiting caller
                    for r in batch:
                        if not r.future.done():
                            r.future.set_exception(e)
                    continue
                for r, out in zip(batch, outs, strict=True):
                    if not r.future.done():
                        r.future.set_result(out)

    @torch.no_grad()
    def generate_batch(
        self, prompts: list[list[int]], sampling: SamplingParams, seeds: list[int | None] | None = None
    ) -> list[Completion]:
        """Generate for a batch of prompts with one SamplingParams (seeds per row)."""
        model = self.model
        was_training = model.training
        model.eval()
        device = next(model.parameters()).device
        b = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((b, width), self._pad, dtype=torch.long)
        att = torch.zeros((b, width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            att[i, width - len(p) :] = 1
        ids, att = ids.to(device), att.to(device)
        pos = (att.cumsum(-1) - 1).clamp(min=0)
        gens = []
        for s in seeds or [None] * b:
            g = torch.Generator(device="cpu")
            g.manual_seed(int(s) if s is not None else int(torch.randint(0, 2**31 - 1, (1,)).item()))
            gens.append(g)
        stop = self._eos | set(sampling.stop_token_ids)
        t = sampling.logprob_temperature
        out_ids: list[list[int]] = [[] for _ in range(b)]
        out_lp: list[list[float]] = [[] for _ in range(b)]
        done = [False] * b
        past = None
        cur_ids, cur_pos = ids, pos
        for _ in range(sampling.max_tokens):
            res = model(input_ids=cur_ids, attention_mask=att, position_ids=cur_pos, past_key_values=past,
                        use_cache=True)
            past = res.past_key_values
            logits = res.logits[:, -1, :].float()
            logp = torch.log_softmax(logits / t, dim=-1)
            if sampling.greedy:
                nxt = logits.argmax(-1).cpu()
            else:
                probs = _truncate(logp, sampling.top_k, sampling.top_p).exp().cpu()
                nxt = torch.stack([torch.multinomial(probs[i], 1, generator=gens[i])[0] for i in range(b)])
            lps = logp.cpu().gather(-1, nxt.unsqueeze(-1)).squeeze(-1)
            for i in range(b):
                if done[i]:
                    continue
                tok = int(nxt[i])
                out_ids[i].append(tok)
                out_lp[i].append(min(0.0, float(lps[i])))
                if tok in stop:
                    done[i] = True
            if all(done):
                break
            cur_ids = nxt.to(device).unsqueeze(-1)
            att = torch.cat([att, torch.ones((b, 1), dtype=att.dtype, device=device)], dim=-1)
            cur_pos = cur_pos[:, -1:] + 1
        if was_training:
            model.train()
        self.stats.calls += b
        self.stats.batches += 1
        self.stats.generated_tokens += sum(len(o) for o in out_ids)
        self.stats.prompt_tokens += sum(len(p) for p in prompts)
        return [
            Completion(o, lp, "stop" if d else "length") for o, lp, d in zip(out_ids, out_lp, done, strict=True)
        ]

    def update_weights(self, weights: Mapping[str, Any] | str) -> None:
        """Load a state dict (name -> tensor) or a HuggingFace checkpoint directory."""
        if isinstance(weights, str):
            from transformers import AutoModelForCausalLM

            weights = AutoModelForCausalLM.from_pretrained(weights).state_dict()
        if any(v.data_ptr() != p.data_ptr() for v, p in zip(weights.values(), self.model.state_dict().values(),
                                                             strict=False)):
            self.model.load_state_dict(dict(weights), strict=False)

    async def close(self) -> None:
        return None


def _truncate(logp: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Log-probs with everything outside top-k / the top-p nucleus set to -inf (renormalized)."""
    if top_k and top_k > 0 and top_k < logp.shape[-1]:
        kth = torch.topk(logp, top_k, dim=-1).values[:, -1:]
        logp = logp.masked_fill(logp < kth, float("-inf"))
    if top_p < 1.0:
        sorted_lp, idx = torch.sort(logp, descending=True, dim=-1)
        cum = sorted_lp.exp().cumsum(-1)
        drop = cum - sorted_lp.exp() > top_p
        sorted_lp = sorted_lp.masked_fill(drop, float("-inf"))
        logp = torch.full_like(logp, float("-inf")).scatter(-1, idx, sorted_lp)
    return torch.log_softmax(logp, dim=-1)
