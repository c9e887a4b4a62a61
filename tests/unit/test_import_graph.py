"""Dependencies run one way: memrl's modules import each other without cycles, each module imports alone,
and the installed package holds no test doubles (they live in tests/doubles.py and tests/doubles_chat.py).

The graph counts every import of a memrl module wherever it is written: at module level, inside a
function, and `importlib.import_module("memrl....")` with a constant name. `from memrl.x import y` is
an edge to memrl.x.y when y is a submodule, else to memrl.x. (The implicit import of a module's parent
packages is not an edge: a package importing its own submodules is no cycle.)
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

import memrl

ROOT = Path(memrl.__file__).parent

TEST_DOUBLES = ("doubles", "doubles_chat")
"""The test doubles' modules, in tests/ (pyproject's pytest pythonpath): outside the installed package."""

OPTIONAL_EXTRAS = ("vllm", "ray", "wandb", "mlflow", "fastapi", "uvicorn", "sentence_transformers", "faiss",
                   "playwright")
"""Top-level packages of the optional extras (pyproject's optional-dependencies): a module that needs one
that is not installed is skipped by the import-alone check, and named."""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    file: str
    line: int
    text: str

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


def package_modules(root: Path, package: str) -> dict[str, Path]:
    """{dotted module name: file} for every .py file under `root` (the package directory of `package`)."""
    mods = {}
    for p in sorted(root.rglob("*.py")):
        parts = [package, *p.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        mods[".".join(parts)] = p
    return mods


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            pkg = module.split(".") if is_package else module.split(".")[:-1]
            pkg = pkg[: len(pkg) - (node.level - 1)]
            base = ".".join(pkg + ([base] if base else []))
        return [f"{base}.{a.name}" for a in node.names] or [base]
    if isinstance(node, ast.Call):
        fn = node.func
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
        if name == "import_module" and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            return [node.args[0].value]
    return []


def import_edges(mods: dict[str, Path], package: str) -> list[Edge]:
    """Every import of a module of `mods` by another, with the file and line that makes it."""
    edges = []
    for mod, path in mods.items():
        source = path.read_text(encoding="utf-8")
        lines = source.splitlines()
        for node in ast.walk(ast.parse(source, str(path))):
            targets = set()
            for name in _imported_names(node, mod, path.name == "__init__.py"):
                if name != package and not name.startswith(package + "."):
                    continue
                while name not in mods and "." in name:  # `from pkg.mod import attr`: the module pkg.mod
                    name = name.rsplit(".", 1)[0]
                if name in mods and name != mod:
                    targets.add(name)
            rel = path.relative_to(ROOT.parent) if path.is_relative_to(ROOT.parent) else path
            edges += [Edge(mod, t, str(rel), node.lineno, lines[node.lineno - 1].strip()) for t in sorted(targets)]
    return edges


def cycles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted, in name order."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        graph.setdefault(e.src, set()).add(e.dst)
        graph.setdefault(e.dst, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth <= number of modules
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _one_cycle(comp: list[str], edges: list[Edge]) -> list[str]:
    """A shortest closed path through the component's first module: [a, b, ..., a]."""
    inside = set(comp)
    nxt: dict[str, list[str]] = {}
    for e in edges:
        if e.src in inside and e.dst in inside:
            nxt.setdefault(e.src, []).append(e.dst)
    start = comp[0]
    paths = {w: [start, w] for w in sorted(set(nxt.get(start, [])))}
    queue = list(paths)
    while queue and start not in paths:
        v = queue.pop(0)
        for w in sorted(set(nxt.get(v, []))):
            if w not in paths:
                paths[w] = paths[v] + [w]
                queue.append(w)
    return paths[start]


def describe(comps: list[list[str]], edges: list[Edge], kind: str = "modules") -> str:
    """Each cycle as `a -> b -> a`, then every import inside its component with its file:line. `kind`: what the
    graph's nodes are (modules, folders)."""
    out = []
    for comp in comps:
        inside = set(comp)
        out.append(f"import cycle among {len(comp)} {kind}: {' -> '.join(_one_cycle(comp, edges))}")
        for e in sorted((e for e in edges if e.src in inside and e.dst in inside),
                        key=lambda e: (e.src, e.dst, e.line)):
            out.append(f"    {e.src} -> {e.dst}   {e.where()}")
    return "\n".join(out)


def memrl_edges() -> tuple[dict[str, Path], list[Edge]]:
    mods = package_modules(ROOT, "memrl")
    return mods, import_edges(mods, "memrl")


def test_memrl_has_no_import_cycle():
    _, edges = memrl_edges()
    comps = cycles(edges)
    assert not comps, "memrl's imports must run one way (import a shared base module instead):\n" + \
        describe(comps, edges)


def folder_of(module: str, package: str) -> str | None:
    """The folder of `package` that holds `module` (memrl.training.ranks.workers -> memrl.training.ranks), None
    for a module at the package's top (memrl.training.config) or outside it."""
    parts = module.split(".")
    top = package.split(".")
    if parts[: len(top)] != top or len(parts) < len(top) + 2:
        return None
    return ".".join(parts[: len(top) + 1])


def folder_edges(edges: list[Edge], package: str) -> list[Edge]:
    """The imports from one folder of `package` into another, as edges between the folders (file and line
    kept). An import of a module at the package's top (memrl.training.config, the shared base) is none."""
    out = []
    for e in edges:
        a, b = folder_of(e.src, package), folder_of(e.dst, package)
        if a and b and a != b:
            out.append(Edge(a, b, e.file, e.line, e.text))
    return out


def packages_with_folders(mods: dict[str, Path], package: str) -> list[str]:
    """The packages inside `package` that hold folders (packages) of their own: memrl.training (step/, update/,
    ranks/, ...). `package`'s own folders are memrl's layers (tests/unit/test_layers.py)."""
    return sorted({m.rsplit(".", 1)[0] for m, p in mods.items()
                   if p.name == "__init__.py" and m.startswith(package + ".") and m.count(".") > package.count(".") + 1})


def test_the_folders_of_a_package_import_each_other_without_a_circle():
    """memrl.training's folders (step/, update/, ranks/, sync/, checkpoints/, monitor/) are parts: one imports
    another only one way round, also through a third (ranks/ -> sync/ -> ranks/ is a circle even when no two
    modules form one)."""
    mods, edges = memrl_edges()
    assert "memrl.training" in packages_with_folders(mods, "memrl")
    bad = []
    for package in packages_with_folders(mods, "memrl"):
        between = folder_edges(edges, package)
        comps = cycles(between)
        if comps:
            bad.append(describe(comps, between, "folders"))
    assert not bad, "a package's folders import each other in a circle (move the shared piece):\n" + "\n".join(bad)


def test_the_installed_package_holds_no_test_doubles():
    """The doubles are in tests/, nothing in memrl imports them, and memrl has no testing module."""
    mods, _ = memrl_edges()
    assert not [m for m in mods if m.rsplit(".", 1)[-1].startswith("testing")]
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            bad += [f"{path.relative_to(ROOT.parent)}:{node.lineno} imports {n}" for n in names
                    if n.split(".")[0] in TEST_DOUBLES]
    assert not bad, "production code imports a test double:\n" + "\n".join(bad)
    for name in TEST_DOUBLES:
        assert (Path(__file__).resolve().parents[1] / f"{name}.py").is_file()


def test_the_keyword_retriever_kind_is_the_services_one(tmp_path: Path):
    from memrl.services.keyword import KeywordRetriever
    from memrl.tools.search import build_retriever

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d1", "title": "Paris", "text": "Paris is in France."}) + "\n")
    r = build_retriever("keyword", str(corpus), None)
    assert type(r) is KeywordRetriever and [d.id for d in r.documents] == ["d1"]
    assert not hasattr(r, "calls")  # the production retriever keeps nothing per call


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text), encoding="utf-8")


