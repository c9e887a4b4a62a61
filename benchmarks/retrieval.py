"""Throughput and latency of BM25 retrieval on the HotpotQA corpus, in-process and over HTTP.

    .venv/bin/python benchmarks/retrieval.py [--source FILE] [--queries 1000] [--topk 5]
                                             [--concurrency 1,16,64] [--compare]

Builds the paragraph corpus (~11k paragraphs) from a HotpotQA dev file (--source; default $MEMRL_HOTPOTQA_DEV), then for each concurrency c
runs `--queries` single-query requests from c concurrent clients: once against BM25Retriever in this
process, once against `memrl serve retrieval` started here on a free 127.0.0.1 port (cache off, so every
request is scored) and stopped at the end. Prints queries/s and p50/p99 latency per request.
`--compare` also times rank_bm25 against bm25s on the same corpus (how the library was picked).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# a HotpotQA dev file in its original layout: --source, else $MEMRL_HOTPOTQA_DEV, else the one
# `memrl data fetch hotpotqa_dev_distractor` cached


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def drive(retriever, queries: list[str], topk: int, concurrency: int) -> tuple[float, float, float]:
    """(queries/s, p50 ms, p99 ms): `concurrency` workers take queries from one shared list."""
    lat: list[float] = []
    it = iter(queries)

    async def worker() -> None:
        for q in it:
            t = time.perf_counter()
            await retriever.retrieve([q], topk)
            lat.append(time.perf_counter() - t)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    ms = np.array(lat) * 1000
    return len(queries) / wall, float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def start_server(corpus: str) -> tuple[subprocess.Popen, str]:
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "memrl.cli", "serve", "retrieval", "--corpus", corpus,
                             "--port", str(port), "--cache-size", "0", "--max-concurrency", "8"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("the server did not come up in 120 s")


def compare_libraries(docs, queries: list[str]) -> None:
    """Index time and single-query scoring rate of bm25s (as used here) and rank_bm25 (BM25Okapi)."""
    from bm25s.stopwords import STOPWORDS_EN
    from rank_bm25 import BM25Okapi

    from memrl.services.retrieval import BM25Retriever, tokenize

    stop = frozenset(STOPWORDS_EN)
    t0 = time.perf_counter()
    r = BM25Retriever(docs)
    idx_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    r.search(queries[:500], 5)
    qps = 500 / (time.perf_counter() - t0)
    print(f"bm25s      index {idx_s:5.2f}s  {qps:9.1f} queries/s (500 queries, top-5)")
    t0 = time.perf_counter()
    ok = BM25Okapi([tokenize(f"{d.title} {d.text}", stop) for d in docs])
    idx_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for q in queries[:50]:
        np.argsort(-ok.get_scores(tokenize(q, stop)))[:5]
    qps = 50 / (time.perf_counter() - t0)
    print(f"rank_bm25  index {idx_s:5.2f}s  {qps:9.1f} queries/s (50 queries, top-5)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=os.environ.get("MEMRL_HOTPOTQA_DEV") or None,
                    help="HotpotQA dev distractor file (default: $MEMRL_HOTPOTQA_DEV, else `memrl data fetch "
                         "hotpotqa_dev_distractor`'s)")
    ap.add_argument("--queries", type=int, default=1000, help="requests per (mode, concurrency)")
    ap.add_argument("--topk", type=int, default=5)
    ap.add_argument("--concurrency", default="1,16,64")
    ap.add_argument("--compare", action="store_true", help="also time rank_bm25 against bm25s")
    args = ap.parse_args()
    if args.source is None:
        from memrl.data.fetch import fetched_path
        from memrl.errors import UserError

        try:
            args.source = str(fetched_path("hotpotqa_dev_distractor"))
        except UserError as e:
            raise SystemExit(f"--source: {e} (or pass --source FILE)") from None
    levels = [int(x) for x in args.concurrency.split(",")]

    from memrl.data.corpus import build_corpus, write_corpus
    from memrl.data.io import load_tasks
    from memrl.services.client import HTTPRetriever
    from memrl.services.retrieval import BM25Retriever

    tasks = load_tasks(args.source)
    docs = build_corpus(tasks)
    # real questions first, then paragraph first sentences: distinct queries of realistic length
    queries = list(dict.fromkeys([t.question for t in tasks] + [d.text.split(". ")[0] for d in docs]))
    queries = queries[: args.queries]
    t0 = time.perf_counter()
    local = BM25Retriever(docs)
    print(f"corpus: {len(docs)} paragraphs from {len(tasks)} questions; indexed in {time.perf_counter() - t0:.2f}s; "
          f"{len(queries)} queries per run, top-{args.topk}; {os.cpu_count()} CPUs")
    if args.compare:
        compare_libraries(docs, queries)

    rows = []
    for c in levels:
        rows.append(("in-process", c, *asyncio.run(drive(local, queries, args.topk, c))))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = str(Path(tmp) / "corpus.jsonl")
        write_corpus(corpus, docs)
        proc, url = start_server(corpus)
        try:
            for c in levels:
                async def over_http(c: int = c):
                    client = HTTPRetriever(url, timeout=60, retries=0, max_connections=max(c, 1))
                    try:
                        await client.retrieve(queries[:4], args.topk)  # warm the connection
                        return await drive(client, queries, args.topk, c)
                    finally:
                        await client.close()

                rows.append(("http", c, *asyncio.run(over_http())))
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print("| mode | clients | queries/s | p50 ms | p99 ms |")
    print("|---|---:|---:|---:|---:|")
    for mode, c, qps, p50, p99 in rows:
        print(f"| {mode} | {c} | {qps:,.0f} | {p50:.2f} | {p99:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
