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
exactly): the method's `settings.seed_keys` (memrl.recipes.pipeline.MethodSettings; e.g. memact: `seed` for the model init,
tokenizer, copy warm-up and SFT order, `sft.seed` for the SFT tasks and the scripted agent's coins,
`rl_task_seed`, `train.data.seed`, `train.trainer.seed`). The held-out evaluation (eval.seed, eval.num_tasks,
the lengths) is never shifted, and no training task seed (`task_seeds`) may equal a held-out one
(`heldout_seeds`). context: `sft_from=ROOT` / `warmup_from=ROOT` name another context sweep: each run reuses
the cold start / copy warm-up of ROOT's run of the same capability and seed. The aggregation checks that
every run evaluated the same held-out tasks (results.json's heldout_sha256: the digests its evaluation rows
carry) and refuses to mix them.

Resumable: a run whose out dir has results.json is not run again (its sweep_run.json must name the same
agent, seed, capability and overrides); a run started before and not finished is started again from an
empty directory. Writes ROOT/seeds_results.md (printed; the method's `sweep` table) and
ROOT/seeds_results.json: per capability, `cells` (decoding -> bucket -> "<policy>_<field>" and
"gain_<field>"): mean +- sd over the finished seeds (sd with ddof 1; "n/a" for one seed) of the sweep table's
fields for SFT, SFT+RL and their per-seed gain, read from the runs' summary rows (results.json's "summary",
memrl.eval.fields.summary_rows): the runs' long rows (`run_rows`: run, seed, policy, decoding, bucket, field,
value) grouped by (policy, decoding, bucket, field) and reduced with memrl.eval.stats.stat (`cells`; the
benchmarks group their own rows the same way).
"""

from __future__ import annotations

import ctypes
import json
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
from memrl.errors import UserError
from memrl.eval.stats import group_stats, nest, stat
from memrl.locks import acquire, release
from memrl.recipes import split_overrides
from memrl.recipes.pipeline import Recipe, get_recipe, heldout_seeds, path_of
from memrl.recipes.tables import DECODINGS
from memrl.training.config import TrainConfig

CAPABILITIES = ("native", "default", "avx2", "avx512")
"""ATEN_CPU_CAPABILITY values on x86 (what torch.backends.cpu.get_cpu_capability() reports, lower-cased), and
"native": the variable removed from the run's environment, so torch picks the CPU's best kernels."""

MARKER = "sweep_run.json"
"""Written into a run's directory when the sweep starts it: what the run is, so a resume can check it."""

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


def _configs(agent: str, overrides: list[str]) -> tuple[Recipe, Any, Any]:
    """(the method, its demo config, its RL config) under `overrides`, read as `memrl.recipes.pipeline.load_recipe` reads them (a
    named variant expanded, the method's own RL overrides first); no directory is touched."""
    recipe = get_recipe(agent)
    demo_ov, train_ov = split_overrides(recipe.expand(list(overrides)))
    cfg = load_config(recipe.config, demo_ov)
    own = recipe.train_overrides(cfg, Path("."))
    return recipe, cfg, load_config(TrainConfig, [*own, *train_ov], preset=cfg.train_preset)


def base_seeds(agent: str, overrides: list[str]) -> dict[str, int]:
    """{override key: its value under `overrides` (the recipe's default unless overridden)} for the seeds a
    training seed shifts (the method's `seed_keys`), and "eval.seed"."""
    recipe, cfg, tcfg = _configs(agent, overrides)
    out = {key: int(_get(cfg if where == "demo" else tcfg, key.removeprefix("train.")))
           for key, where in recipe.settings.seed_keys}
    out["eval.seed"] = int(cfg.eval.seed)
    return out


