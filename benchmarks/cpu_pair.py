"""Do this machine's CPUs add up? One single-threaded matmul loop alone, then one pinned to each of two CPUs
at once; prints matmuls per second. On a machine whose two CPUs are independent cores the pair runs at the
single rate each; where they share a physical core (SMT siblings behind a VM's vCPUs), caches or memory
bandwidth, each runs slower, and work placed "on its own CPU" (benchmarks/async_rl.py) slows its neighbour.

  .venv/bin/python benchmarks/cpu_pair.py [--cpus 0,1] [--seconds 4] [--size 256]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time


def work(cpu: int, seconds: float, size: int, q: mp.Queue) -> None:
    import torch

    torch.set_num_threads(1)
    os.sched_setaffinity(0, {cpu})
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(50):
        a @ b
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(50):
            a @ b
        n += 50
    q.put((cpu, n / (time.perf_counter() - t0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", default="0,1")
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--size", type=int, default=256)
    args = ap.parse_args()
    cpus = [int(c) for c in args.cpus.split(",")]
    q: mp.Queue = mp.Queue()
    p = mp.Process(target=work, args=(cpus[0], args.seconds, args.size, q))
    p.start()
    p.join()
    _, alone = q.get()
    ps = [mp.Process(target=work, args=(c, args.seconds, args.size, q)) for c in cpus]
    for x in ps:
        x.start()
    for x in ps:
        x.join()
    together = dict(q.get() for _ in cpus)
    print(f"alone on CPU {cpus[0]}: {alone:.0f} matmuls/s ({args.size}x{args.size}, 1 thread)")
    for c in cpus:
        print(f"together, CPU {c}: {together[c]:.0f} matmuls/s ({100 * (together[c] / alone - 1):+.0f}%)")


if __name__ == "__main__":
    main()
