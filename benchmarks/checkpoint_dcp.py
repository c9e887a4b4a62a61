"""Checkpoint figures: save (gathered HF weights by rank 0 + DCP optimizer shards) and resume time of a
PolicyWorker sharded with FSDP2 in a process group of one (nccl on CUDA, gloo on CPU), by model size,
and a check that the resumed optimizer state is bit-identical.

    PYTHONPATH=$PWD python benchmarks/checkpoint_dcp.py --device cuda [--sizes tiny,small,0.5b]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time

import torch
import torch.distributed as dist

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.update.packing import TrainBatch, weigh
from memrl.types import Segment


def _model(name: str, tmp: str) -> str:
    from memrl.models.tiny import cached_tiny_model

    if name != "0.5b":
        return str(cached_tiny_model(name))
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=4096, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    path = os.path.join(tmp, "m05")
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _rows(vocab: int) -> TrainBatch:
    rng = random.Random(0)
    return weigh([Segment([rng.randrange(vocab) for _ in range(64)], [rng.randrange(vocab) for _ in range(16)],
                          [-3.0] * 16, advantage=rng.uniform(-1, 1), trajectory_id=f"t{i}") for i in range(4)],
                 "token-mean")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--sizes", default="tiny,small,0.5b")
    args = ap.parse_args()
    from transformers import AutoConfig

    from memrl.training.ranks.workers import PolicyWorker

    backend = "nccl" if args.device == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{D.free_port()}", rank=0, world_size=1)
    print(f"\n## checkpoint save / resume, FSDP2 in a {backend} group of one on {args.device}, AdamW (fp32)")
    print("| model | params | save s (HF + DCP) | DCP optimizer MB | resume s | optimizer bit-identical |")
    print("|---|---|---|---|---|---|")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.sizes.split(","):
                path = _model(name, tmp)
                cfg = load_config(TrainConfig, [f"model.path={path}", f"model.device={args.device}",
                                                "algorithm.kl_coef=0", "trainer.token_budget=4096"])
                w = PolicyWorker(cfg)
                w.train_rows(_rows(AutoConfig.from_pretrained(path).vocab_size))
                want = D.full_optim_state(w.model, w.opt)
                t0 = time.perf_counter()
                ck = w.save(os.path.join(tmp, f"ck_{name}"), 1, {"step": 1, "data_position": 0})
                t1 = time.perf_counter()
                del w
                t2 = time.perf_counter()
                r = PolicyWorker(cfg, start=ck)
                t3 = time.perf_counter()
                got = D.full_optim_state(r.model, r.opt)
                same = all(torch.equal(v, got["state"][n][k]) for n, st in want["state"].items() for k, v in st.items())
                mb = sum(os.path.getsize(os.path.join(ck, "optimizer", f)) for f in os.listdir(os.path.join(ck, "optimizer")))
                n = sum(p.numel() for p in r.model.parameters())
                print(f"| {name} | {n / 1e6:.1f}M | {t1 - t0:.2f} | {mb / 2**20:.0f} | {t3 - t2:.2f} | {same} |")
                del r, want, got
                if args.device == "cuda":
                    torch.cuda.empty_cache()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
