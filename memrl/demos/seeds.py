"""A demo over several training seeds and CPU capability settings, and the table of their mean +- sd.

  memrl demo --out runs/seeds --seeds 0,1,2 --cpu-capability avx2,avx512 threads=1
  memrl demo --agent memact --out runs/seeds_memact --seeds 0,1,2 --cpu-capability avx2,avx512
  memrl demo --agent context --out runs/context/fold --seeds 0,1,2 method=fold
  memrl demo --agent mem1 --out runs/mem1/mem1 --seeds 0,1,2 method=mem1
  memrl demo --agent infmem --out runs/infmem/infmem --seeds 0,1,2 method=infmem
  memrl demo --out runs/seeds --seeds 0,1,2 --cpu-capability avx2,avx512 --aggregate-only

Each (seed, capability) run is `memrl demo --agent A --out ROOT/<capability>/seed<k> <overrides> <seed
overrides>` in its own subprocess with ATEN_CPU_CAPABILITY=<capability> in its environment (torch reads it
when it is imported, and picks the matching kernels: their float rounding differs, docs/results/demo.md). Before a
capability's first run, a probe subprocess with the same environment checks that torch reports it
(`torch.backends.cpu.get_cpu_capability()`): a CPU without AVX-512 would silently run AVX2 kernels.
`native` runs without the variable (torch's own choice; the table names what torch reported).

Training seed k shifts every seed the recipe TRAINS with by k from its value (seed 0 is the one-seed demo
exactly); the held-out evaluation (eval.seed, eval.num_tasks, the lengths) is never shifted:
- memagent: `seed` (model init, tokenizer, SFT order, the demonstrator's coins), `sft_seed` (the SFT
  tasks), `train.data.seed` (the RL task stream), `train.trainer.seed` (RL sampling);
- memact: `seed` (model init, tokenizer, copy warm-up, SFT order), `sft.seed` (the SFT tasks and the
  scripted agent's coins), `rl_task_seed` (the DCPO tasks), `train.data.seed` (their order),
  `train.trainer.seed` (DCPO sampling);
- context: as memact (`seed`, `sft.seed`, `rl_task_seed`, `train.data.seed`, `train.trainer.seed`; RL is
  GRPO or FoldGRPO by the method). `sft_from=ROOT` / `warmup_from=ROOT` name another context sweep: each
  run reuses the cold start / copy warm-up of ROOT's run of the same capability and seed.
- mem1: as memact (memrl.demos.mem1; its held-out seeds are eval.seed + k per objective count k).
- infmem: `seed` (model init, tokenizer, copy warm-up, SFT order), `sft.seed` (the SFT tasks),
  `train.data.seed` (the RL task stream), `train.trainer.seed` (GRPO sampling).
The aggregation checks that every run evaluated the same held-out tasks (memagent: the results' `recipe.eval`
and lengths; memact, context, mem1 and infmem: the SHA-256 of data/heldout_tasks.jsonl) and refuses to mix them.

Resumable: a run whose out dir has results.json is not run again (its sweep_run.json must name the same
agent, seed, capability and overrides); a run started before and not finished is started again from an
empty directory. Writes ROOT/seeds_results.md (printed) and ROOT/seeds_results.json: per capability and
per length (memagent), per policy and decoding (memact, context), per policy, decoding and objective
count (mem1) or per decoding and length (infmem), mean +- sd over the finished seeds (sd with
ddof 1; "n/a" for one seed) of SFT and SFT+RL accuracy, sampled and greedy, and the gains (SFT+RL - SFT,
paired per seed).
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memrl.config import MAX_SEED, ConfigError, load_config, redact_argv, redact_secrets, redact_text
from memrl.demos import split_overrides
from memrl.demos.context import ContextDemoConfig
from memrl.demos.infmem import InfMemDemoConfig
from memrl.demos.mem1 import Mem1DemoConfig
from memrl.demos.memact import MemActDemoConfig
from memrl.demos.memagent import DemoConfig
from memrl.errors import UserError
from memrl.locks import acquire, release
from memrl.training.config import TrainConfig

CAPABILITIES = ("native", "default", "avx2", "avx512")
"""ATEN_CPU_CAPABILITY values on x86 (what torch.backends.cpu.get_cpu_capability() reports, lower-cased), and
"native": the variable removed from the run's environment, so torch picks the CPU's best kernels."""

MARKER = "sweep_run.json"
"""Written into a run's directory when the sweep starts it: what the run is, so a resume can check it."""