def test_the_walker_sees_imports_in_functions_import_module_submodules_and_relative_imports(tmp_path: Path):
    pkg = tmp_path / "pkg"
    _write(pkg, {
        "__init__.py": "",
        "a.py": "import os\n\n\ndef f():\n    from pkg import b\n    return b\n",
        "b.py": "import importlib\n\nM = importlib.import_module('pkg.sub.c')\n",
        "sub/__init__.py": "",
        "sub/c.py": "from .. import a  # relative, two levels\n",
        "sub/d.py": "from pkg.sub.c import NAME\nfrom . import c\n",
        "e.py": "from pkg.sub import d\nimport logging\nlog = logging.getLogger('pkg.a')\n",
    })
    mods = package_modules(pkg, "pkg")
    assert sorted(mods) == ["pkg", "pkg.a", "pkg.b", "pkg.e", "pkg.sub", "pkg.sub.c", "pkg.sub.d"]
    edges = import_edges(mods, "pkg")
    assert sorted((e.src, e.dst, e.line) for e in edges) == [
        ("pkg.a", "pkg.b", 5), ("pkg.b", "pkg.sub.c", 3), ("pkg.e", "pkg.sub.d", 1),
        ("pkg.sub.c", "pkg.a", 1), ("pkg.sub.d", "pkg.sub.c", 1), ("pkg.sub.d", "pkg.sub.c", 2),
    ]
    comps = cycles(edges)
    assert comps == [["pkg.a", "pkg.b", "pkg.sub.c"]]
    text = describe(comps, edges)
    assert text.splitlines()[0] == "import cycle among 3 modules: pkg.a -> pkg.b -> pkg.sub.c -> pkg.a"
    assert f"    pkg.a -> pkg.b   {pkg / 'a.py'}:5: from pkg import b" in text
    assert f"    pkg.sub.c -> pkg.a   {pkg / 'sub' / 'c.py'}:1: from .. import a  # relative, two levels" in text
    assert "pkg.sub.d" not in text


