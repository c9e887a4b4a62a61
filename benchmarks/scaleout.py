"""Scale-out figures on CPU: update step time at world size 1 vs 2 (FSDP2 on gloo), weight-sync time by
model size (tiny, small, a 0.5B-shaped random Qwen2) through the object store, a gloo broadcast and a
safetensors directory, and the share of a real Ray training step spent in weight sync (2 ranks + 2
transformers engines, object store vs broadcast).

    PYTHONPATH=$PWD RAY_AUTH_MODE=disabled python benchmarks/scaleout.py [--skip-ray] [--skip-05b]
        [--only-sync | --only-ray] [--kv-cache padded|slots]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.training.ranks import distributed as D
from memrl.training.update.packing import TrainBatch, split, weigh
from memrl.types import Segment

WARMUP, TIMED = 2, 5


def _rows(vocab: int, n: int = 16, prompt: int = 96, response: int = 32) -> TrainBatch:
    """`n` rows weighed over all of them (token-mean)."""
    rng = random.Random(0)
    return weigh([Segment([rng.randrange(vocab) for _ in range(prompt)], [rng.randrange(vocab) for _ in range(response)],
                          [-3.0] * response, advantage=rng.uniform(-1, 1), trajectory_id=f"t{i // 4}")
                  for i in range(n)], "token-mean")


def _cfg(model: str) -> TrainConfig:
    return load_config(TrainConfig, [f"model.path={model}", "algorithm.kl_coef=0.001", "optim.lr=1e-5",
                                     "trainer.token_budget=1024"])


def _time_steps(worker, rows: TrainBatch) -> tuple[float, float]:
    """(mean update seconds, mean full-state gather seconds) over TIMED steps after WARMUP."""
    steps, gathers = [], []
    for i in range(WARMUP + TIMED):
        t0 = time.perf_counter()
        worker.train_rows(rows)
        t1 = time.perf_counter()
        worker.full_state()
        t2 = time.perf_counter()
        if i >= WARMUP:
            steps.append(t1 - t0)
            gathers.append(t2 - t1)
    return statistics.fmean(steps), statistics.fmean(gathers)


def _rank(rank: int, model: str, port: int, vocab: int, out: str) -> None:
    torch.set_num_threads(1)
    from memrl.training.ranks.workers import PolicyWorker

    w = PolicyWorker(_cfg(model), D.DistInfo(rank, 2, "127.0.0.1", port))
    step, gather = _time_steps(w, split(_rows(vocab), 2)[rank])  # this rank's share, as the driver sends it
    if rank == 0:
        Path(out).write_text(f"{step} {gather}")
    w.close()


def world_size_step(model: str) -> None:
    from transformers import AutoConfig

    from memrl.training.ranks.workers import PolicyWorker

    vocab = AutoConfig.from_pretrained(model).vocab_size
    torch.set_num_threads(1)  # the same one thread per process as each rank
    s1, g1 = _time_steps(PolicyWorker(_cfg(model)), _rows(vocab))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "r0")
        mp.spawn(_rank, args=(model, D.free_port(), vocab, out), nprocs=2, join=True)
        s2, g2 = map(float, Path(out).read_text().split())
    print("\n## update step, tiny model, 16 rows x 128 tokens (1 thread per process)")
    print("| world size | step s | full-state gather s |")
    print("|---|---|---|")
    print(f"| 1 | {s1:.3f} | {g1:.4f} |")
    print(f"| 2 (FSDP2, gloo) | {s2:.3f} | {g2:.4f} |")


def _random_05b(tmp: str) -> str:
    """A Qwen2.5-0.5B-shaped random model (494M parameters), bf16, saved with the tiny tokenizer."""
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from memrl.models.tiny import cached_tiny_model

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2, tie_word_embeddings=True,
                      max_position_embeddings=4096, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    with torch.device("cpu"):
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    return tmp


def _model_pairs(tmp: str, skip_05b: bool):  # noqa: ANN202
    """(name, source model, destination model) for tiny, small and (unless skipped) the 0.5B shape; two
    instances of each, loaded one size at a time."""
    from transformers import AutoModelForCausalLM

    from memrl.models.tiny import cached_tiny_model

    sizes = [("tiny", str(cached_tiny_model("tiny"))), ("small", str(cached_tiny_model("small")))]
    if not skip_05b:
        sizes.append(("0.5B-shaped (bf16)", _random_05b(os.path.join(tmp, "m05"))))
    for name, path in sizes:
        yield name, AutoModelForCausalLM.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)


def sync_by_size(skip_05b: bool) -> None:
    """Gather (CPU copy of the state dict) -> ray.put -> ray.get -> copy into a second model instance."""
    import ray

    torch.set_num_threads(2)
    print("\n## weight sync by model size (one process: state-dict copy, object store put/get, load)")
    print("| model | params | MB | copy s | put s | get s | load s | total s |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, dst in _model_pairs(tmp, skip_05b):
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                sd = {k: v.detach().to("cpu", copy=True) for k, v in src.state_dict().items()}
                t1 = time.perf_counter()
                ref = ray.put(sd)
                t2 = time.perf_counter()
                got = ray.get(ref)
                t3 = time.perf_counter()
                with torch.no_grad():
                    dst.load_state_dict(got, strict=False)
                t4 = time.perf_counter()
                times.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
                del ref, got
            c, p, g, ld = (min(x) for x in zip(*times, strict=True))
            n = sum(p.numel() for p in src.parameters())  # tied embeddings counted once
            mb = sum(p.numel() * p.element_size() for p in src.parameters()) / 2**20
            print(f"| {name} | {n / 1e6:.1f}M | {mb:.0f} | {c:.3f} | {p:.3f} | {g:.3f} | {ld:.3f} | {c + p + g + ld:.3f} |")
            del src, dst, sd


def _broadcast_once(src, dst, bucket_bytes: int) -> tuple[float, float]:  # noqa: ANN001
    """One gloo broadcast of src's state dict into dst (receiver in a second thread, loopback TCP):
    (seconds until the receiver has loaded everything, bytes)."""
    import threading

    from memrl.engines.weight_transfer import TransferSpec, WeightTransfer, receive_all

    spec = TransferSpec("127.0.0.1", D.free_port(), 2, "gloo", bucket_bytes=bucket_bytes)
    box: dict[str, object] = {}
    th = threading.Thread(target=lambda: box.setdefault("rx", WeightTransfer(spec, 1)))
    th.start()
    tx = WeightTransfer(spec, 0)
    th.join()
    rx = box["rx"]
    skip = ("lm_head.weight",) if src.config.tie_word_embeddings else ()
    times = []
    for _ in range(3):
        done: dict[str, float] = {}

        def receive() -> None:
            got = receive_all(rx)  # noqa: B023
            with torch.no_grad():
                dst.load_state_dict(got, strict=False)
            done["t"] = time.perf_counter()  # noqa: B023

        th = threading.Thread(target=receive)
        t0 = time.perf_counter()
        th.start()
        sent = tx.send(src.state_dict(), skip=skip)
        th.join()
        times.append(done["t"] - t0)
    return min(times), sent


def _directory_once(src, dst, tmp: str) -> float:  # noqa: ANN001
    """save_file of the state dict (tied lm_head left out) + load_file + load into dst, best of 3."""
    from safetensors.torch import load_file, save_file

    skip = "lm_head.weight" if src.config.tie_word_embeddings else None
    f = os.path.join(tmp, "model.safetensors")
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        save_file({k: v.contiguous() for k, v in src.state_dict().items() if k != skip}, f)
        with torch.no_grad():
            dst.load_state_dict(load_file(f), strict=False)
        times.append(time.perf_counter() - t0)
    return min(times)


def sync_modes_by_size(skip_05b: bool) -> None:
    """Object store (copy + put + get + load), gloo broadcast (send + receive + load), directory."""
    import ray

    torch.set_num_threads(2)
    print("\n## weight sync by mode and model size (one process; broadcast: 2 threads over loopback gloo, "
          "256 MiB buckets; best of 3)")
    print("| model | MB | object store s | broadcast s | directory s |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for name, src, dst in _model_pairs(tmp, skip_05b):
            store = []
            for _ in range(3):
                t0 = time.perf_counter()
                ref = ray.put({k: v.detach().to("cpu", copy=True) for k, v in src.state_dict().items()})
                with torch.no_grad():
                    dst.load_state_dict(ray.get(ref), strict=False)
                store.append(time.perf_counter() - t0)
                del ref
            bcast, sent = _broadcast_once(src, dst, 256 << 20)
            dirs = _directory_once(src, dst, tmp)
            print(f"| {name} | {sent / 2**20:.0f} | {min(store):.3f} | {bcast:.3f} | {dirs:.3f} |")
            del src, dst


def ray_run_share(tmp: str, mode: str = "object_store", kv_cache: str = "") -> None:
    """A real 2-rank + 2-engine run on the tiny model: mean sync and step time per step (`kv_cache`: the
    replicas' engine.hf.kv_cache, "" = the default)."""
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.assemble import assemble
    from memrl.training.trainer import Trainer

    cfg = load_config(TrainConfig, [
        f"model.path={cached_tiny_model('tiny')}", f"out_dir={tmp}/run_{mode}", "trainer.steps=4",
        "workflow.chunk_tokens=24", "workflow.max_memory_tokens=6",
        "workflow.max_final_tokens=3", "data.synthetic.num_chunks=2", "data.synthetic.chunk_words=8",
        "trainer.batch_size=2", "algorithm.n=3", "optim.lr=1e-3", "trainer.save_every=0",
        "trainer.progress=false", "trainer.tensorboard=false", "trainer.num_workers=2",
        "trainer.cpus_per_worker=0.5", "rollout.num_engines=2", "rollout.cpus_per_engine=0.5",
        f"rollout.weight_sync={mode}", *([f"engine.hf.kv_cache={kv_cache}"] if kv_cache else []),
    ])
    hist = Trainer(assemble(cfg)).fit()[1:]  # the first step includes start-up work
    sync = statistics.fmean(h["time/sync_s"] for h in hist)
    step = statistics.fmean(h["time/step_s"] for h in hist)
    print(f"\n## Ray run, tiny model, 2 FSDP2 ranks + 2 HFEngine replicas, weight_sync={mode} (steps 2-4)")
    parts = {k[len("time/sync_"):]: statistics.fmean(h[k] for h in hist) for k in hist[0]
             if k.startswith("time/sync_") and k != "time/sync_s"}
    print(f"step {step:.3f} s, weight sync {sync:.3f} s = {100 * sync / step:.1f}% of the step; parts (s): "
          + ", ".join(f"{k} {v:.3f}" for k, v in sorted(parts.items())))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--skip-ray", action="store_true")
    ap.add_argument("--skip-05b", action="store_true")
    ap.add_argument("--only-sync", action="store_true", help="only the sync-by-mode table")
    ap.add_argument("--only-ray", action="store_true", help="only the Ray runs (object store vs broadcast)")
    ap.add_argument("--kv-cache", choices=("padded", "slots"), default="",
                    help="the Ray runs' engine.hf.kv_cache (default: the engine's; padded: the layout of the "
                         "figures in docs/guides/scaleout.md, the default before 2026-11-28)")
    args = ap.parse_args()
    import ray

    from memrl.models.tiny import cached_tiny_model

    if not (args.only_sync or args.only_ray):
        world_size_step(str(cached_tiny_model("tiny")))
    with tempfile.TemporaryDirectory(prefix="sb", dir="/tmp") as tmp:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        ray.init(_temp_dir=os.path.join(tmp, "ray"), num_cpus=4, include_dashboard=False, log_to_driver=False,
                 object_store_memory=4 * 2**30)
        try:
            if not (args.only_sync or args.only_ray):
                sync_by_size(args.skip_05b)
            if not args.only_ray:
                sync_modes_by_size(args.skip_05b)
            if not args.skip_ray and not args.only_sync:
                for mode in ("object_store", "broadcast"):
                    ray_run_share(tmp, mode, args.kv_cache)
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
