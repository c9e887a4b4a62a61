"""Prefix-shared training forwards (trainer.prefix_sharing) side by side with the per-row forwards, per workflow.

    .venv/bin/python benchmarks/prefix_sharing.py [--threads 1] [--tasks N] [--dry-run] [--ratios-only]

Rows: each workflow's scripted rows at its CPU demo's sizes (memrl.demonstrators.rows): MemAgent on the demo's
synthetic task (trainer.batch_size 16 tasks, n=4; n=16 with 8 tasks), token_budget 8192; fold, summarize,
sliding_window (window_turns 2) and MemAct on the context demo's lookup task (3 facts, 40 filler words), 8
tasks, n=1 (the scripted agents are deterministic: n copies would be identical rows), token_budget 32768.
Model: the `tiny` preset (memrl.models.tiny), float32. `--tasks N`: N tasks for every workflow instead (the
recorded table used 2, to fit a loaded 2-core machine); `--dry-run`: 1 task.

Per workflow, one run each way on the same rows, the same micro-batching rule otherwise: the old-logprob pass
(no gradient) and the update (PPO loss forward + backward), the per-row path packed by
memrl.training.update.packing.pack_rows, the shared path by prefix_sharing.pack_shared with each micro-batch's plan.
Columns: rows, row tokens, forwarded tokens (shared: each shared prefix once), their ratio
(perf/shared_token_ratio), update seconds and update row tokens/s each way, step seconds (old-logprob pass +
update) each way, and the update's speedup. `--ratios-only`: no timing; per workflow the forwarded tokens of
the two-level sharing implemented here against the trie's own size (every distinct prefix once: what sharing
at every depth of the trie would forward). Timings on a loaded machine vary run to run; a speed claim needs
the same machine for both columns (they are measured back to back here).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time

import torch

from memrl.demonstrators.rows import workflow_rows
from memrl.models.tiny import cached_tiny_model
from memrl.training.update import prefix_sharing as P
from memrl.training.update.packing import collate, pack_rows, weigh
from memrl.training.update.policy import ppo_micro_loss, token_logprobs

CASES = (("memagent n=4", "memagent", 16, 4, 8192), ("memagent n=16", "memagent", 8, 16, 8192),
         ("fold", "fold", 8, 1, 32768), ("summarize", "summarize", 8, 1, 32768),
         ("sliding_window", "sliding_window", 8, 1, 32768), ("memact", "memact", 8, 1, 32768))


def micro_batches(rows: list, budget: int, shared: bool, min_tokens: int = 16) -> list:
    """The collated micro-batches of `rows`, with their share plans when `shared`."""
    ids = [s.prompt_ids + s.response_ids for s in rows]
    weights = weigh(rows, "token-mean").weights
    out = []
    for idx in (P.pack_shared(ids, budget, min_tokens) if shared else pack_rows(rows, budget)):
        mb = collate([rows[i] for i in idx], [weights[i] for i in idx])
        plan = P.plan_shares([ids[i] for i in idx], min_tokens) if shared else None
        out.append(dataclasses.replace(mb, share=plan))
    return out


def timed(model: torch.nn.Module, mbs: list) -> tuple[float, float]:
    """Seconds of the old-logprob pass and of the update over `mbs`."""
    t0 = time.perf_counter()
    with torch.no_grad():
        for mb in mbs:
            token_logprobs(model, mb, 1.0)
    t1 = time.perf_counter()
    model.zero_grad()
    for mb in mbs:
        ppo_micro_loss(model, mb, 1.0).loss.backward()
    return t1 - t0, time.perf_counter() - t1


def trie_tokens(ids: list[list[int]]) -> int:
    """Tokens of the trie over `ids` (each distinct prefix once): the sorted rows' lengths less each one's
    common prefix with the row before it (every row keeps >= 1 token of its own, as the forward needs)."""
    rows = sorted(ids)
    return sum(len(r) - min(P._common(r, prev), len(r) - 1) for prev, r in zip([[]] + rows, rows, strict=False))


def ratios(tasks: int) -> None:
    """Per workflow: row tokens, the two-level plan's forwarded tokens (micro-batched as the worker does), the
    trie's tokens over the whole step."""
    print("| workflow | rows | row tokens | two-level forwarded | ratio | every-depth trie | ratio |\n|---|---|---|---|---|---|---|")
    for name, wf, default_tasks, n, budget in CASES:
        rows = workflow_rows(wf, tasks or default_tasks, n=n)
        ids = [s.prompt_ids + s.response_ids for s in rows]
        row_tok = sum(map(len, ids))
        fwd = 0
        for idx in P.pack_shared(ids, budget, 16):
            plan = P.plan_shares([ids[i] for i in idx], 16)
            fwd += plan.forwarded_tokens if plan else sum(len(ids[i]) for i in idx)
        trie = trie_tokens(ids)
        print(f"| {name} | {len(rows)} | {row_tok} | {fwd} | {fwd / row_tok:.2f} | {trie} | {trie / row_tok:.2f} |",
              flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=0, help="tasks per workflow (0: the demo sizes)")
    ap.add_argument("--dry-run", action="store_true", help="1 task per workflow, to check that it runs")
    ap.add_argument("--ratios-only", action="store_true", help="token counts only (two-level vs every depth)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.ratios_only:
        return ratios(1 if args.dry_run else args.tasks)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cached_tiny_model("tiny")).float()
    model.train()
    lines = ["| workflow | rows | row tokens | forwarded | shared ratio | update s (per-row / shared) "
             "| update tok/s (per-row / shared) | step s (per-row / shared) | update speedup |",
             "|---|---|---|---|---|---|---|---|---|"]
    timed(model, micro_batches(workflow_rows("memagent", 1, n=2), 8192, True))  # warm-up of both paths
    timed(model, micro_batches(workflow_rows("memagent", 1, n=2), 8192, False))
    for name, wf, tasks, n, budget in CASES:
        rows = workflow_rows(wf, 1 if args.dry_run else args.tasks or tasks, n=n)
        for i, s in enumerate(rows):
            s.advantage = (i % 5 - 2) / 2 or 0.25
        row_tok = sum(s.num_tokens for s in rows)
        shared = micro_batches(rows, budget, True)
        fwd = sum(mb.share.forwarded_tokens if mb.share else mb.num_tokens for mb in shared)
        old_a, upd_a = timed(model, micro_batches(rows, budget, False))
        old_b, upd_b = timed(model, shared)
        lines.append(f"| {name} | {len(rows)} | {row_tok} | {fwd} | {fwd / row_tok:.2f} | {upd_a:.2f} / {upd_b:.2f} "
                     f"| {row_tok / upd_a:,.0f} / {row_tok / upd_b:,.0f} | {old_a + upd_a:.2f} / {old_b + upd_b:.2f} "
                     f"| {upd_a / upd_b:.2f}x |")
        print(lines[-1], flush=True)
    print(f"\nthreads {args.threads}, load average {os.getloadavg()[0]:.1f} at the end\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
