"""Time and peak memory of building RULER-HQA-style eval sets from the real HotpotQA subset.

    .venv/bin/python benchmarks/build_longctx.py [--questions 128] [--docs 50,...,6400] [--source FILE]
                                                  [--tracemalloc] [--keep DIR]

Each document count is built in a fresh subprocess (so its peak RSS is its own): load the source, build
the pool, then build + write eval_{N}.json for the questions. Columns: seconds to build and write (source
loading excluded), seconds per 1000 documents per question (flat = linear in N), output size, the
process's peak RSS and, with --tracemalloc, the Python heap peak during the build (slower).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = (50, 100, 200, 400, 800, 1600, 3200, 6400)


def one(source: str, n: int, questions: int, out_dir: str, trace: bool) -> dict:
    """Build eval_{n}.json in this process; returns the measurements."""
    from memrl.data.hotpotqa import load_hotpotqa
    from memrl.data.longctx import build_eval_sets

    t0 = time.perf_counter()
    tasks = load_hotpotqa(source)
    load_s = time.perf_counter() - t0
    if trace:
        import tracemalloc

        tracemalloc.start()
    t0 = time.perf_counter()
    build_eval_sets(tasks, out_dir, (n,), num_questions=questions, seed=42, source=[source])
    build_s = time.perf_counter() - t0
    heap_peak = None
    if trace:
        heap_peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    path = Path(out_dir) / f"eval_{n}.json"
    return {
        "docs": n, "questions": questions, "load_s": load_s, "build_s": build_s,
        "bytes": path.stat().st_size,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "heap_peak_mb": heap_peak,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--source", default=None,
                   help="HotpotQA dev distractor file (default: `memrl data fetch hotpotqa_dev_distractor`'s)")
    ap.add_argument("--questions", type=int, default=128)
    ap.add_argument("--docs", default=",".join(map(str, DOCS)))
    ap.add_argument("--tracemalloc", action="store_true", help="also measure the Python heap peak (slower)")
    ap.add_argument("--keep", default=None, help="write the sets here instead of a deleted temp dir")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.source is None:
        from memrl.data.fetch import fetched_path  # noqa: PLC0415 - only for the default
        from memrl.errors import UserError  # noqa: PLC0415

        try:
            args.source = str(fetched_path("hotpotqa_dev_distractor"))
        except UserError as e:
            raise SystemExit(f"--source: {e} (or pass --source FILE)") from None
    if args.one is not None:
        print(json.dumps(one(args.source, args.one, args.questions, args.out, args.tracemalloc)))
        return 0
    if not Path(args.source).exists():
        print(f"source {args.source} not found", file=sys.stderr)
        return 1
    docs = [int(x) for x in args.docs.split(",")]
    print(f"source: {Path(args.source).resolve()}  questions: {args.questions}  cpus: {os.cpu_count()}")
    head = "| docs | build+write s | s per 1k docs/question | output MB | peak RSS MB |"
    head += " heap peak MB |" if args.tracemalloc else ""
    print(head)
    print("|---:|---:|---:|---:|---:|" + ("---:|" if args.tracemalloc else ""))
    total = 0.0
    for n in docs:
        with tempfile.TemporaryDirectory() as tmp:
            out = args.keep or tmp
            cmd = [sys.executable, __file__, "--one", str(n), "--source", args.source, "--questions",
                   str(args.questions), "--out", out] + (["--tracemalloc"] if args.tracemalloc else [])
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if res.returncode != 0:
                print(res.stderr, file=sys.stderr)
                return res.returncode
            r = json.loads(res.stdout.strip().splitlines()[-1])
        total += r["build_s"]
        per_k = r["build_s"] / (n / 1000) / r["questions"]
        line = (f"| {n} | {r['build_s']:.2f} | {per_k:.4f} | {r['bytes'] / 1e6:.1f} | {r['maxrss_mb']:.0f} |")
        if args.tracemalloc:
            line += f" {r['heap_peak_mb']:.0f} |"
        print(line, flush=True)
    print(f"total build time {total:.1f}s (source load ~{r['load_s']:.2f}s per process, excluded)")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
