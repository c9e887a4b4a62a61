"""Experiment trackers beside metrics.jsonl (`trainer.loggers`): Weights & Biases in offline mode and
MLflow on a local store, both under the run's out_dir, so nothing needs a network.

- wandb: `wandb.init(mode="offline", dir=<out_dir>)`; the run lives in <out_dir>/wandb/offline-run-*/
  (`wandb sync` uploads it later). A resumed run passes the saved id with resume="must".
- mlflow: an MlflowClient on `file:<out_dir>/mlruns` (or `trainer.mlflow_uri`), experiment "memrl"; a
  resumed run logs into the saved run id. MLflow 3 keeps its file store behind MLFLOW_ALLOW_FILE_STORE,
  which memrl sets (unless already set) for a file: URI.

The URI, a WANDB_RUN_ID and the saved run ids are checked before the run (one-line UserError naming
the setting or id); a tracker that fails mid-run is dropped by MetricsLogger with a warning, never the run.
The run ids are kept in every checkpoint's trainer state (`trackers`), so `--resume` continues the
same tracker runs; steps a resume redoes are logged again (the trackers keep both values).
Trajectory samples (the rows trajectories.jsonl gets at dump steps) go to a wandb.Table /
an mlflow JSON artifact `trajectories/step_<k>.json`.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import httpx

from memrl.config import redact_argv, redact_secrets, redact_text
from memrl.errors import UserError

log = logging.getLogger(__name__)

TRACKERS = ("jsonl", "tensorboard", "wandb", "mlflow")
TABLE_COLUMNS = ("step", "task_id", "trajectory_id", "question", "answers", "prediction", "reward", "model_calls")


def _import(module: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"trainer.loggers names {module.split('.')[0]} but it is not installed ({e}); "
                        "pip install 'memrl[track]'") from e


def check_installed(names: list[str]) -> None:
    """The packages of the trackers `names` asks for import (a one-line UserError naming the extra if not)."""
    for n, module in (("wandb", "wandb"), ("mlflow", "mlflow.tracking")):
        if n in names:
            _import(module)


MLFLOW_SCHEMES = ("file", "sqlite", "postgresql", "mysql", "mssql", "http", "https", "databricks")
"""Tracking-store URI schemes mlflow serves (a database scheme may name its driver: postgresql+psycopg2)."""
WANDB_ID_FORBIDDEN = ":;,#?/\\'% "
"""Characters wandb refuses in a run id (its own rule is :;,#?/' ; '%', '\\' and space break its paths)."""


MLFLOW_PROBE_S = 5.0
"""How long a tracking server (http/https) has to answer before the run: mlflow's own client retries a dead
server with back-off for minutes."""
MLFLOW_HTTP_BOUNDS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}
"""mlflow's retries and per-request timeout for a tracking server during the run (defaults: 7 retries with
back-off, 120 s each), set unless the environment sets them: a server that dies mid-run costs a minute or two
per call, not a quarter of an hour."""


def mlflow_uri_problem(uri: str) -> str | None:
    """What is wrong with an mlflow tracking URI before any work, or None: an unknown scheme, a file store
    that is a file, a sqlite store that is a directory or lacks sqlalchemy, a tracking server (http, https)
    that does not answer within MLFLOW_PROBE_S."""
    if not uri:
        return None
    parsed = urlparse(uri)
    scheme = parsed.scheme.split("+")[0].lower() if len(parsed.scheme) > 1 else ""  # "C:" is a drive
    if scheme and scheme not in MLFLOW_SCHEMES:
        local = ("sqlite:///<out_dir>/mlflow.db, or a directory path" if importlib.util.find_spec("sqlalchemy")
                 else "a directory path; sqlite:/// would need sqlalchemy, which is not installed")
        return (f"scheme {parsed.scheme!r} is not a tracking store mlflow serves ({', '.join(MLFLOW_SCHEMES)}; "
                f"a local one: {local})")
    if scheme in ("", "file"):
        path = Path(parsed.path if scheme else uri)
        blocker = next((q for q in (path, *path.parents) if q.exists() and not q.is_dir()), None)
        if blocker is not None:
            return f"{blocker} is a file; mlflow's file store is a directory of experiments"
    if scheme == "sqlite":
        if importlib.util.find_spec("sqlalchemy") is None:
            return ("mlflow's database stores need sqlalchemy, which mlflow-skinny does not install "
                    "(pip install sqlalchemy)")
        path = Path(uri.split("///", 1)[1]) if "///" in uri else None
        if path is not None and path.is_dir():
            return f"{path} is a directory; a sqlite store is a database file"
    if scheme in ("http", "https"):
        try:  # any answer but a gateway's (even 404) is a server; mlflow serves /health
            status = httpx.get(uri.rstrip("/") + "/health", timeout=MLFLOW_PROBE_S).status_code
            why = f"HTTP {status} from a gateway" if status in (502, 503, 504) else None
        except httpx.HTTPError as e:
            why = f"{type(e).__name__}: {redact_text(str(e)) or 'no detail'}"
        if why:
            return (f"the tracking server does not answer within {MLFLOW_PROBE_S:g} s ({why}); start it, or log "
                    "to a local store (a directory path)")
    return None


def wandb_id_problem(run_id: str) -> str | None:
    """What is wrong with a wandb run id, or None."""
    bad = sorted({c for c in run_id if c in WANDB_ID_FORBIDDEN or not c.isprintable()})
    if not run_id or bad:
        return (f"not a wandb run id: it may not be empty or hold any of {WANDB_ID_FORBIDDEN.strip()!r} or space"
                f"{' (it holds ' + repr(''.join(bad)) + ')' if bad else ''}")
    return None


