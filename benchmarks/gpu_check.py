"""The one prepared check for a machine with one CUDA device (an H100 or H200 with torch, transformers and
peft; no vLLM, no Ray): run by scripts/gpu_check.sh, inside 10 minutes. Sections, each in its own
process with its own time limit, so one that fails or runs over still leaves the others' figures:

  tests       the gpu-marked tests (pytest -m gpu; those needing Ray or vLLM skip)
  steps       benchmarks/gpu_steps.py: one MemAgent GRPO and one MemAct DCPO step, 0.5B Qwen2 / 0.6B Qwen3, bf16
  long_rows   benchmarks/long_rows.py: one update's peak memory on 32K and 64K-token rows, full vs chunked logits
  gpu_single  benchmarks/gpu_single.py: update, generation and weight sync by model size

Each section has its own time limit, and the whole check a budget (--budget-s, 540 s: a section gets its
limit or what is left of the budget, whichever is less), so it ends inside 10 minutes on one card.

Prints one summary table (section, status, seconds, headline) and then each section's own table, and
writes them to OUT/report.md (each section's whole output to OUT/<section>.log, figures to
OUT/<section>.json). `--dry-run` runs every section on the CPU at toy sizes (the suite does, so the
check cannot rot): the gpu tests are only collected, the benchmarks take their own --dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Section:
    name: str
    argv: list[str]
    limit_s: int
    dry_argv: list[str]


def gpu_test_files() -> list[str]:
    """The test modules that mark tests gpu (collecting only these: the others may import packages that a
    GPU machine lacks, such as fastapi or playwright)."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(encoding="utf-8"))


def sections(py: str, out: Path) -> list[Section]:
    bench = ROOT / "benchmarks"
    pytest = [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider", *gpu_test_files()]
    return [
        Section("tests", pytest, 150, [*pytest, "--collect-only"]),
        Section("steps", [py, str(bench / "gpu_steps.py"), "--json", str(out / "steps.json")], 220,
                [py, str(bench / "gpu_steps.py"), "--dry-run", "--json", str(out / "steps.json")]),
        Section("long_rows", [py, str(bench / "long_rows.py"), "--device", "cuda", "--lengths", "32768,65536",
                              "--shape", "qwen2.5-0.5b", "--dtype", "bfloat16", "--gradient-checkpointing",
                              "--chunk", "1024", "--max-gb", "130", "--json", str(out / "long_rows.json")], 120,
                [py, str(bench / "long_rows.py"), "--dry-run", "--json", str(out / "long_rows.json")]),
        Section("gpu_single", [py, str(bench / "gpu_single.py"), "--json", str(out / "gpu_single.json")], 150,
                [py, str(bench / "gpu_single.py"), "--dry-run", "--json", str(out / "gpu_single.json")]),
    ]


def headline(name: str, log: str) -> str:
    """One line from a section's output: the tests' pytest summary, else the number of table rows."""
    if name == "tests":
        found = [ln.strip("= ") for ln in log.splitlines()
                 if re.search(r"\d+ (passed|failed|skipped|errors?|deselected)|\d+(/\d+)? tests? collected", ln)]
        return found[-1] if found else "no pytest summary"
    if name == "long_rows":
        rows = [ln for ln in log.splitlines() if re.match(r"\s*\d+\s+\d", ln)]
        return f"{len(rows)} row lengths"
    rows = [ln for ln in log.splitlines() if ln.startswith("| ") and not ln.startswith("|---")]
    return f"{max(len(rows) - 1, 0)} table rows"


def run_section(sec: Section, dry: bool, out: Path, env: dict[str, str], limit_s: float) -> dict[str, object]:
    argv = sec.dry_argv if dry else sec.argv
    t0 = time.perf_counter()
    logfile = out / f"{sec.name}.log"
    with open(logfile, "w") as f:  # to a file, not a pipe: a killed section's children cannot hold it open
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit_s)
            status = "ok" if rc == 0 else f"failed (rc {rc})"
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the section and everything it started
            proc.wait()
            status = f"over its {limit_s:.0f} s limit"
    log = logfile.read_text(errors="replace")
    secs = time.perf_counter() - t0
    keep = {"tests": r"(FAILED|ERROR|SKIPPED)", "long_rows": r"(one update|\s*tokens\s|\s*\d+\s|est\.:|OOM>:)"}
    tables = "\n".join(ln for ln in log.splitlines() if re.match(keep.get(sec.name, r"(\||device:)"), ln))
    tail = "\n".join(log.strip().splitlines()[-3:]) if status != "ok" else ""
    return {"section": sec.name, "status": status, "seconds": round(secs, 1), "headline": headline(sec.name, log),
            "tables": tables, "tail": tail}


def device_line(py: str) -> str:
    code = ("import torch, transformers; d = torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu'; "
            "print(f'{d}, torch {torch.__version__}, transformers {transformers.__version__}')")
    proc = subprocess.run([py, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    return proc.stdout.strip() or proc.stderr.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/gpu_check", help="folder for report.md, the logs and the figures")
    ap.add_argument("--dry-run", action="store_true", help="every section on the CPU at toy sizes")
    ap.add_argument("--only", default="", help="comma-separated section names (default: all)")
    ap.add_argument("--budget-s", type=float, default=540.0,
                    help="the whole check's seconds: a section gets its own limit or what is left, whichever is less")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
           "PYTHONUNBUFFERED": "1"}
    chosen = sections(py, out)
    if args.only:
        names = args.only.split(",")
        unknown = sorted(set(names) - {s.name for s in chosen})
        if unknown:
            raise SystemExit(f"gpu_check: unknown --only {unknown}; sections: {', '.join(s.name for s in chosen)}")
        chosen = [s for s in chosen if s.name in names]
    started = time.perf_counter()
    lines = [f"# GPU check{' (dry run, CPU)' if args.dry_run else ''}", "", f"device: {device_line(py)}", "",
             "| section | status | s | result |", "|---|---|---|---|"]
    results = []
    for sec in chosen:
        left = args.budget_s - (time.perf_counter() - started)
        if left < 10:
            results.append({"section": sec.name, "status": "not run (budget spent)", "seconds": 0.0,
                            "headline": "", "tables": "", "tail": ""})
            lines.append(f"| {sec.name} | not run (budget spent) | 0 | |")
            continue
        r = run_section(sec, args.dry_run, out, env, min(sec.limit_s, left))
        results.append(r)
        print(f"gpu_check: {sec.name}: {r['status']} in {r['seconds']} s ({r['headline']})", flush=True)
        lines.append(f"| {sec.name} | {r['status']} | {r['seconds']} | {r['headline']} |")
    lines += ["", f"total {time.perf_counter() - started:.0f} s", ""]
    for r in results:
        lines += [f"## {r['section']}", "", r["tables"] or "(no table)", ""]
        if r["tail"]:
            lines += ["last lines:", "```", r["tail"], "```", ""]
    report = "\n".join(lines)
    (out / "report.md").write_text(report)
    (out / "summary.json").write_text(json.dumps([{k: v for k, v in r.items() if k != "tables"} for r in results],
                                                 indent=1))
    print(report)
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
