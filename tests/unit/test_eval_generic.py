"""memrl/eval is the generic evaluation layer: its code names no workflow. A workflow's own report table
(ReportSection), whether `memrl ask` runs it (`ask`) and the segment field its recall query is in
(`recall_key`) are declared on its WorkflowSpec, and memrl/eval reads them from there.

Code only: string literals and identifiers outside docstrings and comments. Docstrings may name a workflow
as an example (EvalConfig's fields are documented with `workflow=memagent` and the full_context baseline,
and memrl.docs_gen renders those docstrings into the reference); a switch on a name is code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import memrl
from memrl.workflows import workflow_names

EVAL_DIR = Path(memrl.__file__).parent / "eval"

ALLOWED = {("report.py", "summarize", "summarize")}
"""(file, identifier, workflow name) pairs that are not a workflow's name: report.summarize (a run's rows
by length) shares its word with the `summarize` workflow."""


def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
        else:
            continue
        for i, stmt in enumerate(body):  # the first statement, and attribute docstrings after an assignment
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                    and isinstance(stmt.value.value, str) \
                    and (i == 0 or isinstance(body[i - 1], (ast.Assign, ast.AnnAssign))):
                ids.add(id(stmt.value))
    return ids


def _words(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.keyword):
        return [node.arg or ""]
    return []


def workflow_mentions(path: Path, names: list[str]) -> list[str]:
    """`file:line: name in 'text'` for each workflow name in the code of `path` (a whole word, `_` and
    non-letters separating words)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skip = _docstrings(tree)
    pats = {n: re.compile(rf"(?<![a-z0-9]){re.escape(n.lower())}(?![a-z0-9])") for n in names}
    hits = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        for text in _words(node):
            for n, pat in pats.items():
                if pat.search(text.lower()) and (path.name, text, n) not in ALLOWED:
                    hits.append(f"memrl/eval/{path.name}:{getattr(node, 'lineno', 0)}: {n} in {text!r}")
    return sorted(set(hits), key=lambda h: (h.split(":")[0], int(h.split(":")[1])))


def test_eval_names_no_workflow():
    names = workflow_names()
    assert {"memagent", "memact", "rememr1"} <= set(names)
    hits = [h for p in sorted(EVAL_DIR.glob("*.py")) for h in workflow_mentions(p, names)]
    assert not hits, "memrl/eval names a workflow (declare it on the WorkflowSpec instead):\n" + "\n".join(hits)


def test_the_scan_finds_a_name(tmp_path):
    p = tmp_path / "x.py"
    p.write_text('"""memagent in a docstring is fine."""\nif workflow == "rememr1":\n    is_memact = 1\n'
                 '# memact in a comment\nf"{x}_full_context.csv"\n')
    assert workflow_mentions(p, ["memagent", "rememr1", "memact", "full_context"]) == [
        "memrl/eval/x.py:2: rememr1 in 'rememr1'", "memrl/eval/x.py:3: memact in 'is_memact'",
        "memrl/eval/x.py:5: full_context in '_full_context.csv'"]


def test_what_the_workflows_declare():
    from memrl.eval.ask import ASK_WORKFLOWS
    from memrl.workflows import get_workflow, report_sections
    from memrl.workflows.memact_report import REPORT

    assert ASK_WORKFLOWS == ("memagent", "rememr1")  # memrl ask's --workflow choices, unchanged
    assert get_workflow("rememr1").recall_key == "recall_query" and get_workflow("memagent").recall_key is None
    assert report_sections() == (REPORT,) and get_workflow("memact").report is REPORT
