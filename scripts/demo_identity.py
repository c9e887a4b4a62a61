"""Run every demo at the toy sizes its integration test uses and digest results.json without timings, so a
refactor of the recipe code can show that every demo still gives the same results.

  python scripts/demo_identity.py run /tmp/before            # every demo, one subprocess each
  python scripts/demo_identity.py run /tmp/after memagent    # only some
  python scripts/demo_identity.py compare /tmp/before /tmp/after   # the same layout: digests
  python scripts/demo_identity.py migrated /tmp/before /tmp/after  # before: the old layout, after: the one layout
  python scripts/demo_identity.py aggregate /tmp/before /tmp/agg [AGENT ...]  # the seed sweep's table, two fake seeds
  python scripts/demo_identity.py trained /tmp/before /tmp/trained  # the trained-table benchmarks likewise

Each run writes DIR/<name>/ (the demo's --out) and DIR/<name>.digest: the SHA-256 of results.json with every
"timings" and "seconds" entry (and RL's "time/" and "perf/" metrics) dropped and the run's directory written as
"<OUT>".

`migrated` compares runs across the change to the one results layout: each before-run's results.json converted
by scripts/migrate_results.py must be contained in the after-run's (every key it has equal, every number to the
bit, lists of the same length; "timings" and "seconds" dropped; the after-run may hold more: the whole config,
RL's every per-step metric), and results.md must be byte-identical but for the numbers of its "Time:" line.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

_SMALL = ["threads=1", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2", "model.num_kv_heads=1",
          "train.trainer.steps=2", "train.trainer.batch_size=2", "train.algorithm.n=2", "train.trainer.progress=false"]
_CONTEXT = ["sft.num_tasks=12", "sft.epochs=1", "sft.batch_rows=8", "sft.copy_warmup_steps=3", "eval.num_tasks=4",
            "rl_tasks=8", *_SMALL]
_MEM1 = ["sft.num_tasks=6", "sft.epochs=1", "sft.batch_rows=8", "sft.copy_warmup_steps=3", "eval.num_tasks=2",
         "rl_tasks=4", *_SMALL]
_INFMEM = ["sft.num_tasks=6", "sft.epochs=1", "sft.batch_rows=8", "eval.num_tasks=4", "eval.multipliers=[1,2]",
           "eval.far_multipliers=[2]", *_SMALL]
_LOOKBACK = ["rl_tasks=4", "sft.num_tasks=4", "sft.epochs=1", "sft.oversample_recall=3", "eval.num_tasks=2",
             "eval.lengths=[2,4]", "eval.sampled=false", "train.trainer.steps=1", "train.trainer.batch_size=1",
             "train.algorithm.n=2"]
DEMOS: dict[str, tuple[str, list[str]]] = {
    # tests/integration/test_demo_cli.py
    "memagent": ("memagent", ["sft.num_tasks=40", "sft.epochs=1", "sft.p_aware=0.5", "eval.num_tasks=8",
                              "eval.samples=3", "eval.multipliers=[1,2]", "train.data.synthetic.min_chunks=1",
                              "train.data.synthetic.num_chunks=2", "train.trainer.steps=2",
                              "train.trainer.batch_size=2", "train.algorithm.n=2", "train.trainer.progress=false",
                              "train.trainer.tensorboard=false"]),
    # tests/integration/test_memact_demo_cli.py
    "memact": ("memact", ["sft.num_tasks=40", "sft.epochs=1", "sft.copy_warmup_steps=3", "eval.num_tasks=8",
                          "rl_tasks=30", "threads=1", "train.trainer.steps=2", "train.trainer.batch_size=2",
                          "train.algorithm.n=2", "train.algorithm.segments_per_task=3",
                          "train.trainer.progress=false"]),
    # tests/integration/test_context_demo_cli.py
    "context_fold": ("context", ["method=fold", *_CONTEXT]),
    "context_summarize": ("context", ["method=summarize", *_CONTEXT]),
    "context_react": ("context", ["method=react", *_CONTEXT]),
    # tests/integration/test_mem1_demo_cli.py
    "mem1_mem1": ("mem1", ["method=mem1", *_MEM1]),
    "mem1_full_history": ("mem1", ["method=full_history", *_MEM1]),
    # tests/integration/test_infmem_demo_cli.py
    "infmem_infmem": ("infmem", ["method=infmem", *_INFMEM]),
    "infmem_memagent": ("infmem", ["method=memagent", *_INFMEM]),
    # tests/integration/test_lookback_demo_cli.py
    "lookback_memagent": ("lookback", ["method=memagent", *_LOOKBACK]),
    "lookback_rememr1": ("lookback", ["method=rememr1", *_LOOKBACK]),
}


def stripped(value: Any, out: str) -> Any:
    """`value` without "timings" / "seconds" entries and RL's wall-clock metrics ("time/...", "perf/...": the
    one layout's history has every per-step metric), `out` written as "<OUT>" in every string."""
    if isinstance(value, dict):
        return {k: stripped(v, out) for k, v in value.items()
                if k not in ("timings", "seconds") and not k.startswith(("time/", "perf/"))}
    if isinstance(value, list):
        return [stripped(v, out) for v in value]
    if isinstance(value, str):
        return value.replace(out, "<OUT>")
    return value