def test_folder_edges_fold_modules_into_their_folders_and_find_a_circle_of_folders(tmp_path: Path):
    pkg = tmp_path / "pkg"
    _write(pkg, {
        "__init__.py": "",
        "base.py": "X = 1\n",
        "a/__init__.py": "",
        "a/x.py": "from pkg import base\nfrom pkg.a import y\n",
        "a/y.py": "from pkg.b import z\n",
        "b/__init__.py": "",
        "b/z.py": "from pkg import base\n",
        "b/w.py": "from pkg.a.x import NAME\n",
    })
    mods = package_modules(pkg, "pkg")
    edges = import_edges(mods, "pkg")
    assert cycles(edges) == []  # no module-level circle: x -> y -> z -> base, w -> x -> base
    assert packages_with_folders(mods, "pkg") == []  # pkg's own folders are the layers' business
    between = folder_edges(edges, "pkg")
    assert sorted((e.src, e.dst, e.line) for e in between) == [("pkg.a", "pkg.b", 1), ("pkg.b", "pkg.a", 1)]
    comps = cycles(between)
    assert comps == [["pkg.a", "pkg.b"]]
    text = describe(comps, between, "folders")
    assert text.splitlines()[0] == "import cycle among 2 folders: pkg.a -> pkg.b -> pkg.a"
    assert f"    pkg.b -> pkg.a   {pkg / 'b' / 'w.py'}:1: from pkg.a.x import NAME" in text
    (pkg / "b" / "w.py").write_text("from pkg import base\n", encoding="utf-8")
    assert cycles(folder_edges(import_edges(package_modules(pkg, "pkg"), "pkg"), "pkg")) == []


def test_two_separate_cycles_are_both_reported():
    edges = [Edge("m.a", "m.b", "a.py", 1, ""), Edge("m.b", "m.a", "b.py", 2, ""),
             Edge("m.c", "m.d", "c.py", 3, ""), Edge("m.d", "m.e", "d.py", 4, ""), Edge("m.e", "m.c", "e.py", 5, ""),
             Edge("m.e", "m.a", "e.py", 6, "")]
    assert cycles(edges) == [["m.a", "m.b"], ["m.c", "m.d", "m.e"]]