SEED_KEYS = {
    # agent -> the overrides a training seed shifts: (override key, where its base value is read)
    "memagent": (("seed", "demo"), ("sft_seed", "demo"), ("train.data.seed", "train"),
                 ("train.trainer.seed", "train")),
    "memact": (("seed", "demo"), ("sft.seed", "demo"), ("rl_task_seed", "demo"), ("train.data.seed", "train"),
               ("train.trainer.seed", "train")),
    "context": (("seed", "demo"), ("sft.seed", "demo"), ("rl_task_seed", "demo"), ("train.data.seed", "train"),
                ("train.trainer.seed", "train")),
    "mem1": (("seed", "demo"), ("sft.seed", "demo"), ("rl_task_seed", "demo"), ("train.data.seed", "train"),
             ("train.trainer.seed", "train")),
    "infmem": (("seed", "demo"), ("sft.seed", "demo"), ("train.data.seed", "train"), ("train.trainer.seed", "train")),
}
TASK_SEEDS = {"memagent": ("sft_seed", "train.data.seed"), "memact": ("sft.seed", "rl_task_seed"),
              "context": ("sft.seed", "rl_task_seed"), "mem1": ("sft.seed", "rl_task_seed"),
              "infmem": ("sft.seed", "train.data.seed")}
"""The seeds that generate training tasks: never equal to the held-out eval.seed, for any run."""


# ---------------------------------------------------------------------------------------------- the plan