def seed_overrides(agent: str, seed: int, base: dict[str, int]) -> list[str]:
    """The overrides of training seed `seed`: every training seed shifted by `seed` (0 = the recipe's own)."""
    return [f"{key}={base[key] + seed}" for key, _ in get_recipe(agent).settings.seed_keys]


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
    recipe, cfg, _ = _configs(agent, overrides)
    keys = {key for key, _ in recipe.settings.seed_keys}
    fixed = [ov for ov in overrides if ov.split("=", 1)[0] in keys]
    if fixed:
        raise ConfigError(f"--seeds: {fixed[0].split('=', 1)[0]} is set by the training seed; drop the override "
                          f"{fixed[0]!r}")
    recipe.check_sweep(cfg)
    base = base_seeds(agent, overrides)
    over = [(key, base[key] + max(seeds)) for key, _ in recipe.settings.seed_keys if base[key] + max(seeds) > MAX_SEED]
    if over:
        raise ConfigError(f"--seeds: training seed {max(seeds)} makes {over[0][0]}={over[0][1]}, past the largest "
                          f"seed {MAX_SEED}")
    held = heldout_seeds(recipe, cfg)
    for key in recipe.settings.task_seeds:
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


def view_rows(view: dict[str, Any], fields: tuple[str, ...], **columns: Any) -> list[dict[str, Any]]:
    """The long rows of one run's view, policy (or arm) -> decoding -> bucket -> summary: {**columns, "policy",
    "decoding", "bucket", "field", "value"} for each of `fields` (a policy, decoding or bucket a run lacks
    gives no row); what `cells` groups."""
    return [{**columns, "policy": pol, "decoding": mode, "bucket": bucket, "field": f, "value": float(summary[f])}
            for pol, by_mode in view.items() for mode, by_bucket in by_mode.items()
            for bucket, summary in by_bucket.items() for f in fields]