# ------------------------------------------------------------------------------------------ import alone
_ALONE = r"""
import importlib, json, os, sys, traceback
heavy = json.loads(sys.argv[1])
for name in heavy:  # shared by every child: imported once, before any memrl module
    try:
        importlib.import_module(name)
    except ImportError:
        pass
assert not [m for m in sys.modules if m == "memrl" or m.startswith("memrl.")], "the parent imported memrl"
results = {}
for mod in json.loads(sys.argv[2]):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code, msg = 0, ""
        try:
            importlib.import_module(mod)
        except BaseException as e:  # noqa: BLE001 - report whatever stops the import
            missing = getattr(e, "name", None) if isinstance(e, ModuleNotFoundError) else None
            code = 1
            msg = json.dumps({"missing": missing, "error": "".join(traceback.format_exception_only(e)).strip(),
                              "where": traceback.format_exc().strip().splitlines()[-3:]})
        os.write(w, msg.encode())
        os.close(w)
        os._exit(code)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.close(r)
    _, status = os.waitpid(pid, 0)
    results[mod] = {"status": os.waitstatus_to_exitcode(status), **(json.loads(b"".join(chunks)) if chunks else {})}
print(json.dumps(results))
"""


def import_alone(mods: list[str], heavy: list[str], cwd: Path) -> dict[str, dict]:
    """{module: {"status": exit code, "missing": a missing module's name, "error": ...}}: each module imported
    in a fork of one process that imported only `heavy` (third-party packages shared by all)."""
    proc = subprocess.run([sys.executable, "-c", _ALONE, json.dumps(heavy), json.dumps(mods)],
                          capture_output=True, text=True, timeout=900, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sort_out(results: dict[str, dict]) -> tuple[dict[str, str], dict[str, str]]:
    """(modules skipped for a missing optional extra -> the extra, modules that failed -> why)."""
    skipped, failed = {}, {}
    for mod, r in sorted(results.items()):
        if r["status"] == 0:
            continue
        missing = (r.get("missing") or "").split(".")[0]
        if missing in OPTIONAL_EXTRAS:
            skipped[mod] = missing
        else:
            failed[mod] = f"exit {r['status']}: {r.get('error', '')} ({' | '.join(r.get('where', []))})"
    return skipped, failed


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_every_module_imports_alone():
    """Each module imported in a fresh process (a fork of one that imported only torch, transformers and
    the like) succeeds; a module that needs an optional extra that is not installed is skipped and named."""
    mods = sorted(package_modules(ROOT, "memrl"))
    results = import_alone(mods, ["torch", "transformers", "numpy", "omegaconf", "yaml", "httpx"], ROOT.parent)
    assert sorted(results) == mods
    skipped, failed = sort_out(results)
    if skipped:
        print("modules skipped (optional extra not installed): " +
              ", ".join(f"{m} ({x})" for m, x in skipped.items()))
    assert not failed, "modules that do not import alone:\n" + "\n".join(f"    {m}: {e}" for m, e in failed.items())


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_import_alone_reports_a_failing_module_and_skips_a_missing_extra(tmp_path: Path):
    _write(tmp_path / "pkg", {
        "__init__.py": "",
        "ok.py": "import json\n",
        "bad.py": "raise RuntimeError('broken at import')\n",
        "gpu.py": "import vllm.engine.no_such_module_here\n",
        "needs_bad.py": "from pkg import bad\n",
    })
    results = import_alone(["pkg.ok", "pkg.bad", "pkg.gpu", "pkg.needs_bad"], ["json"], tmp_path)
    assert {m: r["status"] for m, r in results.items()} == {"pkg.ok": 0, "pkg.bad": 1, "pkg.gpu": 1,
                                                          "pkg.needs_bad": 1}
    skipped, failed = sort_out(results)
    assert skipped == {"pkg.gpu": "vllm"}
    assert sorted(failed) == ["pkg.bad", "pkg.needs_bad"]
    assert failed["pkg.bad"].startswith("exit 1: RuntimeError: broken at import (")
