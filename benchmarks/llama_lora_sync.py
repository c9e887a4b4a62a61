"""Can llama.cpp keep LoRA weight sync exact? A seeded random LoRA (rank 8, every linear layer, B ~ N(0, 0.02)
so the adapter moves the logits like a trained one) on a model imported from a GGUF, scored three ways on one
chat prompt, greedy: HF + PEFT (the trainer's policy), llama.cpp on the float32 GGUF without the adapter (the
control: it must differ) and with the adapter converted to a GGUF adapter and loaded at runtime
(llama_adapter_lora_init + llama_set_adapters_lora, what a sync would do each step). Prints whether the greedy
tokens are HF + PEFT's and the largest |logprob difference|, and the adapter's load time.

Two steps, two virtualenvs (llama-cpp-python lives in its own, scripts/install_llama_cpp.sh):

    python benchmarks/llama_lora_sync.py make --model DIR --out OUT                 # memrl's venv: PEFT + reference
    python vendor/llama.cpp/convert_lora_to_gguf.py --base DIR --outtype f32 \\
        --outfile OUT/adapter.gguf OUT/adapter                                      # llama.cpp's converter (in the sdist)
    .venv-llama/bin/python benchmarks/llama_lora_sync.py check --gguf F32.gguf --out OUT

F32.gguf: the float32 copy of the GGUF DIR was imported from (benchmarks/engine_compare.py's write_f32_gguf).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

QUESTION = "What is the capital of France?"


def make(model: str, out: Path, tokens: int, seed: int) -> None:
    import peft
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model)
    conf = peft.LoraConfig(r=8, lora_alpha=16, bias="none", task_type="CAUSAL_LM",
                           target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    pm = peft.get_peft_model(m, conf)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    pm.save_pretrained(str(out / "adapter"))
    ids = tok.apply_chat_template([{"role": "user", "content": QUESTION}], add_generation_prompt=True)
    ids = list(ids if isinstance(ids, list) else ids["input_ids"])
    with torch.no_grad():
        res = pm.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, output_logits=True,
                          return_dict_in_generate=True)
    gen = res.sequences[0, len(ids):].tolist()
    lps = [float(torch.log_softmax(lg[0].float(), -1)[t]) for lg, t in zip(res.logits, gen, strict=False)]
    (out / "reference.json").write_text(json.dumps({"prompt": ids, "tokens": gen, "logprobs": lps}))
    print(f"HF + PEFT: {len(gen)} tokens {gen}; adapter in {out / 'adapter'}")


def check(gguf: str, out: Path, threads: int) -> None:
    import llama_cpp as lc
    import numpy as np

    ref = json.loads((out / "reference.json").read_text())
    lc.llama_backend_init()
    model = lc.llama_model_load_from_file(gguf.encode(), lc.llama_model_default_params())
    cp = lc.llama_context_default_params()
    cp.n_ctx, cp.n_threads, cp.n_threads_batch = 1024, threads, threads
    cp.type_k = cp.type_v = lc.GGML_TYPE_F32
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = lc.llama_init_from_model(model, cp)
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    batch = lc.llama_batch_init(1024, 0, 1)

    def greedy() -> tuple[list[int], list[float]]:
        lc.llama_memory_clear(lc.llama_get_memory(ctx), True)
        feed, pos, toks, lps = list(ref["prompt"]), 0, [], []
        for _ in ref["tokens"]:
            for i, t in enumerate(feed):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = t, pos + i, 1, int(i == len(feed) - 1)
                batch.seq_id[i][0] = 0
            batch.n_tokens = len(feed)
            if lc.llama_decode(ctx, batch) != 0:
                sys.exit("llama_decode failed")
            pos += len(feed)
            lg = np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, len(feed) - 1), shape=(n_vocab,)).astype(np.float64)
            t = int(lg.argmax())
            toks.append(t)
            lps.append(float(lg[t] - lg.max() - np.log(np.exp(lg - lg.max()).sum())))
            feed = [t]
        return toks, lps

    for name in ("without the adapter", "with the adapter"):
        t0 = time.perf_counter()
        if name == "with the adapter":
            adapter = lc.llama_adapter_lora_init(model, str(out / "adapter.gguf").encode())
            if not adapter:
                sys.exit(f"{out / 'adapter.gguf'}: llama.cpp could not load this LoRA adapter")
            if lc.llama_set_adapters_lora(ctx, (lc.llama_adapter_lora_p_ctypes * 1)(adapter), 1,
                                          (ctypes.c_float * 1)(1.0)) != 0:
                sys.exit("llama_set_adapters_lora failed")
        load_ms = 1e3 * (time.perf_counter() - t0)
        toks, lps = greedy()
        gap = max(abs(a - b) for a, b in zip(lps, ref["logprobs"], strict=False))
        print(f"llama.cpp F32 {name}: greedy tokens = HF + PEFT's: {'yes' if toks == ref['tokens'] else 'no'}; "
              f"max |logprob difference| {gap:.2e} over {len(toks)} tokens"
              + (f"; adapter load + set {load_ms:.0f} ms" if name == "with the adapter" else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="step", required=True)
    mk = sub.add_parser("make", help="the PEFT adapter and HF + PEFT's greedy tokens (memrl's venv)")
    mk.add_argument("--model", required=True, help="the model directory (memrl model import's output)")
    mk.add_argument("--tokens", type=int, default=16)
    mk.add_argument("--seed", type=int, default=0)
    ck = sub.add_parser("check", help="llama.cpp without and with the adapter GGUF (the llama venv)")
    ck.add_argument("--gguf", required=True, help="the float32 GGUF of the same weights")
    ck.add_argument("--threads", type=int, default=1)
    for p in (mk, ck):
        p.add_argument("--out", required=True, help="working directory (adapter/, adapter.gguf, reference.json)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.step == "make":
        make(args.model, out, args.tokens, args.seed)
    else:
        check(args.gguf, out, args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
