"""The benchmarks and scripts import only memrl names that exist.

They run outside the test suite (most need minutes, a GPU or a real model), so a name that moves or goes
away in memrl breaks them silently: benchmarks/lora.py imported `Row` from memrl.training.update.packing for
months after `Row` had gone. This reads their sources (ast, nothing imported, no torch): every
`from memrl.x import y` (at module level or inside a function), every `import memrl.x`, and every `M.attr`
where M names a memrl module, must find memrl/x.py (or memrl/x/) and y among the names that module defines at
its top (a def, a class, an assignment, an import, also inside a top-level if / try / with) or its submodule y.
"""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("benchmarks", "scripts")
"""The repository's folders of programs that import memrl but that no test imports."""


def module_file(root: Path, dotted: str) -> Path | None:
    """The source of module `dotted` (memrl.a.b) under `root` (the folder that holds memrl/), None if none."""
    base = root.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def _bound(stmts: list[ast.stmt]) -> set[str]:
    names: set[str] = set()

    def targets(t: ast.expr) -> None:
        if isinstance(t, ast.Name):
            names.add(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            for e in t.elts:
                targets(e)
        elif isinstance(t, ast.Starred):
            targets(t.value)

    for s in stmts:
        if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(s.name)
        elif isinstance(s, ast.Assign):
            for t in s.targets:
                targets(t)
        elif isinstance(s, (ast.AnnAssign, ast.AugAssign)):
            targets(s.target)
        elif isinstance(s, ast.Import):
            names.update(a.asname or a.name.split(".")[0] for a in s.names)
        elif isinstance(s, ast.ImportFrom):
            names.update(a.asname or a.name for a in s.names)
        elif isinstance(s, (ast.If, ast.For, ast.While)):
            names |= _bound(s.body) | _bound(s.orelse)
        elif isinstance(s, ast.With):
            names |= _bound(s.body)
        elif isinstance(s, ast.Try):
            names |= _bound(s.body) | _bound(s.orelse) | _bound(s.finalbody)
            for h in s.handlers:
                names |= _bound(h.body)
    return names


def top_level_names(path: Path) -> set[str]:
    """The names a module binds at its top (`*` when it star-imports: then any name may be there)."""
    return _bound(ast.parse(path.read_text(encoding="utf-8"), str(path)).body)


def missing_names(files: list[Path], root: Path, package: str = "memrl") -> list[str]:
    """`file:line: what is missing` for every import of `package` in `files` that does not resolve."""
    defined: dict[Path, set[str]] = {}

    def has(mod: str, name: str) -> bool:
        path = module_file(root, mod)
        if path is None:
            return False
        if path not in defined:
            defined[path] = top_level_names(path)
        return name in defined[path] or "*" in defined[path] or module_file(root, f"{mod}.{name}") is not None

    out = []
    for f in files:
        tree = ast.parse(f.read_text(encoding="utf-8"), str(f))
        rel = f.relative_to(root) if f.is_relative_to(root) else f
        modules: dict[str, str] = {}  # a local name -> the memrl module it names
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == package:
                if module_file(root, node.module) is None:
                    out.append(f"{rel}:{node.lineno}: no module {node.module}")
                    continue
                for a in node.names:
                    if not has(node.module, a.name):
                        out.append(f"{rel}:{node.lineno}: {node.module} has no {a.name}")
                    elif module_file(root, f"{node.module}.{a.name}") is not None:
                        modules[a.asname or a.name] = f"{node.module}.{a.name}"
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] != package:
                        continue
                    if module_file(root, a.name) is None:
                        out.append(f"{rel}:{node.lineno}: no module {a.name}")
                    elif a.asname:
                        modules[a.asname] = a.name
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
                mod = modules[node.value.id]
                if not has(mod, node.attr):
                    out.append(f"{rel}:{node.lineno}: {mod} has no {node.attr} ({node.value.id}.{node.attr})")
    return sorted(set(out))


def tool_files(root: Path) -> list[Path]:
    return sorted(p for d in TOOLS for p in (root / d).rglob("*.py"))


def test_benchmarks_and_scripts_import_only_names_memrl_has():
    files = tool_files(REPO)
    assert len(files) > 40 and REPO / "benchmarks" / "lora.py" in files
    bad = missing_names(files, REPO)
    assert not bad, "benchmarks / scripts import memrl names that do not exist:\n" + "\n".join(bad)


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_check_finds_a_missing_name_module_or_attribute_and_accepts_every_way_a_name_is_bound(tmp_path: Path):
    _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a.py": """\
            import os
            from pkg.sub import c as see
            X, (Y, *Z) = 1, (2, 3)
            T: int = 0
            try:
                import fast as accel
            except ImportError:
                accel = None
            if os.name:
                def f(): pass
            class K: pass
            """,
        "pkg/sub/__init__.py": "",
        "pkg/sub/c.py": "def g(): pass\n",
        "pkg/star.py": "from pkg.a import *\n",
        "bench/ok.py": """\
            import pkg.sub.c as C
            from pkg.a import X, Y, Z, T, accel, f, K, see, os
            from pkg import a as A, sub


            def run():
                from pkg.sub import c
                from pkg.star import anything
                return A.X, C.g, c.g, sub
            """,
        "bench/bad.py": """\
            import pkg.gone
            from pkg.a import Row, X
            from pkg.sub import c as C


            def run():
                from pkg.nope import y
                return C.h, C.g
            """,
    })
    assert top_level_names(tmp_path / "pkg" / "a.py") == {"os", "see", "X", "Y", "Z", "T", "accel", "f", "K"}
    assert missing_names([tmp_path / "bench" / "ok.py"], tmp_path, "pkg") == []
    assert missing_names([tmp_path / "bench" / "bad.py"], tmp_path, "pkg") == [
        "bench/bad.py:1: no module pkg.gone",
        "bench/bad.py:2: pkg.a has no Row",
        "bench/bad.py:7: no module pkg.nope",
        "bench/bad.py:8: pkg.sub.c has no h (C.h)",
    ]