def cells(rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The one aggregation over seeds: long rows ({"policy", "decoding", "bucket", "field", "value"}, e.g.
    `run_rows`, `view_rows`) grouped by (policy, decoding, bucket, field) and reduced with memrl.eval.stats.stat
    (mean, sd, SE: the sweep tables show ± sd, the trained tables' benchmarks ± SE), as decoding -> bucket ->
    {"<policy>_<field>": stat}, each in first-seen order."""
    flat = group_stats(rows, ("policy", "decoding", "bucket", "field"))
    return nest({(mode, bucket, f"{pol}_{f}"): s for (pol, mode, bucket, f), s in flat.items()})


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


def run_rows(recipe: Recipe, done: list[tuple[Path, dict[str, Any]]],
             fields: tuple[str, ...] | None = None) -> list[dict[str, Any]]:
    """The runs' long rows {"run", "seed", "policy", "decoding", "bucket", "field", "value"} from their
    results.json summary rows (memrl.eval.fields.summary_rows): per run (its out dir; seed: the dir's name), per
    decoding (greedy, sampled) and bucket of its sft rows, for each of `fields` (the sweep table's by default):
    sft, rl and "gain" (the run's rl - sft of the same decoding and bucket), then the other policies the sweep
    table names where the run has them; a None value (a rate over no events) gives no row, nor a gain. Fails
    in one line naming the results.json that lacks a part."""
    fields = recipe.sweep.fields if fields is None else fields
    others = [p for _, p in getattr(recipe.sweep, "policies", ()) if p not in ("sft", "rl", "gain")]
    rows: list[dict[str, Any]] = []
    for out, res in done:
        summary = res.get("summary") if isinstance(res, dict) else None
        if not isinstance(summary, list):
            raise UserError(f"{out / 'results.json'}: no summary; not a {recipe.name} demo result in the one "
                            "results layout (scripts/migrate_results.py converts an older one)")
        at = {(s["policy"], s["decoding"], s["bucket"]): s for s in summary}
        for mode in DECODINGS:
            for sft in (s for s in summary if s["policy"] == "sft" and s["decoding"] == mode):
                bucket = sft["bucket"]
                rl = at.get(("rl", mode, bucket))
                if rl is None:
                    raise UserError(f"{out / 'results.json'}: no summary row of rl, {mode}, bucket {bucket}")
                for f in fields:
                    a, b = _num(sft, f, out), _num(rl, f, out)
                    values = [("sft", a), ("rl", b), ("gain", None if a is None or b is None else b - a)]
                    values += [(p, _num(at[(p, mode, bucket)], f, out)) for p in others if (p, mode, bucket) in at]
                    rows += [{"run": str(out), "seed": out.name, "policy": pol, "decoding": mode, "bucket": bucket,
                              "field": f, "value": v} for pol, v in values if v is not None]
    return rows


def _num(summary: dict[str, Any], f: str, out: Path) -> float | None:
    if f not in summary:
        raise UserError(f"{out / 'results.json'}: the summary row of {summary['policy']}, {summary['decoding']}, "
                        f"bucket {summary['bucket']} has no {f}")
    return None if summary[f] is None else float(summary[f])


def sweep_extra(recipe: Recipe, done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
    """Entries of a capability's aggregate beside the cells (the method's `sweep_extras`: name -> ("mean", a
    dotted path in results.json: stat over the runs) or ("first", a path: the first run's value))."""
    out: dict[str, Any] = {}
    for name, (how, path) in recipe.settings.sweep_extras.items():
        if how == "first":
            out[name] = path_of(done[0][1], path) if done else None
            continue
        values = []
        for run_dir, res in done:
            try:
                values.append(float(path_of(res, path)))
            except (KeyError, TypeError, AttributeError):
                raise UserError(f"{run_dir / 'results.json'}: no {path}") from None
        out[name] = stat(values)
    return out


def aggregate(agent: str, runs: list[Run]) -> dict[str, Any]:
    """Per capability: the finished seeds, and mean +- sd over them of every summary field of SFT and SFT+RL
    and of their per-seed gain, per decoding and bucket (`cells`), plus the method's `sweep_extra`. Refuses
    runs that evaluated other held-out tasks (their results.json's heldout_sha256: the digests their rows carry)."""
    recipe = get_recipe(agent)
    results = load_results(runs)
    prints = {r.out: tuple(results[r.out].get("heldout_sha256") or ()) for r in runs if r.out in results}
    if len(set(prints.values())) > 1:
        first = next(iter(prints))
        a = next(p for p, f in prints.items() if f != prints[first])
        raise UserError(f"{a}: evaluated other held-out tasks than {first}; runs with different evaluations "
                        "cannot be aggregated")
    table: dict[str, Any] = {}
    for cap in dict.fromkeys(r.capability for r in runs):
        done = [(r.out, results[r.out]) for r in runs if r.capability == cap and r.out in results]
        entry: dict[str, Any] = {
            "seeds": [r.seed for r in runs if r.capability == cap and r.out in results],
            "reported": sorted(reported_of([r for r in runs if r.capability == cap and r.out in results])),
            "pending": [r.seed for r in runs if r.capability == cap and r.out not in results]}
        entry["cells"] = cells(run_rows(recipe, done))
        entry["buckets"] = list(next(iter(entry["cells"].values()), {}))
        entry.update(sweep_extra(recipe, done))
        table[cap] = entry
    return {"agent": agent, "runs": [{"seed": r.seed, "capability": r.capability, "out": str(r.out),
                                      "finished": r.out in results} for r in runs],
            "capabilities": table}


def markdown(agg: dict[str, Any], command: str = "") -> str:
    """The aggregate as markdown: one table per capability (the method's `sweep` table)."""
    recipe = get_recipe(agg["agent"])
    lines = []
    if command:
        lines += [f"`{command}`", ""]
    for cap, e in agg["capabilities"].items():
        seeds = ", ".join(map(str, e["seeds"])) or "none"
        pend = f"; not finished: {', '.join(map(str, e['pending']))}" if e["pending"] else ""
        var = f"ATEN_CPU_CAPABILITY={cap}" if cap != "native" else "ATEN_CPU_CAPABILITY unset"
        if e["reported"] and e["reported"] != [cap]:
            var += f" (torch reported {', '.join(e['reported'])})"
        lines += [f"{var}: mean ± sd over training seeds {seeds} (n = {len(e['seeds'])}{pend})", ""]
        if recipe.sweep is None:
            raise UserError(f"{recipe.name}: the method declares no sweep table")
        lines += recipe.sweep.render(e)
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
