"""How long the `memrl` command takes to start: `memrl --version`, `memrl --help`, `memrl data show` on a one-row
file and `memrl data build` of two tiny eval sets from a 12-question HotpotQA-layout file, each a fresh
`python -m memrl.cli` process, --repeat times; the table shows the median and the fastest wall time, the
median CPU time (user + system of the child), and whether the process imported torch or transformers (read
from `python -X importtime`, run once more per command). The goal (issue 79): --version and --help under
0.5 s, data show / data build under 2 s on a quiet machine.

    python benchmarks/cli_startup.py              # 5 runs each
    python benchmarks/cli_startup.py --repeat 11

The first lines name the CPU and the load average, since a shared machine's numbers move with its load.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def _hotpot(n: int) -> list[dict]:
    return [{"_id": f"h{i}", "question": f"Which river runs through Place {i}?", "answer": f"River {i}",
             "type": "bridge", "level": "easy", "supporting_facts": [[f"Place {i}", 0]],
             "context": [[f"Place {i}", [f"Place {i} lies on River {i}."]], [f"Other {i}", [f"Filler {i}."]]]}
            for i in range(n)]


def cases(tmp: Path) -> dict[str, list[str]]:
    one = tmp / "one.jsonl"
    one.write_text(json.dumps({"task_id": "q1", "question": "Where?", "context": "In Liverpool.",
                               "answers": ["Liverpool"]}) + "\n")
    hotpot = tmp / "hotpot.json"
    hotpot.write_text(json.dumps(_hotpot(12)))
    return {"--version": ["--version"], "--help": ["--help"], "data show": ["data", "show", str(one)],
            "data build": ["data", "build", "--source", str(hotpot), "--out", str(tmp / "built"), "--docs", "2,4",
                           "--num-questions", "4"]}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "memrl.cli", *argv], env=env, capture_output=True, text=True,
                          check=False)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"memrl {' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def heavy_imports(argv: list[str], env: dict[str, str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "memrl.cli", *argv], env=env,
                          capture_output=True, text=True, check=False)
    seen = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    return [m for m in HEAVY if m in seen]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per command")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"CPU: {cpu_name()}, {os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}; "
          f"python {sys.version.split()[0]}")
    print("| command | median wall s | fastest wall s | median CPU s | imports torch / transformers |")
    print("|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, argv in cases(Path(d)).items():
            runs = [run_once(argv, env) for _ in range(args.repeat)]
            walls = [w for w, _ in runs]
            heavy = heavy_imports(argv, env)
            print(f"| memrl {name} | {statistics.median(walls):.2f} | {min(walls):.2f} | "
                  f"{statistics.median(c for _, c in runs):.2f} | {', '.join(heavy) or 'neither'} |", flush=True)
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
