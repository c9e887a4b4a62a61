"""memrl's packages in layers: a module imports only from its own layer or the layers below it, never
upward, and two packages never import each other (within a row only one of the two may import the other).

Imports are counted wherever they are written (module level, inside functions, relative imports,
`importlib.import_module("memrl....")` with a constant name): the graph of tests/unit/test_import_graph.py.
Every package and top-level module of memrl has a layer: a new one fails until it is placed here.
"""

from __future__ import annotations

from pathlib import Path

from test_import_graph import Edge, import_edges, memrl_edges, package_modules

LAYERS: list[tuple[str, ...]] = [
    # top: the command line, and the generator of its reference pages
    ("cli", "commands", "docs_gen"),
    # recipes: the recipe pipeline (memrl demo), scratch models, cold starts, scripted demonstrators
    ("recipes", "demonstrators"),
    # trainer and workers; evaluator and reports; viewer; model init/convert
    ("training", "eval", "viewer", "models"),
    # one per run: event loop, engine, services
    ("runtime",),
    ("workflows",),
    ("tools",),
    ("services", "rewards"),
    ("data", "engines", "algorithms"),
    # the data model and config machinery; "memrl" is the package's own __init__ (__version__)
    ("config", "types", "errors", "dcp_metadata", "downloads", "locks", "model_files", "model_open", "plugins", "precision", "quiet", "records",
     "tcpstore", "threads", "memrl"),
]
"""Top to bottom. A package (memrl/x/) or top-level module (memrl/x.py) is named by x."""


def unit_of(module: str) -> str:
    """memrl.x.y -> x; the package itself (memrl) -> memrl."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def layer_index(layers: list[tuple[str, ...]]) -> dict[str, int]:
    """{unit: its row, 0 = top}."""
    return {u: i for i, row in enumerate(layers) for u in row}


def unplaced(mods: dict[str, Path], layers: list[tuple[str, ...]]) -> list[str]:
    """The packages and top-level modules that have no layer (each with one of its files)."""
    index = layer_index(layers)
    out: dict[str, str] = {}
    for mod, path in sorted(mods.items()):
        if unit_of(mod) not in index:
            out.setdefault(unit_of(mod), f"{unit_of(mod)} ({path})")
    return sorted(out.values())


def upward(edges: list[Edge], layers: list[tuple[str, ...]]) -> list[str]:
    """Each import from a lower layer to a higher one: `file:line: text  (src row -> dst row)`."""
    index = layer_index(layers)
    out = []
    for e in sorted(edges, key=lambda e: (e.file, e.line, e.dst)):
        a, b = unit_of(e.src), unit_of(e.dst)
        if a != b and a in index and b in index and index[b] < index[a]:
            out.append(f"{e.where()}   ({a}, layer {index[a]} imports {b}, layer {index[b]})")
    return out


def two_way(edges: list[Edge]) -> list[str]:
    """Each pair of packages that import each other, with every import that makes the pair."""
    between: dict[tuple[str, str], list[Edge]] = {}
    for e in edges:
        a, b = unit_of(e.src), unit_of(e.dst)
        if a != b:
            between.setdefault((a, b), []).append(e)
    out = []
    for (a, b), es in sorted(between.items()):
        if a < b and (b, a) in between:
            out.append(f"{a} and {b} import each other:")
            out += [f"    {a} -> {b}   {e.where()}" for e in sorted(es, key=lambda e: (e.file, e.line))]
            out += [f"    {b} -> {a}   {e.where()}" for e in sorted(between[(b, a)], key=lambda e: (e.file, e.line))]
    return out


def test_the_layers_name_each_unit_once():
    units = [u for row in LAYERS for u in row]
    assert len(units) == len(set(units)), "a package is in two layers"


def test_every_package_and_top_level_module_has_a_layer():
    mods, _ = memrl_edges()
    missing = unplaced(mods, LAYERS)
    assert not missing, "place these in LAYERS (tests/unit/test_layers.py):\n    " + "\n    ".join(missing)
    stale = sorted(set(layer_index(LAYERS)) - {unit_of(m) for m in mods})
    assert not stale, f"LAYERS names packages that do not exist: {stale}"


def test_no_import_runs_upward():
    _, edges = memrl_edges()
    bad = upward(edges, LAYERS)
    assert not bad, ("imports from a lower layer to a higher one (move the piece down to the layer that "
                     "uses it, or pass it in):\n" + "\n".join(bad))


def test_no_two_packages_import_each_other():
    _, edges = memrl_edges()
    bad = two_way(edges)
    assert not bad, "packages import each other (one of the two must not):\n" + "\n".join(bad)


def test_the_checks_name_the_file_and_line(tmp_path: Path):
    pkg = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "top.py": "X = 1\n",
        "low/__init__.py": "",
        "low/base.py": "X = 1\n\n\ndef f():\n    from pkg import top  # upward, in a function\n    return top\n",
        "low/other.py": "import importlib\n\nM = importlib.import_module('pkg.peer.b')\n",
        "peer/__init__.py": "",
        "peer/b.py": "from ..low import other\n",
        "new.py": "",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text, encoding="utf-8")
    mods = package_modules(pkg, "pkg")
    edges = import_edges(mods, "pkg")
    layers = [("top",), ("low", "peer", "pkg")]
    assert unplaced(mods, layers) == [f"new ({pkg / 'new.py'})"]
    assert upward(edges, layers) == [
        f"{pkg / 'low' / 'base.py'}:5: from pkg import top  # upward, in a function   (low, layer 1 imports top, layer 0)"]
    assert two_way(edges) == [
        "low and peer import each other:",
        f"    low -> peer   {pkg / 'low' / 'other.py'}:3: M = importlib.import_module('pkg.peer.b')",
        f"    peer -> low   {pkg / 'peer' / 'b.py'}:1: from ..low import other",
    ]
