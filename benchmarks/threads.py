"""Threads that help, never hurt: the hf engine's generation and the policy update at 1 and 2 torch threads,
alone and beside a competing process, under each OpenMP wait policy, side by side in one run.

Each cell is a fresh worker process (the wait policy is read once, when torch is imported), pinned with
taskset to --cores, its threads set through memrl.threads (threads.intra_op, inter_op 1) and
OMP_WAIT_POLICY set (or left unset: "default", OpenMP's spin-then-sleep, what torch does without memrl)
in its environment. A cell measures, for --seconds each:

  gen     the hf engine (engine.hf.kv_cache=padded, continuous batching): --concurrency requests of
          --prompt random prompt tokens, --max-tokens greedy tokens each, over and over: generated tokens/s
  update  forward + backward + AdamW over --rows rows of --row-tokens tokens (the update's arithmetic):
          trained tokens/s

"beside" cells run one competitor next to the worker on the same cores: a one-thread torch matmul loop
(what another user's job looks like), started before the worker and stopped after; its matmuls/s is
reported, so a setting that slows the neighbour shows too. Cells are interleaved over --rounds (each round
runs every cell once), so a burst of other load hits all settings alike; the table shows the median.
"auto" cells run `memrl eval` / `memrl ask`'s default thread count (threads.intra_op=0: the CPUs the worker
may use less those other processes keep busy when it starts, memrl.threads.auto_threads; `memrl train` keeps
every CPU) under memrl's default policy (PASSIVE); the table shows the count it picked. Columns: tokens/s,
the ratio to the 1-thread cell with the same load (goal: 2 threads alone >= 1.6x, 2 threads beside a
competitor >= 1.0x), CPU seconds per wall second of the worker (2 threads that spin burn CPU without speed),
and the competitor's rate.

    python benchmarks/threads.py              # small preset (23.6M), cores 0,1, 10 cells x 2 rounds: ~8 min quiet
    python benchmarks/threads.py --quick      # tiny preset, 2 s phases, one round: a smoke run
    python benchmarks/threads.py --cores 0-15 --threads 1 2 4 8 16 --loads alone   # a 16-core laptop
    python benchmarks/threads.py --dry-run    # the cells, no work
    python benchmarks/threads.py --spin 2000  # a 128x128 matmul loop at 1 and 2 threads under each wait policy,
                                              # also PASSIVE set after `import torch` (no effect): wall and CPU s

Each phase runs whole batches until --seconds have passed, so a slow cell overshoots by up to one batch (a
fully loaded machine took 13 min for --quick).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
POLICIES = ("default", "active", "passive")


# --------------------------------------------------------------------------------------- worker side


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def measure_gen(engine: Any, args: argparse.Namespace, seconds: float) -> dict[str, float]:
    """Generated tokens/s of the engine over batches of args.concurrency requests, for about `seconds`."""
    import asyncio
    import random

    from memrl.engines.base import SamplingParams

    rng = random.Random(0)
    sampling = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)

    async def batch() -> int:
        prompts = [[rng.randrange(10, 4000) for _ in range(args.prompt)] for _ in range(args.concurrency)]
        outs = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
        return sum(len(o.token_ids) for o in outs)

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(batch())  # warm-up: allocations, first calls
        tokens, c0, t0 = 0, _cpu(), time.perf_counter()
        while True:
            tokens += loop.run_until_complete(batch())
            wall = time.perf_counter() - t0
            if wall >= seconds:
                break
    finally:
        loop.close()
    return {"tok_s": tokens / wall, "cpu_per_wall": (_cpu() - c0) / wall}


def measure_update(path: str, args: argparse.Namespace, seconds: float) -> dict[str, float]:
    """Trained tokens/s: forward, token log-probabilities, backward and an AdamW step over args.rows rows."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, 4000, (args.rows, args.row_tokens), generator=g)

    def step() -> None:
        logits = model(input_ids=ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        (-lp.mean()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up
    n, c0, t0 = 0, _cpu(), time.perf_counter()
    while True:
        step()
        n += 1
        wall = time.perf_counter() - t0
        if wall >= seconds:
            break
    return {"tok_s": n * args.rows * args.row_tokens / wall, "cpu_per_wall": (_cpu() - c0) / wall}


def worker(args: argparse.Namespace) -> int:
    from memrl.threads import in_effect, set_torch_threads

    if args.threads == 0:  # threads.intra_op=0, memrl eval / ask's default: the CPUs other processes leave free
        from memrl.threads import ThreadsSection, intra_op_threads

        args.threads = intra_op_threads(ThreadsSection())[0]
    set_torch_threads(args.threads, 1)  # what memrl train / eval / ask do with threads.intra_op / inter_op
    from memrl.engines.hf import HFEngine

    engine = HFEngine(args.model, device="cpu", dtype="float32", max_batch_size=args.concurrency, seed=0,
                      deterministic=False, kv_cache="padded")
    out = {"threads": in_effect(), "gen": measure_gen(engine, args, args.seconds)}
    out["update"] = measure_update(args.model, args, args.seconds)
    print(json.dumps(out), flush=True)
    return 0


def competitor(args: argparse.Namespace) -> int:
    """A one-thread matmul loop until stdin closes; prints its matmuls/s at the end."""
    import threading

    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(args.size, args.size), torch.randn(args.size, args.size)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    n, t0 = 0, time.perf_counter()
    while not stop.is_set():
        for _ in range(20):
            a @ b
        n += 20
    print(json.dumps({"matmul_s": n / (time.perf_counter() - t0)}), flush=True)
    return 0


def spin_worker(mode: str, threads: int, iters: int) -> int:
    """A 128x128 matmul loop with a Python yield between ops (an engine step's shape); `mode`: unset, ACTIVE,
    PASSIVE (set before torch is imported) or PASSIVE-after-import (set after: libgomp has read it already)."""
    if mode in ("ACTIVE", "PASSIVE"):
        os.environ["OMP_WAIT_POLICY"] = mode
    import torch

    if mode == "PASSIVE-after-import":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    torch.set_num_threads(threads)
    a = torch.randn(128, 128)
    for _ in range(200):
        a @ a
    c0, t0 = _cpu(), time.perf_counter()
    for _ in range(iters):
        a @ a
        time.sleep(0)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    print(f"| {mode} | {threads} | {wall:.2f} | {cpu:.2f} | {cpu / wall:.2f} |", flush=True)
    return 0


def spin(args: argparse.Namespace) -> int:
    print(f"| OMP_WAIT_POLICY | threads | wall s ({args.spin} matmuls) | CPU s | CPU/wall |\n|---|---:|---:|---:|---:|",
          flush=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    for mode, t in (("unset", 1), ("unset", 2), ("ACTIVE", 2), ("PASSIVE", 2), ("PASSIVE-after-import", 2)):
        try:
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--spin-worker", mode, str(t),
                            str(args.spin)], env=env, timeout=args.spin_timeout, check=True)
        except subprocess.TimeoutExpired:
            print(f"| {mode} | {t} | > {args.spin_timeout:g} (stopped) | | |", flush=True)
    return 0


# --------------------------------------------------------------------------------------- orchestrator


def cells(args: argparse.Namespace) -> list[tuple[int, str, str]]:
    """(threads, policy, load) of every cell: one thread once per load (its wait policy has no team to
    wait on), more threads under each policy."""
    out = []
    for load in args.loads:
        for t in args.threads:
            for p in (["passive"] if t in (0, 1) else args.policies):  # auto: memrl's own policy
                out.append((t, p, load))
    return out


def run_cell(args: argparse.Namespace, path: str, threads: int, policy: str, load: str) -> dict[str, Any]:
    pin = ["taskset", "-c", args.cores] if args.cores and shutil.which("taskset") else []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OMP_NUM_THREADS", None)
    env.pop("GOMP_SPINCOUNT", None)
    if policy != "default":
        env["OMP_WAIT_POLICY"] = policy.upper()
    me = [sys.executable, str(Path(__file__).resolve())]
    comp = None
    if load == "beside":
        comp = subprocess.Popen([*pin, *me, "--competitor", "--size", str(args.size)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        time.sleep(1.0)  # the competitor is running before the worker starts
    try:
        cmd = [*pin, *me, "--worker", "--model", path, "--threads", str(threads), "--seconds", str(args.seconds),
               "--concurrency", str(args.concurrency), "--prompt", str(args.prompt),
               "--max-tokens", str(args.max_tokens), "--rows", str(args.rows), "--row-tokens", str(args.row_tokens)]
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
        if res.returncode or not lines:
            raise SystemExit(f"worker failed ({threads} threads, {policy}, {load}):\n{res.stderr[-2000:]}")
        out = json.loads(lines[-1])
    finally:
        if comp is not None:
            text, _ = comp.communicate(input="", timeout=60)
            done = [ln for ln in text.splitlines() if ln.startswith("{")]
            if done:
                out["competitor"] = json.loads(done[-1])["matmul_s"]
    return out


def table(results: dict[tuple[int, str, str], list[dict[str, Any]]]) -> str:
    def med(rows: list[dict[str, Any]], *keys: str) -> float:
        vals = []
        for r in rows:
            v: Any = r
            for k in keys:
                v = v.get(k) if isinstance(v, dict) else None
            if v is not None:
                vals.append(float(v))
        return statistics.median(vals) if vals else float("nan")

    lines = ["| load | threads | OMP_WAIT_POLICY | gen tok/s | gen vs 1 thread | gen CPU/wall | update tok/s | "
             "update vs 1 thread | update CPU/wall | competitor matmul/s |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (t, p, load), rows in results.items():
        one = results.get((1, "passive", load), [])
        g, u = med(rows, "gen", "tok_s"), med(rows, "update", "tok_s")
        g1, u1 = med(one, "gen", "tok_s"), med(one, "update", "tok_s")
        comp = med(rows, "competitor")
        label = str(t) if t else f"auto ({med(rows, 'threads', 'intra_op'):.0f})"
        lines.append(f"| {load} | {label} | {'-' if t == 1 else p} | {g:.0f} | {g / g1:.2f}x | "
                     f"{med(rows, 'gen', 'cpu_per_wall'):.2f} | {u:.0f} | {u / u1:.2f}x | "
                     f"{med(rows, 'update', 'cpu_per_wall'):.2f} | {'-' if comp != comp else f'{comp:.0f}'} |")
    return "\n".join(lines)


def _threads(text: str) -> int:
    return 0 if text == "auto" else int(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small", help="tiny model preset (memrl.models.tiny; built locally once)")
    ap.add_argument("--threads", nargs="+", type=_threads, default=[1, 2, 0],
                    help="thread counts; auto (= 0) is memrl eval / ask's default, threads.intra_op=0: the usable "
                         "CPUs less those other processes keep busy when it starts (memrl.threads.auto_threads)")
    ap.add_argument("--policies", nargs="+", default=list(POLICIES), choices=POLICIES,
                    help="OMP_WAIT_POLICY of the multi-thread cells (default = unset: OpenMP's spin, then sleep)")
    ap.add_argument("--loads", nargs="+", default=["alone", "beside"], choices=("alone", "beside"))
    ap.add_argument("--cores", default="0,1", help="taskset core list of the worker and competitor ('' = none)")
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per phase (gen, update)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--row-tokens", type=int, default=256)
    ap.add_argument("--size", type=int, default=256, help="the competitor's matmul size")
    ap.add_argument("--json", default="", help="also write every cell's figures here")
    ap.add_argument("--quick", action="store_true", help="tiny preset, 2 s phases, one round")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--spin", type=int, default=0, help="only the matmul-loop check, this many matmuls per run")
    ap.add_argument("--spin-timeout", type=float, default=100.0, help="--spin: seconds before a run is stopped")
    ap.add_argument("--spin-worker", nargs=3, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--competitor", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.threads = args.threads[0]
        return worker(args)
    if args.competitor:
        return competitor(args)
    if args.spin_worker:
        return spin_worker(args.spin_worker[0], int(args.spin_worker[1]), int(args.spin_worker[2]))
    if args.spin:
        return spin(args)
    if args.quick:
        args.preset, args.seconds, args.rounds = "tiny", 2.0, 1
    plan = cells(args)
    print(f"{len(plan)} cells x {args.rounds} rounds, 2 phases of {args.seconds:g} s each; preset {args.preset}, "
          f"cores {args.cores or 'all'}; gen: C={args.concurrency}, prompt {args.prompt}, {args.max_tokens} tokens; "
          f"update: {args.rows} x {args.row_tokens} tokens", file=sys.stderr)
    if args.dry_run:
        for c in plan:
            print(c)
        return 0
    from memrl.models.tiny import cached_tiny_model

    path = str(cached_tiny_model(args.preset))
    results: dict[tuple[int, str, str], list[dict[str, Any]]] = {c: [] for c in plan}
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for c in plan:
            results[c].append(run_cell(args, path, *c))
            print(f"round {r + 1}: {c} done at {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps([{"threads": t, "policy": p, "load": ld, "runs": rows}
                                               for (t, p, ld), rows in results.items()], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