def parse_seeds(text: str) -> list[int]:
    """"0,1,2" -> [0, 1, 2]; distinct non-negative integers."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip() != ""]
    except ValueError:
        raise ConfigError(f"--seeds: expected comma-separated integers like 0,1,2, got {text!r}") from None
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds: expected distinct non-negative integers like 0,1,2, got {text!r}")
    if max(seeds) > MAX_SEED:
        raise ConfigError(f"--seeds: seed {max(seeds)} is not allowed: must be in [0, {MAX_SEED}]")
    return seeds


def parse_capabilities(text: str) -> list[str]:
    """"avx2,avx512" -> ["avx2", "avx512"]; each one of CAPABILITIES."""
    caps = [c.strip().lower() for c in text.split(",") if c.strip()]
    bad = [c for c in caps if c not in CAPABILITIES]
    if not caps or bad or len(set(caps)) != len(caps):
        raise ConfigError(f"--cpu-capability: expected distinct values from {', '.join(CAPABILITIES)} "
                          f"(comma-separated), got {text!r}")
    return caps


def _get(obj: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def base_seeds(agent: str, overrides: list[str]) -> dict[str, int]:
    """{override key: its value under `overrides` (the recipe's default unless overridden)} for the seeds a
    training seed shifts, and "eval.seed"."""
    schema: type[Any] = {"memact": MemActDemoConfig, "context": ContextDemoConfig,
                          "mem1": Mem1DemoConfig, "infmem": InfMemDemoConfig}.get(agent, DemoConfig)
    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(schema, demo_ov)
    tcfg = load_config(TrainConfig, train_ov, preset=cfg.train_preset)
    out = {key: int(_get(cfg if where == "demo" else tcfg, key.removeprefix("train.")))
           for key, where in SEED_KEYS[agent]}
    out["eval.seed"] = int(cfg.eval.seed)
    return out


def seed_overrides(agent: str, seed: int, base: dict[str, int]) -> list[str]:
    """The overrides of training seed `seed`: every training seed shifted by `seed` (0 = the recipe's own)."""
    return [f"{key}={base[key] + seed}" for key, _ in SEED_KEYS[agent]]


@dataclass(frozen=True)
class Run:
    seed: int
    capability: str
    out: Path
    overrides: tuple[str, ...]
    """The whole override list the run's `memrl demo` gets (the user's, then the seed's)."""


def plan(agent: str, root: Path, seeds: list[int], capabilities: list[str], overrides: list[str]) -> list[Run]:
    """The runs, seed-major (both capabilities of seed 0 first), each with its out dir and overrides; fails
    when an override sets a seed the sweep shifts, or when a training task seed would equal eval.seed."""
    keys = {key for key, _ in SEED_KEYS[agent]}
    fixed = [ov for ov in overrides if ov.split("=", 1)[0] in keys]
    if fixed:
        raise ConfigError(f"--seeds: {fixed[0].split('=', 1)[0]} is set by the training seed; drop the override "
                          f"{fixed[0]!r}")
    if agent == "memagent":  # the table aggregates both decodings at every length (aggregate)
        ev = load_config(DemoConfig, split_overrides(list(overrides))[0]).eval
        if ev.samples == 0 or not ev.greedy:
            what = "eval.samples=0 leaves no sampled" if ev.samples == 0 else "eval.greedy=false leaves no greedy"
            raise ConfigError(f"--seeds: {what} accuracy, and the sweep's table aggregates sampled and greedy "
                              "accuracy of every run; drop the override")
    base = base_seeds(agent, overrides)
    over = [(key, base[key] + max(seeds)) for key, _ in SEED_KEYS[agent] if base[key] + max(seeds) > MAX_SEED]
    if over:
        raise ConfigError(f"--seeds: training seed {max(seeds)} makes {over[0][0]}={over[0][1]}, past the largest "
                          f"seed {MAX_SEED}")
    held = {base["eval.seed"]}
    if agent == "mem1":  # one held-out set per objective count k, from seed eval.seed + k
        held = {base["eval.seed"] + k for k in load_config(Mem1DemoConfig, split_overrides(overrides)[0]).eval.objectives}
    for key in TASK_SEEDS[agent]:
        hit = [s for s in seeds if base[key] + s in held]
        if hit:
            what = (f"equal eval.seed ({base['eval.seed']})" if len(held) == 1 else
                    f"a held-out task seed ({', '.join(map(str, sorted(held)))})")
            raise ConfigError(f"--seeds: training seed {hit[0]} makes {key} {what}: the training tasks would be "
                              "the held-out ones")
    return [Run(s, cap, root / cap / f"seed{s}", (*_per_run(overrides, cap, s), *seed_overrides(agent, s, base)))
            for s in seeds for cap in capabilities]


def _per_run(overrides: list[str], capability: str, seed: int) -> list[str]:
    """`overrides` with `sft_from=ROOT` / `warmup_from=ROOT` (context: another sweep's root) naming that
    sweep's run of the same capability and seed, ROOT/<capability>/seed<k>."""
    out = []
    for ov in overrides:
        key, _, value = ov.partition("=")
        out.append(f"{key}={Path(value) / capability / f'seed{seed}'}" if key in _RUN_KEYS and value else ov)
    return out


_RUN_KEYS = ("sft_from", "warmup_from")


# ---------------------------------------------------------------------------------------------- running


def child_env(capability: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run: this one (or `base`) with ATEN_CPU_CAPABILITY=capability ("native": without
    the variable)."""
    env = dict(os.environ if base is None else base)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if capability != "native":
        env["ATEN_CPU_CAPABILITY"] = capability
    return env


def probe_capability(capability: str) -> str:
    """What torch reports (lower-cased) in a subprocess started with ATEN_CPU_CAPABILITY=capability."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    proc = subprocess.run([sys.executable, "-c", code], env=child_env(capability), capture_output=True,
                          text=True, timeout=300, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ConfigError(f"--cpu-capability {capability}: the torch probe failed: {tail}")
    return proc.stdout.strip().lower()


def run_command(agent: str, run: Run) -> list[str]:
    """The subprocess's command line: `memrl demo` through this interpreter."""
    return [sys.executable, "-m", "memrl.cli", "demo", "--agent", agent, "--out", str(run.out), *run.overrides]


def marker_of(agent: str, run: Run) -> dict[str, Any]:
    """What sweep_run.json records of a run (secrets in the overrides redacted: the file is kept and shared)."""
    return {"agent": agent, "seed": run.seed, "capability": run.capability, "overrides": redact_argv(run.overrides)}


def run_state(agent: str, run: Run) -> str:
    """"done" (results.json there, made by this very run), "partial" (started by a sweep, not finished),
    "new" (no directory, or an empty one); fails on a directory the sweep did not make or made for
    another run."""
    if not run.out.exists() or (run.out.is_dir() and not any(run.out.iterdir())):
        return "new"
    marker = run.out / MARKER
    if not marker.is_file():
        raise UserError(f"{run.out}: not empty and has no {MARKER}; not a run of this sweep (use another --out)")
    try:
        recorded = json.loads(marker.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"{marker}: unreadable ({e})") from None
    want = marker_of(agent, run)
    got = {k: recorded.get(k) for k in want}
    if got != want:
        diff = next(k for k in want if got[k] != want[k])
        raise UserError(f"{marker}: {diff} is {got[diff]!r}, this sweep's run has {want[diff]!r} "
                          "(use another --out)")
    return "done" if (run.out / "results.json").is_file() else "partial"


def end_with_parent(parent: int) -> Callable[[], None]:
    """A Popen `preexec_fn` (Linux): the child gets SIGTERM when the sweep dies, kill -9 included, so no run
    outlives it and writes on beside a re-run's."""

    def arm() -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the sweep died before the signal was armed
            os._exit(1)

    return arm


PR_SET_PDEATHSIG = 1


def start_run(agent: str, run: Run, reported: str) -> subprocess.Popen[bytes]:
    """Clear the run's directory, write its marker and start its subprocess (output in run.out/log.txt).
    A directory another process still holds (memrl.locks) is refused, not cleared."""
    if run.out.exists():
        release(acquire(run.out, "--out"))
        shutil.rmtree(run.out)
    run.out.mkdir(parents=True)
    cmd = run_command(agent, run)
    marker = {**marker_of(agent, run), "reported_capability": reported, "command": redact_argv(cmd),
              "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (run.out / MARKER).write_text(json.dumps(marker, indent=1) + "\n", encoding="utf-8")
    with open(run.out / "log.txt", "wb") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen(cmd, env=child_env(run.capability), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                preexec_fn=end_with_parent(os.getpid()) if sys.platform == "linux" else None)


def run_all(agent: str, runs: list[Run], jobs: int = 1, log: Any = print) -> dict[Path, str]:
    """Run every unfinished run, `jobs` at a time; {out dir: "done" | "skipped" | "failed (exit N)"}.
    Each capability is probed once, before its first run; a probe that reports another capability fails
    the sweep before any run starts."""
    states = {r.out: run_state(agent, r) for r in runs}  # every directory checked before anything runs
    todo = [r for r in runs if states[r.out] != "done"]
    reported = {}
    for cap in dict.fromkeys(r.capability for r in todo):
        reported[cap] = probe_capability(cap)
        if cap != "native" and reported[cap] != cap:
            raise ConfigError(f"--cpu-capability {cap}: torch reports {reported[cap]!r} with ATEN_CPU_CAPABILITY="
                              f"{cap} on this machine (the CPU lacks it?)")
    status = {r.out: "skipped" for r in runs if states[r.out] == "done"}
    for r in runs:
        if r.out in status:
            log(f"seed {r.seed}, {r.capability}: finished before, kept ({r.out})")
    running: list[tuple[Run, subprocess.Popen[bytes], float]] = []
    queue = list(todo)
    try:
        while queue or running:
            while queue and len(running) < jobs:
                r = queue.pop(0)
                log(f"seed {r.seed}, {r.capability}: started ({r.out}, log {r.out / 'log.txt'})")
                running.append((r, start_run(agent, r, reported[r.capability]), time.perf_counter()))
            time.sleep(0.2)
            for item in list(running):
                r, proc, t0 = item
                rc = proc.poll()
                if rc is None:
                    continue
                running.remove(item)
                ok = rc == 0 and (r.out / "results.json").is_file()
                status[r.out] = "done" if ok else f"failed (exit {rc})"
                log(f"seed {r.seed}, {r.capability}: {status[r.out]} after "
                    f"{(time.perf_counter() - t0) / 60:.1f} min")
    finally:
        for _, proc, _ in running:  # interrupted: stop what this sweep started
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return status


# ---------------------------------------------------------------------------------------------- aggregation


def mean_sd(values: list[float]) -> dict[str, Any]:
    """{"mean", "sd" (ddof 1; None for fewer than two values), "n", "values"}."""
    n = len(values)
    mean = math.fsum(values) / n if n else None
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else None  # type: ignore[operator]
    return {"mean": mean, "sd": sd, "n": n, "values": list(values)}


def mean_se(values: list[float]) -> tuple[float, float | None]:
    """(mean, standard error: sd with ddof 1 / sqrt(n)); None for one value. The trained tables' cell
    (benchmarks/context_management.py, infmem_trained.py, mem1_trained.py)."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def trained_runs(root: Path, methods: tuple[str, ...]) -> dict[str, list[tuple[Path, dict[str, Any]]]]:
    """{method: [(run dir, results.json)]} of the finished runs under ROOT/<method>/[<capability>/]seed<k> (one
    `--seeds` sweep per method), in run-dir order; fails in one line on a run of another method than its
    directory names, or on runs under two capabilities. The trained tables' input."""
    out: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for method in methods:
        found = sorted(p.parent for p in (root / method).glob("**/results.json")
                       if re.fullmatch(r"seed\d+", p.parent.name))
        parents = {p.parent for p in found}
        if len(parents) > 1:
            raise SystemExit(f"--trained: {root / method} holds runs under {len(parents)} directories "
                             f"({', '.join(sorted(str(p) for p in parents))}); aggregate one capability")
        runs = []
        for d in found:
            res = json.loads((d / "results.json").read_text(encoding="utf-8"))
            if res.get("method") != method:
                raise SystemExit(f"--trained: {d / 'results.json'} is a run of method {res.get('method')!r}, "
                                 f"not {method}")
            runs.append((d, res))
        if runs:
            out[method] = runs
    return out


def fmt(cell: dict[str, Any], sign: bool = False, digits: int = 1) -> str:
    if cell["mean"] is None:
        return "-"
    m = f"{cell['mean']:+.{digits}f}" if sign else f"{cell['mean']:.{digits}f}"
    return f"{m} ± {cell['sd']:.{digits}f}" if cell["sd"] is not None else f"{m} ± n/a"


def load_results(runs: list[Run]) -> dict[Path, dict[str, Any]]:
    """{out dir: results.json} of the finished runs."""
    out = {}
    for r in runs:
        path = r.out / "results.json"
        if path.is_file():
            try:
                out[r.out] = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError) as e:
                raise UserError(f"{path}: unreadable ({e})") from None
    return out


def reported_of(runs: list[Run]) -> set[str]:
    """The capabilities torch reported for `runs` (their sweep_run.json's reported_capability)."""
    out = set()
    for r in runs:
        try:
            out.add(str(json.loads((r.out / MARKER).read_text(encoding="utf-8"))["reported_capability"]))
        except (OSError, ValueError, KeyError):
            continue
    return out


def eval_fingerprint(agent: str, run: Run, res: dict[str, Any]) -> str:
    """What must be equal across runs for their held-out numbers to be comparable."""
    if agent in ("memact", "context", "mem1", "infmem"):
        path = run.out / "data" / "heldout_tasks.jsonl"
        if not path.is_file():
            raise UserError(f"{path}: missing; cannot check that the run evaluated the same held-out tasks")
        return hashlib.sha256(path.read_bytes()).hexdigest()
    try:
        return json.dumps({"eval": res["recipe"]["eval"], "lengths": res["lengths"]}, sort_keys=True)
    except KeyError as e:
        raise UserError(f"{run.out / 'results.json'}: no {e.args[0]!r}; not a memagent demo result") from None


EMPTY = {"mean": None, "sd": None, "n": 0, "values": []}
MEMAGENT_COLUMNS = (("sft", "sampled"), ("rl", "sampled"), ("gain", "sampled"), ("sft", "greedy"),
                    ("rl", "greedy"), ("gain", "greedy"))
MEMACT_FIELDS = ("accuracy", "accuracy_2q", "accuracy_3q", "mean_context_tokens", "peak_context_tokens",
                 "prunes_per_task")
MEM1_FIELDS = ("accuracy", "peak_context_tokens", "mean_context_tokens", "turns")
INFMEM_FIELDS = ("accuracy", "model_calls", "chunks_read", "retrievals", "stop_rate")
CONTEXT_FIELDS = ("accuracy", "peak_context_tokens", "mean_context_tokens", "tokens_discarded", "branches",
                  "summaries", "stopped_by_budget")


def _field(res: dict[str, Any], path: tuple[str, ...], where: Path) -> float:
    obj: Any = res
    for p in path:
        if not isinstance(obj, dict) or p not in obj:
            raise UserError(f"{where / 'results.json'}: no {'.'.join(path)}")
        obj = obj[p]
    return float(obj)


def aggregate(agent: str, runs: list[Run]) -> dict[str, Any]:
    """Per capability: mean +- sd over the finished seeds (memagent: per length, SFT and SFT+RL accuracy and
    the per-seed gain, sampled and greedy, and the demonstrator's sampled accuracy; memact: per decoding,
    SFT and SFT+DCPO accuracy, by question count, mean / peak context, prunes, and the gains)."""
    results = load_results(runs)
    prints = {r.out: eval_fingerprint(agent, r, results[r.out]) for r in runs if r.out in results}
    if len(set(prints.values())) > 1:
        first = next(iter(prints))
        a = next(p for p, f in prints.items() if f != prints[first])
        b = first
        raise UserError(f"{a}: evaluated other held-out tasks than {b}; runs with different evaluations "
                          "cannot be aggregated")
    table: dict[str, Any] = {}
    for cap in dict.fromkeys(r.capability for r in runs):
        done = [r for r in runs if r.capability == cap and r.out in results]
        entry: dict[str, Any] = {"seeds": [r.seed for r in done], "reported": sorted(reported_of(done)),
                                 "pending": [r.seed for r in runs if r.capability == cap and r.out not in results]}
        if agent == "memagent":
            lengths = results[done[0].out]["lengths"] if done else []
            rows = {}
            for n in lengths:
                col: dict[str, list[float]] = {}
                for r in done:
                    res = results[r.out]
                    for mode in ("sampled", "greedy"):
                        sft = _field(res, ("stages", "sft", str(n), mode, "accuracy"), r.out)
                        rl = _field(res, ("stages", "rl", str(n), mode, "accuracy"), r.out)
                        col.setdefault(f"sft_{mode}", []).append(sft)
                        col.setdefault(f"rl_{mode}", []).append(rl)
                        col.setdefault(f"gain_{mode}", []).append(rl - sft)
                    demo = res["stages"].get("demonstrator", {}).get(str(n), {}).get("sampled")
                    if demo is not None:
                        col.setdefault("demonstrator_sampled", []).append(float(demo["accuracy"]))
                rows[str(n)] = {k: mean_sd(v) for k, v in col.items()}
            entry["lengths"] = rows
            entry["train_chunks"] = results[done[0].out]["recipe"]["train_chunks"] if done else None
        elif agent == "mem1":  # per decoding and objective count k (memrl.demos.mem1)
            rows = {}
            for mode in ("greedy", "sampled"):
                col = {}
                for r in done:
                    res = results[r.out]
                    for k in res.get("objectives", []):
                        for f in MEM1_FIELDS:
                            for pol in ("sft", "rl"):
                                col.setdefault(f"{pol}_k{k}_{f}", []).append(_field(res, (pol, mode, str(k), f), r.out))
                rows[mode] = {k: mean_sd(v) for k, v in col.items()}
            entry["decodings"] = rows
            entry["objectives"] = results[done[0].out]["objectives"] if done else []
        elif agent == "infmem":
            rows = {}
            for mode in ("greedy", "sampled"):
                for n in (results[done[0].out]["lengths"] if done else []):
                    col = {}
                    for r in done:
                        res = results[r.out]
                        for f in INFMEM_FIELDS:
                            sft = _field(res, ("sft", str(n), mode, f), r.out)
                            rl = _field(res, ("rl", str(n), mode, f), r.out)
                            col.setdefault(f"sft_{f}", []).append(sft)
                            col.setdefault(f"rl_{f}", []).append(rl)
                            col.setdefault(f"gain_{f}", []).append(rl - sft)
                    rows[f"{mode} {n}"] = {k: mean_sd(v) for k, v in col.items()}
            entry["rows"] = rows
            entry["method"] = results[done[0].out]["method"] if done else None
        else:
            rows = {}
            fields, rl_key = (CONTEXT_FIELDS, "rl") if agent == "context" else (MEMACT_FIELDS, "dcpo")
            for mode in ("greedy", "sampled"):
                col = {}
                for r in done:
                    res = results[r.out]
                    for f in fields:
                        if f.startswith("accuracy_") and f not in res.get("sft", {}).get(mode, {}):
                            continue  # no task with that question count
                        sft = _field(res, ("sft", mode, f), r.out)
                        rl = _field(res, (rl_key, mode, f), r.out)
                        col.setdefault(f"sft_{f}", []).append(sft)
                        col.setdefault(f"rl_{f}", []).append(rl)
                        col.setdefault(f"gain_{f}", []).append(rl - sft)
                rows[mode] = {k: mean_sd(v) for k, v in col.items()}
            entry["decodings"] = rows
            entry["budget"] = mean_sd([_field(results[r.out], ("budget", "max_context_tokens"), r.out) for r in done])
        table[cap] = entry
    return {"agent": agent, "runs": [{"seed": r.seed, "capability": r.capability, "out": str(r.out),
                                      "finished": r.out in results} for r in runs],
            "capabilities": table}


def markdown(agg: dict[str, Any], command: str = "") -> str:
    """The aggregate as markdown: one table per capability."""
    lines = []
    if command:
        lines += [f"`{command}`", ""]
    for cap, e in agg["capabilities"].items():
        seeds = ", ".join(map(str, e["seeds"])) or "none"
        pend = f"; not finished: {', '.join(map(str, e['pending']))}" if e["pending"] else ""
        var = f"ATEN_CPU_CAPABILITY={cap}" if cap != "native" else "ATEN_CPU_CAPABILITY unset"
        if e["reported"] and e["reported"] != [cap]:
            var += f" (torch reported {', '.join(e['reported'])})"
        lines += [f"{var}: mean ± sd over training seeds {seeds} (n = {len(e['seeds'])}{pend})",
                  ""]
        if agg["agent"] == "memagent":
            lines += ["| length (chunks) | x | demonstrator sampled | SFT sampled | SFT+RL sampled | gain sampled | "
                      "SFT greedy | SFT+RL greedy | gain greedy |",
                      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for n, row in e["lengths"].items():
                x = int(n) // e["train_chunks"] if e["train_chunks"] else 0
                demo = fmt(row["demonstrator_sampled"]) if "demonstrator_sampled" in row else "-"
                cells = [fmt(row[f"{s}_{m}"], sign=s == "gain") for s, m in MEMAGENT_COLUMNS]
                lines.append(f"| {n} | {x}x | {demo} | " + " | ".join(cells) + " |")
        elif agg["agent"] == "infmem":
            lines += [f"method {e['method']}", "",
                      "| policy | decoding | length (chunks) | accuracy (%) | model calls | chunks read | retrievals "
                      "| stop rate (%) |", "|---|---|---:|---:|---:|---:|---:|---:|"]
            for label, key in (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain")):
                for where, row in e["rows"].items():
                    mode, n = where.split()
                    cells = [fmt(row.get(f"{key}_{f}", EMPTY), sign=key == "gain",
                                 digits=1 if f in ("accuracy", "stop_rate") else 2) for f in INFMEM_FIELDS]
                    lines.append(f"| {label} | {mode} | {n} | " + " | ".join(cells) + " |")
        elif agg["agent"] == "context":
            lines += ["| policy | decoding | accuracy (%) | peak context | mean context | tokens discarded | branches "
                      "| summaries | stopped by budget (%) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
            for label, key in (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain")):
                for mode, row in e["decodings"].items():
                    cells = [fmt(row.get(f"{key}_{f}", EMPTY), sign=key == "gain",
                                 digits=2 if f in ("branches", "summaries") else 1) for f in CONTEXT_FIELDS]
                    lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
            if e["budget"]["n"]:
                lines += ["", f"Working-context budget (calibrated per run): {fmt(e['budget'])} tokens."]
        elif agg["agent"] == "mem1":
            lines += ["| policy | decoding | objectives | accuracy (%) | peak context | mean context | turns |",
                      "|---|---|---:|---:|---:|---:|---:|"]
            for label, key in (("cold start (SFT)", "sft"), ("SFT + RL", "rl")):
                for mode, row in e["decodings"].items():
                    for k in e["objectives"]:
                        cells = [fmt(row.get(f"{key}_k{k}_{f}", EMPTY)) for f in MEM1_FIELDS]
                        lines.append(f"| {label} | {mode} | {k} | " + " | ".join(cells) + " |")
        else:
            lines += ["| policy | decoding | accuracy (%) | 2-question | 3-question | mean context (tokens) | "
                      "peak context (tokens) | prunes / task |",
                      "|---|---|---:|---:|---:|---:|---:|---:|"]
            for label, key in (("cold start (SFT)", "sft"), ("SFT + DCPO", "rl"), ("DCPO - SFT", "gain")):
                for mode, row in e["decodings"].items():
                    cells = [fmt(row.get(f"{key}_{f}", EMPTY), sign=key == "gain", digits=2 if f == "prunes_per_task" else 1)
                             for f in MEMACT_FIELDS]
                    lines.append(f"| {label} | {mode} | " + " | ".join(cells) + " |")
            if e["budget"]["n"]:
                lines += ["", f"Working-context budget (calibrated per run): {fmt(e['budget'])} tokens."]
        lines.append("")
    return "\n".join(lines)


def write_outputs(agg: dict[str, Any], root: Path, command: str = "") -> str:
    """ROOT/seeds_results.md and ROOT/seeds_results.json; returns the markdown."""
    agg, command = redact_secrets(agg), redact_text(command)  # the record is kept and shared: no secrets
    text = markdown(agg, command)
    root.mkdir(parents=True, exist_ok=True)
    (root / "seeds_results.md").write_text(text, encoding="utf-8")
    (root / "seeds_results.json").write_text(json.dumps({**agg, "command": command}, indent=1) + "\n",
                                             encoding="utf-8")
    return text


def run_sweep(agent: str, root: str | Path, seeds: list[int], capabilities: list[str], overrides: list[str],
              jobs: int = 1, aggregate_only: bool = False, command: str = "") -> tuple[str, dict[Path, str]]:
    """Plan, run what is unfinished (unless `aggregate_only`), aggregate; (markdown, run statuses)."""
    root = Path(root)
    if jobs < 1:
        raise ConfigError(f"--jobs: expected at least 1, got {jobs}")
    runs = plan(agent, root, seeds, capabilities, overrides)
    status = {} if aggregate_only else run_all(agent, runs, jobs)
    return write_outputs(aggregate(agent, runs), root, command), status