def digest(run_dir: Path) -> str:
    res = json.loads((run_dir / "results.json").read_text(encoding="utf-8"))
    text = json.dumps(stripped(res, str(run_dir)), sort_keys=True, indent=1)
    (run_dir.parent / f"{run_dir.name}.stripped.json").write_text(text + "\n", encoding="utf-8")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def run(base: Path, names: list[str]) -> None:
    base.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    for name in names or list(DEMOS):
        agent, overrides = DEMOS[name]
        out = base / name
        cmd = [sys.executable, "-m", "memrl.cli", "demo", "--agent", agent, "--out", str(out), *overrides]
        with open(base / f"{name}.log", "w", encoding="utf-8") as log:
            rc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
        if rc != 0:
            print(f"{name}: failed (rc {rc}), see {base / f'{name}.log'}", flush=True)
            continue
        d = digest(out)
        (base / f"{name}.digest").write_text(d + "\n", encoding="utf-8")
        print(f"{name}: {d}", flush=True)


SWEEPS = {"memagent": "memagent", "memact": "memact", "context": "context_fold", "mem1": "mem1_mem1",
          "infmem": "infmem_infmem", "lookback": "lookback_rememr1"}
"""agent -> the run whose results make both seeds of its fake sweep."""


def halved(value: Any) -> Any:
    """Every float in `value` halved plus one (ints, keys and strings kept): a second seed's results."""
    if isinstance(value, dict):
        return {k: halved(v) for k, v in value.items()}
    if isinstance(value, list):
        return [halved(v) for v in value]
    return value * 0.5 + 1 if isinstance(value, float) else value


def aggregate(base: Path, dest: Path, agents: list[str] | None = None) -> None:
    """memrl.recipes.seeds' aggregate and markdown over a fake two-seed sweep per agent (seed 0: the run's
    results.json, seed 1: its floats halved plus one; both with the run's held-out tasks); writes
    dest/<agent>.md and dest/<agent>.json and prints their digests."""
    from memrl.recipes import seeds  # noqa: PLC0415 - the tree on PYTHONPATH (the run's), imported when asked

    for agent, name in SWEEPS.items():
        if agents and agent not in agents:
            continue
        root = dest / agent
        shutil.rmtree(root, ignore_errors=True)
        res = json.loads((base / name / "results.json").read_text(encoding="utf-8"))
        runs = []
        other = {k: v if k in ("config", "train", "heldout_sha256") else halved(v) for k, v in res.items()}  # same eval
        for seed, value in ((0, res), (1, other)):
            out = root / "native" / f"seed{seed}"
            (out / "data").mkdir(parents=True)
            (out / "results.json").write_text(json.dumps(value), encoding="utf-8")
            for held in [base / name / "data" / "heldout_tasks.jsonl", *(base / name / "data").glob("eval_*.json")]:
                if held.is_file():  # the held-out files the method's fingerprint reads (lookback: eval_<N>.json)
                    shutil.copy(held, out / "data" / held.name)
            runs.append(seeds.Run(seed, "native", out, ()))
        agg = seeds.aggregate(agent, runs)
        text = seeds.markdown(agg).replace(str(root), "<ROOT>")
        (dest / f"{agent}.md").write_text(text, encoding="utf-8")
        data = json.dumps(agg, indent=1).replace(str(root), "<ROOT>")
        (dest / f"{agent}.json").write_text(data + "\n", encoding="utf-8")
        print(f"{agent}: table {hashlib.sha256(text.encode()).hexdigest()} json "
              f"{hashlib.sha256(data.encode()).hexdigest()}", flush=True)


TRAINED = {"context_management": {"fold": "context_fold", "summarize": "context_summarize", "react": "context_react"},
           "mem1_trained": {"mem1": "mem1_mem1", "full_history": "mem1_full_history"},
           "infmem_trained": {"infmem": "infmem_infmem", "memagent": "infmem_memagent"}}
"""benchmark -> {method: the run whose results make both seeds of the method's fake sweep}."""


