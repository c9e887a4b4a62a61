"""Validation during training: every `trainer.val_every` steps (and before the first step with
`val.before_train`), the current policy answers the `val.files` through `memrl.eval.runner.evaluate`,
the very code `memrl eval` runs (rollouts through memrl.eval.evaluator's `Rollout`, statistics over tasks
by its `mean_and_se`, the demos' too), on the trainer's own RolloutRuntime (its engine, event loop and
services) or an injected rollout. Rows go to
`<out_dir>/val/step_<k>/results.jsonl` (with its eval_config.json, so `memrl report` reads the directory),
and the per-(dataset, N) summary of `memrl.eval.report.summarize` becomes metrics of step k:

    val/<dataset>/<N>/accuracy, em, f1 (percent), and mean_at_k / pass_at_k when val.samples > 1
    val/mean_accuracy: the mean of the accuracies over the (dataset, N) pairs

A dataset the file does not name is called by its file name. `trainer.save_best=<metric>` keeps the
checkpoint of the highest value of that metric as `checkpoints/best` (`keep_best`).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memrl.config import ConfigError
from memrl.errors import fault_point
from memrl.eval.report import summarize
from memrl.eval.runner import EvalConfig, evaluate, load_eval_file

log = logging.getLogger(__name__)

VAL_DIR = "val"
BEST_DIR = "best"
BEST_FILE = "best.json"


def eval_config(cfg: Any) -> Any:
    """The EvalConfig validation runs with: the training workflow section as given (no training-only
    defaults), sampled at val.temperature / val.top_p, val.samples answers per question, the first
    val.max_questions of every file, seeded with trainer.seed."""
    v = cfg.val
    wf = {**cfg.workflow, "temperature": v.temperature, "top_p": v.top_p}
    return EvalConfig(workflow=wf, engine=cfg.engine, limit=v.max_questions, seed=cfg.trainer.seed,
                      samples=v.samples, concurrency=cfg.trainer.concurrency, progress=False,
                      golds=v.golds, extract=v.extract, metric_rules=v.metric_rules, docs_from=cfg.data.docs_from,
                      failed_requests=v.failed_requests, strip_text=v.strip_text)


def check(cfg: Any) -> None:
    """One-line errors before any model loads: val_every without files, files that do not exist or cannot
    be read as eval files, a save_best metric with validation off or one no step logs (check_save_best)."""
    t, v = cfg.trainer, cfg.val
    if t.val_every and not v.files:
        raise ConfigError(f"val.files is empty but trainer.val_every={t.val_every} asks for validation; "
                          "pass val.files=[path,...] (eval files, as memrl eval reads them)")
    for f in v.files:
        if not Path(f).is_file():
            raise ConfigError(f"val.files: {f} does not exist")
    if t.save_best.startswith("val/") and not t.val_every:
        raise ConfigError(f"trainer.save_best={t.save_best} needs validation: set trainer.val_every > 0")
    ecfg = eval_config(cfg)  # workflow / sampling values checked now
    files = [load_eval_file(f, ecfg) for f in v.files] if t.val_every else []  # their contents too, before step 1
    check_save_best(t.save_best, files, v.samples)


METRIC_FAMILIES = ("reward", "rollout", "traj", "format", "judge", "loss", "train", "mismatch", "time", "perf",
                   "dcpo", "async", "val")
"""The first part of every metric a training step or validation logs (memrl.training.step.step_metrics)."""
VAL_KEYS = ("accuracy", "em", "f1", "questions", "mean_at_k", "pass_at_k", "string_match_all", "string_match_part")
"""What `val_metrics` logs under val/<dataset>/<N>/."""


def check_save_best(name: str, files: list[Any], samples: int) -> None:
    """trainer.save_best names a metric this run logs: a val/ name one of the validation files makes (from
    their datasets and lengths, as `val_metrics` names them), any other name in a known metric family;
    ConfigError listing the choices before the first step."""
    if not name:
        return
    family = name.split("/", 1)[0]
    if family not in METRIC_FAMILIES:
        raise ConfigError(f"trainer.save_best={name!r} is not a metric of this run: a metric's name starts with "
                          f"one of {', '.join(f + '/' for f in METRIC_FAMILIES)}")
    if family != "val":
        return
    unnamed: dict[int, set[str]] = {}
    pairs: set[tuple[str, int]] = set()
    for ef in files:
        for ds, n in ef.labels.values():
            if ds:
                pairs.add((ds, n))
            else:
                unnamed.setdefault(n, set()).add(Path(ef.path).stem)
    pairs |= {("+".join(sorted(stems)), n) for n, stems in unnamed.items()}
    keys = [k for k in VAL_KEYS if samples > 1 or k not in ("mean_at_k", "pass_at_k")]
    known = ["val/mean_accuracy"] + [f"val/{ds}/{n}/{k}" for ds, n in sorted(pairs) for k in keys]
    if name not in known and not (name.endswith(("/string_match_all", "/string_match_part"))
                                  and name.rsplit("/", 1)[0] + "/accuracy" in known):
        raise ConfigError(f"trainer.save_best={name!r} is not a metric validation of val.files logs; known: "
                          f"{', '.join(k for k in known if not k.endswith(('/string_match_all', '/string_match_part')))}")


def val_metrics(rows: list[dict[str, Any]]) -> dict[str, float]:
    """val/<dataset>/<N>/<metric> for each (dataset, N) of `rows` (memrl.eval.report.summarize), plus
    val/mean_accuracy."""
    out: dict[str, float] = {}
    accs = []
    for s in summarize(rows, "val"):
        ds = s.dataset or _file_label(rows, s.num_docs)
        base = f"val/{ds}/{s.num_docs}"
        for key in ("accuracy", "em", "f1", "mean_at_k", "pass_at_k", "string_match_all", "string_match_part"):
            value = getattr(s, key)
            if value is not None:
                out[f"{base}/{key}"] = float(value)
        out[f"{base}/questions"] = float(s.questions)
        accs.append(s.accuracy)
    if accs:
        out["val/mean_accuracy"] = sum(accs) / len(accs)
    return out


def _file_label(rows: list[dict[str, Any]], n: int) -> str:
    names = sorted({Path(str(r.get("file", ""))).stem for r in rows if not r.get("dataset") and r["num_docs"] == n})
    return "+".join(names) or "data"


def run_validation(cfg: Any, out_dir: str | Path, step: int, engine: Any = None, runtime: Any = None,
                   rollout: Any = None) -> dict[str, float]:
    """Evaluate the current policy on val.files into <out_dir>/val/step_<step> (replacing what a killed
    earlier attempt left there) and return its metrics: on the run's `runtime` (its loop, `engine` and
    services), or through `rollout` (a memrl.eval.evaluator.Rollout of the training workflow)."""
    out = Path(out_dir) / VAL_DIR / f"step_{step}"
    shutil.rmtree(out, ignore_errors=True)  # a redone step (resume) validates afresh
    rows = evaluate(cfg.val.files, out, eval_config(cfg), engine=engine, rollout=rollout,
                    runtime=runtime if rollout is None else None)
    return val_metrics(rows)


def copy_best(src: Path, root: Path, best: dict[str, Any]) -> None:
    """Make root/best a copy of checkpoint `src` plus best.json: written beside it, then swapped in."""
    tmp, old = root / f".{BEST_DIR}-new", root / f".{BEST_DIR}-old"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    fault_point("best_copy")
    (tmp / BEST_FILE).write_text(json.dumps(best) + "\n", encoding="utf-8")
    shutil.rmtree(old, ignore_errors=True)
    if (root / BEST_DIR).exists():
        os.replace(root / BEST_DIR, old)
    os.replace(tmp, root / BEST_DIR)
    shutil.rmtree(old, ignore_errors=True)


def restore_best(root: Path, best: dict[str, Any] | None) -> None:
    """On resume: undo what a kill inside keep_best left. A best moved aside but not replaced is moved
    back; a half-made copy is removed; a best the resumed state names (saved as step_N, killed before
    the copy) but checkpoints/best does not hold is copied now when step_N still exists."""
    cur, old = root / BEST_DIR, root / f".{BEST_DIR}-old"
    if old.is_dir() and not cur.exists():
        os.replace(old, cur)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(root / f".{BEST_DIR}-new", ignore_errors=True)
    if not best or best["step"] <= 0:
        return
    try:
        held = json.loads((cur / BEST_FILE).read_text(encoding="utf-8")).get("step")
    except (OSError, ValueError, AttributeError):
        held = None
    src = root / f"step_{int(best['step']):06d}"
    if held != best["step"] and src.is_dir():
        copy_best(src, root, best)


def keep_best(sec: Any, state: Any, step: int, metrics: dict[str, float], save: Callable[[], str | Path]) -> bool:
    """trainer.save_best (`sec`: the trainer section): when this step's value of the metric beats
    `state.best`, the best so far (higher is better; the first value always does), record it there, save
    checkpoint `step` (`save()`, whose state then holds the new best) and copy it to checkpoints/best
    (atomically, through a temporary sibling); steps <= trainer.save_best_after only set the best value.
    The best so far lives in the trainer state, so a resumed run compares against it. Returns whether it saved."""
    name = sec.save_best
    if not name or (name.startswith("val/") and not any(k.startswith("val/") for k in metrics)):
        return False  # off, or a step without validation
    if name not in metrics:
        known = sorted(k for k in metrics if k.startswith("val/")) or sorted(metrics)
        raise ConfigError(f"trainer.save_best={name!r} is not a metric of this run; known: {', '.join(known)}")
    value = float(metrics[name])
    if state.best and value <= float(state.best["value"]):
        return False
    state.best = {"metric": name, "value": value, "step": step}
    if step <= sec.save_best_after:
        return False
    src = Path(save())  # the regular step checkpoint, holding the new best in its state
    root = src.parent
    copy_best(src, root, state.best)
    log.info("validation: %s=%.4g at step %d is the best so far; saved %s", name, value, step, root / BEST_DIR)
    return True
