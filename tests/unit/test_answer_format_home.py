"""The multi-question answer format and its reward have one home, memrl.rewards.multiq: the FINAL_ANSWER
markers are assigned there only, and the search family reads them (and the reward) from there, not from
the MemAct workflow."""

from __future__ import annotations

import ast
from pathlib import Path

import memrl
from memrl.rewards import multiq
from memrl.workflows import get_workflow

ROOT = Path(memrl.__file__).parent


def marker_assignments(source: str) -> list[str]:
    """Module-level names assigned a string that starts with FINAL_ANSWER."""
    out = []
    for node in ast.parse(source).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and node.value.value.startswith("FINAL_ANSWER")):
            out += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return out


def test_the_markers_are_assigned_once():
    assert marker_assignments('A = "FINAL_ANSWER: "\nB = "x"\n') == ["A"]
    found = {p.relative_to(ROOT).as_posix(): names for p in sorted(ROOT.rglob("*.py"))
             if (names := marker_assignments(p.read_text(encoding="utf-8")))}
    assert found == {"rewards/multiq.py": ["MARKER", "PUBLISHED_MARKER"]}
    assert (multiq.MARKER, multiq.PUBLISHED_MARKER) == ("FINAL_ANSWER:", "FINAL_ANSWER: ")


def test_the_search_family_does_not_import_memact():
    for name in ("search_agent", "fold", "summarize", "sliding_window"):
        tree = ast.parse((ROOT / "workflows" / f"{name}.py").read_text(encoding="utf-8"))
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert "memrl.workflows.memact" not in imported, name
    for name in ("memact", "summarize", "sliding_window"):
        assert get_workflow(name).reward is multiq.outcome_reward, name