def trained(base: Path, dest: Path) -> None:
    """The trained-table benchmarks over fake two-seed sweeps (seed 0: a run's results.json, seed 1: its
    results with every float halved plus one, the held-out digest kept); writes dest/<benchmark>.md."""
    for bench, methods in TRAINED.items():
        root = dest / bench
        shutil.rmtree(root, ignore_errors=True)
        for method, name in methods.items():
            res = json.loads((base / name / "results.json").read_text(encoding="utf-8"))
            keep = ("heldout_sha256", "objectives", "train_objectives", "lengths", "eval_tasks", "train_chunks",
                    "method", "eval", "config", "train")  # the old layout's and the one layout's (its facts: ints)
            other = {k: v if k in keep else halved(v) for k, v in res.items()}
            if "budget" in res:  # the old layout
                other["budget"] = {**res["budget"], **{k: v for k, v in other["budget"].items()
                                                       if k == "max_context_tokens"}}
            for seed, value in ((0, res), (1, other)):
                out = root / method / f"seed{seed}"
                out.mkdir(parents=True)
                (out / "results.json").write_text(json.dumps(value), encoding="utf-8")
        path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{bench}.py"
        spec = importlib.util.spec_from_file_location(bench, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[bench] = mod
        spec.loader.exec_module(mod)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            mod.main(["--trained", str(root)])
        text = buf.getvalue().replace(str(root), "<ROOT>")
        (dest / f"{bench}.md").write_text(text, encoding="utf-8")
        print(f"{bench}: table {hashlib.sha256(text.encode()).hexdigest()}", flush=True)


def compare(a: Path, b: Path) -> int:
    bad = 0
    for name in DEMOS:
        da, db = a / f"{name}.digest", b / f"{name}.digest"
        if not da.is_file() or not db.is_file():
            print(f"{name}: missing")
            continue
        x, y = da.read_text().strip(), db.read_text().strip()
        print(f"{name}: {'identical' if x == y else 'DIFFERENT'} {x[:16]} {y[:16]}")
        bad += x != y
    return 1 if bad else 0


def contained(x: Any, y: Any, path: str = "") -> list[str]:
    """Where `x` is not contained in `y` (dicts: every key of x in y, contained; lists: the same length, each
    contained; else equal), as paths."""
    if isinstance(x, dict):
        if not isinstance(y, dict):
            return [path or "/"]
        return [p for k, v in x.items() for p in (contained(v, y[k], f"{path}/{k}") if k in y else [f"{path}/{k} (missing)"])]
    if isinstance(x, list):
        if not isinstance(y, list) or len(x) != len(y):
            return [f"{path} (length)"]
        return [p for i, (a, b) in enumerate(zip(x, y, strict=True)) for p in contained(a, b, f"{path}/{i}")]
    return [] if x == y and type(x) in (type(y), int, float) else [f"{path}: {x!r} != {y!r}"]


def untimed(md: str) -> str:
    """results.md with the numbers of its "Time:" lines written as "<T>"."""
    return "\n".join(re.sub(r"\d+(\.\d+)?(?=s\b| min)", "<T>", line) if "Time:" in line else line
                     for line in md.split("\n"))


def migrated(a: Path, b: Path) -> int:
    """Old-layout runs `a` against one-layout runs `b` (module docstring); 1 when any differs."""
    spec = importlib.util.spec_from_file_location("migrate_results", Path(__file__).with_name("migrate_results.py"))
    mig = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mig)
    bad = 0
    for name, (agent, _) in DEMOS.items():
        if not (a / name / "results.json").is_file() or not (b / name / "results.json").is_file():
            print(f"{name}: missing")
            continue
        old = json.loads((a / name / "results.json").read_text(encoding="utf-8"))
        new = json.loads((b / name / "results.json").read_text(encoding="utf-8"))
        diff = contained(stripped(mig.migrate(old, agent), str(a / name)), stripped(new, str(b / name)))
        same_md = untimed((a / name / "results.md").read_text()) == untimed((b / name / "results.md").read_text())
        print(f"{name}: results.json {'contained' if not diff else 'DIFFERENT ' + '; '.join(diff[:3])}, "
              f"results.md {'identical' if same_md else 'DIFFERENT'}")
        bad += bool(diff) or not same_md
    return 1 if bad else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["run"]:
        run(Path(sys.argv[2]), sys.argv[3:])
    elif sys.argv[1:2] == ["aggregate"]:
        aggregate(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:])
    elif sys.argv[1:2] == ["trained"]:
        trained(Path(sys.argv[2]), Path(sys.argv[3]))
    elif sys.argv[1:2] == ["migrated"]:
        sys.exit(migrated(Path(sys.argv[2]), Path(sys.argv[3])))
    elif sys.argv[1:2] == ["compare"]:
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
