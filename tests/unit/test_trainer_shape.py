"""The shape the redesign set, kept from drifting back: the driver loop stays short, its step reads as the
arrow (no timing or metric bookkeeping in it), and event loops are started only at the command line
(every rollout runs on a memrl.runtime.RolloutRuntime)."""

from __future__ import annotations

import ast
from pathlib import Path

import memrl

ROOT = Path(memrl.__file__).parent
TRAINER = ROOT / "training" / "trainer.py"


def _method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef:
    (klass,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    (fn,) = [n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return fn


def test_trainer_module_is_at_most_350_lines():
    assert len(TRAINER.read_text(encoding="utf-8").splitlines()) <= 350


def test_train_step_is_the_flow_only():
    fn = _method(ast.parse(TRAINER.read_text(encoding="utf-8")), "Trainer", "train_step")
    assert fn.end_lineno - fn.lineno + 1 <= 20
    called = {ast.unparse(n.func) for n in ast.walk(fn) if isinstance(n, ast.Call)}
    timing = {c for c in called if c.startswith("time.") or c.endswith(("perf_counter", "monotonic"))}
    assert not timing, f"timing calls in train_step: {sorted(timing)} (the StageTimer times the stages)"


def test_event_loops_start_only_at_the_command_line():
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel == "cli.py" or rel.startswith("commands/"):
            continue
        for n in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(n, ast.Call) and ast.unparse(n.func) == "asyncio.run":
                found.append(f"memrl/{rel}:{n.lineno}")
    assert not found, f"asyncio.run outside the command line (use a RolloutRuntime): {found}"