def _why(e: BaseException) -> str:
    """'Type: first line' of a tracker library's error, with the file a YAML parser names."""
    text = str(e).strip()
    first = (text.splitlines() or [""])[0].strip()
    where = re.search(r'in "([^"]+)", line (\d+)', text)
    if where and where.group(1) not in first:
        first += f" (in {where.group(1)}, line {where.group(2)})"
    return f"{type(e).__name__}: {first[:300]}" if first else type(e).__name__


def _finite(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))}


def _table_rows(rows: list[dict[str, Any]]) -> list[list[Any]]:
    return [[r.get("step"), r.get("task_id"), r.get("trajectory_id"), r.get("question"),
             json.dumps(r.get("answers", []), ensure_ascii=False), r.get("prediction"),
             r.get("reward"), r.get("model_calls")] for r in rows]


class WandbTracker:
    name = "wandb"

    def __init__(self, out: Path, run_id: str | None, config: dict[str, Any], run_name: str) -> None:
        wandb = _import("wandb")
        self._wandb = wandb
        kw: dict[str, Any] = {"id": run_id, "resume": "must"} if run_id else {}
        argv = sys.argv
        sys.argv = redact_argv(argv)  # wandb saves the command line in the run's metadata: no api key there
        try:
            self.run = wandb.init(project="memrl", name=run_name, dir=str(out), mode="offline",
                                  config=redact_secrets(config),
                                  settings=wandb.Settings(silent=True, console="off", x_disable_stats=True), **kw)
        finally:
            sys.argv = argv
        self.run_id = self.run.id

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(_finite(metrics), step=step)

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        t = self._wandb.Table(columns=list(TABLE_COLUMNS), data=_table_rows(rows))
        self.run.log({"trajectories": t}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, out: Path, run_id: str | None, uri: str, config_yaml: str, run_name: str) -> None:
        tracking = _import("mlflow.tracking")
        self._entities = _import("mlflow.entities")
        uri = uri or f"file:{(out / 'mlruns').resolve()}"
        if uri.startswith(("http:", "https:")):
            for k, v in MLFLOW_HTTP_BOUNDS.items():
                os.environ.setdefault(k, v)
        if uri.startswith("file:"):
            # MLflow 3 refuses its file store unless this is set (the database stores need sqlalchemy,
            # which mlflow-skinny does not pull in); the store still works and needs no server
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = tracking.MlflowClient(tracking_uri=uri)
        if run_id:
            self.client.get_run(run_id)  # a missing run fails here, naming the id
            self.client.update_run(run_id, status="RUNNING")
        else:
            exp = self.client.get_experiment_by_name("memrl")
            exp_id = exp.experiment_id if exp is not None else self.client.create_experiment("memrl")
            run_id = self.client.create_run(exp_id, run_name=run_name).info.run_id
            self.client.log_text(run_id, redact_text(config_yaml), "config.yaml")
        self.run_id = run_id

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        now = int(time.time() * 1000)
        ms = [self._entities.Metric(k, v, now, step) for k, v in _finite(metrics).items()]
        for i in range(0, len(ms), 1000):  # log_batch takes at most 1000 metrics
            self.client.log_batch(self.run_id, metrics=ms[i:i + 1000])

    def table(self, step: int, rows: list[dict[str, Any]]) -> None:
        data = {"columns": list(TABLE_COLUMNS), "data": _table_rows(rows)}
        self.client.log_text(self.run_id, json.dumps(data, ensure_ascii=False, default=str),
                             f"trajectories/step_{step}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def open_trackers(names: list[str], out: str | os.PathLike, ids: dict[str, str], config: dict[str, Any],
                  config_yaml: str, mlflow_uri: str = "") -> list[Any]:
    """The trackers `names` asks for beyond jsonl / tensorboard (which MetricsLogger writes itself),
    continuing the runs `ids` names (from the checkpoint state)."""
    out = Path(out)
    run_name = out.resolve().name
    made: list[Any] = []
    try:
        for n in names:
            if n == "wandb":
                made.append(_open_wandb(out, ids.get("wandb"), config, run_name))
            elif n == "mlflow":
                made.append(_open_mlflow(out, ids.get("mlflow"), mlflow_uri, config_yaml, run_name))
    except BaseException:
        for t in made:
            t.close()
        raise
    return made


def _open_wandb(out: Path, run_id: str | None, config: dict[str, Any], run_name: str) -> WandbTracker:
    if run_id is not None:
        problem = wandb_id_problem(str(run_id))
        if problem:
            raise UserError(f"the wandb run id {run_id!r} this run's checkpoint continues (trainer state "
                            f"trackers.wandb) is {problem}")
    try:
        return WandbTracker(out, run_id, config, run_name)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - wandb's UsageError / CommError / OSError
        what = f"cannot continue run {run_id!r} (trainer state trackers.wandb)" if run_id else "cannot start a run"
        raise UserError(f"trainer.loggers wandb: {what} in {out / 'wandb'}: {_why(e)}") from e


def _open_mlflow(out: Path, run_id: str | None, uri: str, config_yaml: str, run_name: str) -> MlflowTracker:
    key = f"trainer.mlflow_uri={uri}" if uri else f"the mlflow store file:{(out / 'mlruns').resolve()}"
    problem = mlflow_uri_problem(uri)
    if problem:
        raise UserError(f"{key}: {problem}")
    try:
        return MlflowTracker(out, run_id, uri, config_yaml, run_name)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - MlflowException, yaml errors of a damaged store, OSError
        if run_id and "not found" in str(e):
            raise UserError(f"{key}: the mlflow run {run_id} this run's checkpoint continues (trainer state "
                            "trackers.mlflow) is not in the store; restore the store, or resume without mlflow in "
                            "trainer.loggers") from e
        raise UserError(f"{key}: mlflow cannot use the store ({_why(e)})") from e
