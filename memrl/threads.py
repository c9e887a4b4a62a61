"""CPU threads for `memrl train`, `memrl eval` and `memrl ask`: torch's intra-op and inter-op thread counts
and the OpenMP wait policy (the `threads` section of TrainConfig and EvalConfig).

    memrl train ... threads.intra_op=2 threads.inter_op=1 threads.wait_policy=passive

Defaults: intra_op = OMP_NUM_THREADS when the environment sets it, else the CPUs this process may run on
(os.sched_getaffinity), at most 16; for `memrl eval` and `memrl ask` less the ones other processes keep busy
when it starts (busy_cpus: their share of those CPUs over a quarter second of /proc/stat, rounded; at least one
thread), while `memrl train` keeps them all, so that its numbers do not depend on the load, and says which
count would run faster; inter_op = 1 (eager CPU work has no inter-op parallelism to use);
wait_policy = OMP_WAIT_POLICY when the environment sets it, else PASSIVE. An explicit `threads.*` value
wins over the environment; a value left at its default defers to it.

Bounds: OMP_NUM_THREADS is bounded as threads.intra_op is (at most MAX_PARALLEL = 4096 threads): a larger
count is refused in one line before torch is imported (`check_env_threads`, from memrl.cli), since torch's
OpenMP runtime would start that many threads at its first parallel op. A count from either above the CPUs
this process may use is run, with a warning (the threads take turns on the CPUs: slower, never faster).

Why PASSIVE: torch's OpenMP runtime (libgomp) spins after each parallel region (GOMP_SPINCOUNT 300000
iterations by default) waiting for the next one; beside another busy process the spinning thread takes
the core its partner needs, and a two-thread process ran 5-10x slower than a one-thread one
(benchmarks/threads.py, docs/results/engine.md "Threads"). PASSIVE puts a waiting thread to sleep at once.

The wait policy is read by libgomp once, when torch is imported: setting os.environ afterwards changes
nothing. `memrl.cli.main` therefore reads the `threads` section (from --preset and the `threads.*`
overrides) before any command module, and so torch, is imported (`early_env`); `apply` then sets torch's
thread counts from the fully loaded config and reports what is in effect. Called from Python after
torch is loaded (`memrl.eval.ask.ask(..., apply_threads=True)`), the counts apply and a wait policy the
environment did not already give is logged as not in effect. This module imports torch only in functions.

Worker processes inherit the setting: `apply` exports the section as MEMRL_THREADS (and the wait policy as
OMP_WAIT_POLICY) to the environment Ray workers and child processes start with; Ray training ranks and
engine replicas call `apply_inherited`, where intra_op's default is Ray's OMP_NUM_THREADS (the actor's CPUs).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import asdict, dataclass
from typing import Any

from memrl.config import MAX_PARALLEL, ConfigError, check_config, valid

log = logging.getLogger(__name__)

WAIT_POLICIES = ("auto", "passive", "active")
MAX_AUTO_THREADS = 16
"""intra_op's default never exceeds this many threads (past it a step's small ops gain little)."""
ENV = "MEMRL_THREADS"
"""The environment variable that hands the section to worker processes (JSON)."""
COMMANDS = ("train", "eval", "ask")
"""The `memrl` commands that take the `threads` section."""


@dataclass
class ThreadsSection:
    """CPU threads of this process (memrl.threads): torch's intra-op / inter-op pools, OpenMP's wait policy."""

    intra_op: int = valid(0, ge=0, le=MAX_PARALLEL,
                          note="0 = auto: OMP_NUM_THREADS if set, else the CPUs this process may use, at most 16 "
                               "(eval / ask: less those other processes keep busy at start)")
    """torch.set_num_threads: threads one op (a matmul, an attention) splits over."""
    inter_op: int = valid(1, ge=0, le=MAX_PARALLEL, note="0 = torch's default, one per core")
    """torch.set_num_interop_threads: threads that run independent ops at once (eager CPU code has none)."""
    wait_policy: str = valid("auto", choices=WAIT_POLICIES)
    """OMP_WAIT_POLICY for torch's OpenMP threads: passive = sleep between parallel regions (right beside
    other jobs); active = spin (can be faster on cores nothing else uses); auto = the environment's
    OMP_WAIT_POLICY if set, else passive. Takes effect only when set before torch is imported (memrl
    train / eval / ask do)."""


# The environment as memrl found it and what memrl set, fixed when this module is first imported (memrl.cli
# imports it before torch): whether torch was already loaded, and the user's own OMP_WAIT_POLICY.
_TORCH_BEFORE = "torch" in sys.modules
_USER_POLICY = os.environ.get("OMP_WAIT_POLICY")
_SET_BY_MEMRL: str | None = None
"""The OMP_WAIT_POLICY value early_env put in the environment before torch was imported."""


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask; os.cpu_count where there is none)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # macOS and Windows have no sched_getaffinity
        return os.cpu_count() or 1


BUSY_SAMPLE_S = 0.25
"""How long `busy_cpus` watches the CPUs (25 scheduler ticks per CPU at Linux's 100 Hz)."""


def _cpu_ticks(cpus: set[int]) -> tuple[int, int] | None:
    """(busy ticks, all ticks) summed over `cpus` from /proc/stat; None where there is no /proc/stat."""
    try:
        lines = open("/proc/stat").read().splitlines()  # noqa: SIM115 - one read
    except OSError:
        return None
    busy = total = 0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        ticks = [int(f) for f in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(ticks)
        busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total


def busy_cpus(cpus: set[int] | None = None, seconds: float = BUSY_SAMPLE_S) -> float | None:
    """How many of `cpus` (default: this process's) other processes keep busy: the busy share of their ticks
    over `seconds` while this process sleeps, times their number. None where /proc/stat is missing."""
    import time  # noqa: PLC0415

    cpus = cpus if cpus is not None else set(os.sched_getaffinity(0))
    first = _cpu_ticks(cpus)
    time.sleep(seconds)
    last = _cpu_ticks(cpus)
    if first is None or last is None or last[1] <= first[1]:
        return None
    return len(cpus) * (last[0] - first[0]) / (last[1] - first[1])


def auto_threads(load_aware: bool = True) -> tuple[int, str]:
    """intra_op's automatic value and how it was found, for the log. Load-aware (memrl eval / ask): the usable
    CPUs less those other processes keep busy now (busy_cpus, rounded), at least 1 and at most
    MAX_AUTO_THREADS. Not (memrl train, whose numbers must not depend on the load: the thread count changes
    float rounding, and a resumed run must continue the same computation): the usable CPUs, at most
    MAX_AUTO_THREADS, with a warning naming the faster count when other processes keep CPUs busy."""
    cpus = usable_cpus()
    try:
        busy = busy_cpus() if cpus > 1 else None
    except (AttributeError, OSError, ValueError):  # no affinity call or an unreadable /proc/stat: all CPUs
        busy = None
    every = min(cpus, MAX_AUTO_THREADS)
    if busy is None:
        return every, "auto"
    free = min(max(1, cpus - int(busy + 0.5)), MAX_AUTO_THREADS)
    if load_aware:
        return free, f"auto ({cpus} CPUs, {busy:.1f} busy with other processes)"
    if free < every:
        log.warning("threads: other processes keep %.1f of this process's %d CPUs busy; threads.intra_op stays at "
                    "%d so that the run's numbers do not depend on the load (threads.intra_op=%d would run "
                    "faster beside them)", busy, cpus, every, free)
    return every, "auto"


def _env_threads() -> int | None:
    """OMP_NUM_THREADS's first count (OpenMP reads a list: one count per nesting level), bounded as
    threads.intra_op is (check_env_threads); None when unset or not a positive count."""
    raw = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if not (raw.isdigit() and int(raw) > 0):
        return None
    check_env_threads()
    return int(raw)


def check_env_threads() -> None:
    """ConfigError when OMP_NUM_THREADS asks for more than MAX_PARALLEL threads (the bound of threads.intra_op):
    torch's OpenMP runtime reads it when torch is imported and starts that many threads at the first parallel op
    (100,000 exhausted the process's threads and crashed; 5,000 made one tiny step take minutes). memrl.cli
    calls it before any command imports torch."""
    raw = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if raw.isdigit() and int(raw) > MAX_PARALLEL:
        raise ConfigError(f"OMP_NUM_THREADS={int(raw)} is more threads than memrl runs ({MAX_PARALLEL} at most, as "
                          f"threads.intra_op; this process may use {usable_cpus()} CPUs): set it to at most the "
                          "CPUs, or unset it")


def warn_oversubscribed(threads: int, source: str) -> None:
    """A warning when `threads` (from `source`: threads.intra_op or OMP_NUM_THREADS) is more than the CPUs this
    process may use: the threads of every op then take turns on them, and a step runs several times slower
    (4096 threads on 2 CPUs: 13x)."""
    cpus = usable_cpus()
    if threads > cpus:
        log.warning("threads: %s=%d is more than the %d CPU(s) this process may use; every op's threads take turns "
                    "on them and run slower (%s=%d, or leave it unset: the default picks the CPUs)", source,
                    threads, cpus, source, cpus)


def intra_op_threads(sec: ThreadsSection, load_aware: bool = True) -> tuple[int, str]:
    """(threads, where the number comes from: threads.intra_op, OMP_NUM_THREADS or auto; auto_threads). A count
    from the setting or the environment above the usable CPUs is warned about (warn_oversubscribed); the
    environment's, above MAX_PARALLEL, is refused (check_env_threads), as the setting's is by its range."""
    if sec.intra_op:
        warn_oversubscribed(sec.intra_op, "threads.intra_op")
        return sec.intra_op, "threads.intra_op"
    env = _env_threads()
    if env is not None:
        warn_oversubscribed(env, "OMP_NUM_THREADS")
        return env, "OMP_NUM_THREADS"
    return auto_threads(load_aware)


def wanted_policy(sec: ThreadsSection, user_env: str | None) -> str | None:
    """The OMP_WAIT_POLICY value `sec` asks for ("PASSIVE" / "ACTIVE"); None = keep the user's `user_env`."""
    if sec.wait_policy == "auto":
        return None if user_env else "PASSIVE"
    return sec.wait_policy.upper()


def set_policy_env(sec: ThreadsSection) -> bool:
    """Put `sec`'s wait policy in the environment if torch is not loaded yet (libgomp reads it at torch's
    import); False when torch already is (then it cannot take effect in this process)."""
    global _SET_BY_MEMRL
    if "torch" in sys.modules:
        return False
    want = wanted_policy(sec, _USER_POLICY)
    if want is not None:
        os.environ["OMP_WAIT_POLICY"] = want
        _SET_BY_MEMRL = want
    return True


def section_from(preset: str | None, overrides: list[str]) -> ThreadsSection:
    """The `threads` section alone, from a preset's `threads:` mapping (and its `inherit:` chain) and the
    `threads.*` overrides, as load_config would build it; raises what load_config raises on a bad value."""
    from omegaconf import OmegaConf  # noqa: PLC0415 - as memrl.config does

    from memrl.config import preset_chain, preset_path  # noqa: PLC0415

    node = OmegaConf.structured(ThreadsSection)
    if preset:
        for _, loaded in preset_chain(preset_path(preset)):
            sub = loaded.get("threads") if hasattr(loaded, "get") else None
            if sub is not None:
                node = OmegaConf.merge(node, sub)
    for ov in overrides:
        node = OmegaConf.merge(node, OmegaConf.from_dotlist([ov[len("threads."):]]))
    sec = OmegaConf.to_object(node)
    check_config(sec, "threads")
    return sec  # type: ignore[return-value]


def _preset_arg(args: list[str]) -> str | None:
    for i, a in enumerate(args):
        if a == "--preset" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--preset="):
            return a.split("=", 1)[1]
    return None


def early_env(argv: list[str]) -> None:
    """`memrl` command line `argv` (without the program): for train / eval / ask, the wait policy of its
    `threads` section into the environment before torch is imported. A section that does not load is left
    to the command's own config load to report."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in COMMANDS or "torch" in sys.modules:
        return
    rest = argv[argv.index(command) + 1:]
    overrides = [a for a in rest if a.startswith("threads.") and "=" in a]
    try:
        sec = section_from(_preset_arg(rest), overrides)
    except Exception:  # noqa: BLE001 - the full config load names the problem
        return
    set_policy_env(sec)


def _policy_in_effect() -> tuple[str, str]:
    """(OMP_WAIT_POLICY as torch's OpenMP runtime read it, where it came from)."""
    if _SET_BY_MEMRL is not None:
        return _SET_BY_MEMRL, "memrl"
    if _USER_POLICY:
        return _USER_POLICY.upper(), "OMP_WAIT_POLICY"
    return "unset", "OpenMP's default (spin, then sleep)"


def set_torch_threads(intra_op: int, inter_op: int = 0) -> None:
    """torch.set_num_threads(intra_op) and, when inter_op > 0, torch.set_num_interop_threads(inter_op) (which
    torch takes once per process, before any inter-op work: a later different value is logged, not raised).
    The one implementation of memrl's thread counts (the demos' `threads=` too)."""
    import torch  # noqa: PLC0415 - this module is imported before torch on purpose

    if intra_op > 0 and torch.get_num_threads() != intra_op:
        torch.set_num_threads(intra_op)
    if inter_op > 0 and torch.get_num_interop_threads() != inter_op:
        try:
            torch.set_num_interop_threads(inter_op)
        except RuntimeError as e:  # already started, or set before
            log.info("threads.inter_op=%d not applied (torch keeps %d): %s", inter_op,
                     torch.get_num_interop_threads(), str(e).splitlines()[0])


def apply(sec: ThreadsSection, load_aware: bool = True) -> dict[str, Any]:
    """Set this process's torch threads from `sec`, export the section to worker processes, and return what
    is in effect (recorded with the run): intra_op, inter_op, wait_policy and where each came from.
    `load_aware`: intra_op's default leaves the CPUs other processes keep busy (memrl eval / ask; memrl train
    passes False: auto_threads)."""

    intra, intra_from = intra_op_threads(sec, load_aware)
    set_torch_threads(intra, sec.inter_op)
    policy, policy_from = _policy_in_effect()
    want = wanted_policy(sec, _USER_POLICY if _SET_BY_MEMRL is None else None)
    if want is not None and want != policy:
        why = ("torch was imported before memrl could set it" if _TORCH_BEFORE or _SET_BY_MEMRL is None
               else "it was read before the config was")
        (log.warning if sec.wait_policy != "auto" else log.info)(
            "threads.wait_policy=%s is not in effect (OpenMP uses %s: %s); set OMP_WAIT_POLICY=%s in the "
            "environment", sec.wait_policy, policy, why, want)
    os.environ[ENV] = json.dumps(asdict(sec))
    child = want or (policy if policy != "unset" else None)
    if child:
        os.environ["OMP_WAIT_POLICY"] = child  # what worker processes start with (read at their torch import)
    info = {**in_effect(), "intra_op_from": intra_from, "wait_policy_from": policy_from}
    log.info("threads: intra_op=%d (%s), inter_op=%d, OMP_WAIT_POLICY=%s (%s), %d CPUs usable", info["intra_op"],
             intra_from, info["inter_op"], policy, policy_from, info["cpus"])
    return info


def in_effect() -> dict[str, Any]:
    """This process's threads as they are now: torch's intra-op and inter-op counts, the OpenMP wait policy
    torch's runtime read (as far as this process can tell: "unset" = OpenMP's default) and the usable CPUs."""
    import torch  # noqa: PLC0415

    return {"intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads(),
            "wait_policy": _policy_in_effect()[0], "cpus": usable_cpus()}


def worker_env() -> dict[str, str]:
    """The environment variables a worker process needs to run with this process's setting (for Ray's
    runtime_env): MEMRL_THREADS and OMP_WAIT_POLICY, where set."""
    return {k: os.environ[k] for k in (ENV, "OMP_WAIT_POLICY") if os.environ.get(k)}


def apply_inherited() -> dict[str, Any] | None:
    """In a worker process: apply the section the driver exported (MEMRL_THREADS); None when there is none.
    Its wait policy took effect if OMP_WAIT_POLICY was in the environment the worker started with. intra_op's
    default is not load-aware here (training ranks, like memrl train, must not follow the load)."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    try:
        sec = ThreadsSection(**json.loads(raw))
        check_config(sec, "threads")
    except (TypeError, ValueError) as e:
        log.warning("%s=%r ignored: %s", ENV, raw, e)
        return None
    intra, _ = intra_op_threads(sec, load_aware=False)
    set_torch_threads(intra, sec.inter_op)
    return in_effect()


def metrics(info: dict[str, Any]) -> dict[str, float]:
    """`apply`'s result as numeric metrics (a training run's metrics rows): threads/intra_op, threads/inter_op,
    threads/passive (1 = PASSIVE, 0 = ACTIVE, -1 = OpenMP's default)."""
    p = str(info.get("wait_policy", "")).upper()
    return {"threads/intra_op": float(info["intra_op"]), "threads/inter_op": float(info["inter_op"]),
            "threads/passive": 1.0 if p == "PASSIVE" else 0.0 if p == "ACTIVE" else -1.0}
