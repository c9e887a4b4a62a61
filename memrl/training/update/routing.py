"""MoE routing replay (algorithm.routing_replay; docs/guides/health.md).

A mixture-of-experts layer sends each token to its top-k experts by the router's logits. When the
trainer's forward picks other experts than the pass whose log-probabilities are the PPO ratio's "old" ones
(float noise near a tie, or weights an optimizer step moved), the ratio compares two different networks;
MoE GRPO runs are reported to collapse from it. Replay makes the update use the recorded experts:

- r2: the trainer's own old-logprob pass (algorithm.old_logprobs=trainer) records every token's experts,
  per row and layer; every forward of the update replays them.
- r3: the in-process hf engine records the experts of every token it feeds (EngineRouting; kv_cache=padded),
  each call's Completion carries them to its Segment (Segment.routing), and the trainer's old-logprob pass
  and update replay the rollout's experts.

Replay keeps the router's gate weights differentiable: the weights are the current router's softmax
probabilities of the replayed experts, renormalised over them when the model normalises its top-k
(norm_topk_prob: computed as the softmax over the replayed experts' logits), what the router computes, to
float rounding, when it picks the same experts. The recorded state is
one byte per expert choice: layers x top_k bytes per token (the tiny Qwen3-MoE: 4 x 2 = 8 bytes).

Only Qwen3-MoE's router (transformers' Qwen3MoeTopKRouter, which returns logits, weights and indices)
is hooked; in process (trainer.num_workers=1). r3 reaches the rows of one-call segments (the chunked
workflows' call_segment); other rows route freely.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

REPLAY_MODES: tuple[str, ...] = ("none", "r2", "r3")


def routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's top-k routers, in layer order (modules returning (logits, weights, indices))."""
    return [m for m in model.modules() if type(m).__name__ == "Qwen3MoeTopKRouter"]


def bytes_per_token(model: torch.nn.Module) -> int:
    """Recorded bytes per token: one uint8 expert index per router and top-k slot."""
    return sum(int(r.top_k) for r in routers(model))


class RoutingReplay:
    """Records the experts of a model's forwards and replays them (module docstring). `recorded` maps a
    row's key (the caller's: id of its Segment) to a uint8 tensor [layers, tokens, top_k]."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        if not self.routers:
            raise ValueError("routing replay needs a mixture-of-experts model with Qwen3-MoE routers "
                             f"(model_type qwen3_moe), got {getattr(model.config, 'model_type', type(model).__name__)}")
        if any(r.num_experts > 256 for r in self.routers):
            raise ValueError("routing replay records expert indices as uint8: at most 256 experts")
        self.recorded: dict[int, torch.Tensor] = {}
        self._taken: list[torch.Tensor] = []
        self._replay: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self._mode = ""
        self._hooks = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(self.routers)]

    def _hook(self, layer: int) -> Any:
        def hook(module: torch.nn.Module, args: Any, output: Any) -> Any:
            if self._mode == "record":
                self._taken.append(output[2].detach())
                return None
            if self._mode != "replay" or self._replay is None:
                return None
            logits, scores, idx = output
            rec, on = self._replay[layer]
            rec = rec.to(idx.device)
            on = on.to(idx.device).unsqueeze(-1)
            if module.norm_topk_prob:  # softmax over all, renormalised over the picked = softmax over the picked
                top = torch.softmax(logits.float().gather(-1, rec), dim=-1)  # (no underflow when others dominate)
            else:
                top = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, rec)
            return logits, torch.where(on, top.to(logits.dtype), scores), torch.where(on, rec, idx)

        return hook

    @contextmanager
    def record(self, width: int, lengths: Sequence[int], keys: Sequence[int]) -> Iterator[None]:
        """Around one forward of a [len(keys), width] batch (right-padded, row r's first lengths[r] tokens
        real): each row's experts kept under keys[r]."""
        self._mode, self._taken = "record", []
        try:
            yield
        finally:
            self._mode = ""
        if len(self._taken) != len(self.routers):
            raise RuntimeError(f"routing replay: {len(self._taken)} router calls in one forward, expected "
                               f"{len(self.routers)} (one per MoE layer)")
        per = torch.stack([t.reshape(len(keys), width, -1) for t in self._taken])  # [layers, B, W, k]
        self._taken = []
        for r, (n, key) in enumerate(zip(lengths, keys, strict=True)):
            self.recorded[key] = per[:, r, :n].to(torch.uint8).cpu()

    @contextmanager
    def replay(self, keys: Sequence[int | None], width: int) -> Iterator[None]:
        """Around the forward and backward of a [len(keys), width] right-padded batch: the rows with a record
        (keys[r] in `recorded`) take its experts on their recorded tokens; other positions route freely."""
        k = self.routers[0].top_k
        rec = torch.zeros((len(self.routers), len(keys), width, k), dtype=torch.long)
        on = torch.zeros((len(keys), width), dtype=torch.bool)
        for r, key in enumerate(keys):
            got = self.recorded.get(key) if key is not None else None
            if got is not None:
                n = min(got.shape[1], width)
                rec[:, r, :n] = got[:, :n].long()
                on[r, :n] = True
        self._replay = [(rec[i].reshape(-1, k), on.reshape(-1)) for i in range(len(self.routers))]
        self._mode = "replay"
        try:
            yield
        finally:
            self._mode, self._replay = "", None

    def clear(self) -> None:
        self.recorded = {}

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []


ROUTING_KEY = "routing"
"""Completion.info key of the hf engine's recorded experts (r3): uint8 [layers, tokens - 1, top_k]."""


class EngineRouting:
    """r3: records the experts of an hf engine's forwards, per request and position (HFEngine.routing; the
    engine calls `forward` around each forward of a padded-cache batch and `completion_info` when a request
    finishes). Positions 0 .. prompt + generated - 2 are the tokens the engine fed (the last generated token
    never is: the trainer routes it freely, and it changes no trained log-probability)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.routers = routers(model)
        if not self.routers:
            raise ValueError("routing replay r3 needs a mixture-of-experts engine model with Qwen3-MoE routers")
        self._on = False
        self._taken: list[torch.Tensor] = []
        self._hooks = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        if self._on:
            self._taken.append(output[2].detach())

    @contextmanager
    def forward(self, rows: Sequence[Any], input_ids: torch.Tensor, mask: torch.Tensor,
                pos: torch.Tensor) -> Iterator[None]:
        """Around one engine forward of `rows` (its requests, in row order): input_ids [B, T] at positions
        `pos` [B, T]; the last T columns of `mask` say which are real tokens."""
        self._on, self._taken = True, []
        try:
            yield
        finally:
            self._on = False
        b, t = input_ids.shape
        per = torch.stack([x.reshape(b, t, -1) for x in self._taken]).to(torch.uint8).cpu()  # [layers, B, T, k]
        self._taken = []
        real = mask[:, -t:].bool().cpu()
        where = pos.cpu()
        for i, req in enumerate(rows):
            kept = req.__dict__.setdefault(ROUTING_KEY, {})
            for j in torch.nonzero(real[i]).flatten().tolist():
                kept[int(where[i, j])] = per[:, i, j]

    def completion_info(self, req: Any) -> dict[str, Any]:
        """{ROUTING_KEY: uint8 [layers, prompt + generated - 1, k]} of a finished request ({} if any fed
        position was not recorded)."""
        kept = req.__dict__.pop(ROUTING_KEY, {})
        n = len(req.prompt_ids) + len(req.tokens) - 1
        if n <= 0 or any(p not in kept for p in range(n)):
            return {}
        return {ROUTING_KEY: torch.stack([kept[p] for p in range(n)], dim=1)}

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
