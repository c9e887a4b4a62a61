"""`memrl` starts at once: `memrl --version`, `memrl --help`, `memrl data show FILE` and `memrl data build` on a
small file import neither torch nor transformers (issue 79: they took 12-21 s on a loaded 2-core machine
because the parser imported every command's module). Each runs in a fresh interpreter through memrl.cli.main;
the wrapper then prints which of the two heavy modules the process holds. And the parser main builds for one
command lists every command, so `memrl --help` is unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memrl.cli import COMMANDS, build_parser, chosen_command

ROOT = Path(__file__).resolve().parents[2]
WRAPPER = """
import json, sys
from memrl.cli import main
try:
    rc = main(sys.argv[1:])
except SystemExit as e:  # --help exits through argparse
    rc = e.code
print("HEAVY=" + json.dumps([m for m in ("torch", "transformers") if m in sys.modules]), file=sys.stderr)
sys.exit(rc)
"""


def _run(argv: list[str]) -> tuple[int, str, list[str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", WRAPPER, *argv], capture_output=True, text=True, env=env,
                          timeout=300, check=False)
    heavy = next(line for line in proc.stderr.splitlines() if line.startswith("HEAVY="))
    return proc.returncode, proc.stdout, json.loads(heavy.removeprefix("HEAVY="))


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("startup")
    one = d / "one.jsonl"
    one.write_text(json.dumps({"task_id": "q1", "question": "Where?", "context": "In Liverpool.",
                               "answers": ["Liverpool"]}) + "\n")
    hotpot = d / "hotpot.json"
    hotpot.write_text(json.dumps([{"_id": f"h{i}", "question": f"Which river runs through Place {i}?",
                                   "answer": f"River {i}", "type": "bridge", "level": "easy",
                                   "supporting_facts": [[f"Place {i}", 0]],
                                   "context": [[f"Place {i}", [f"Place {i} lies on River {i}."]],
                                               [f"Other {i}", [f"Filler {i}."]]]} for i in range(6)]))
    return {"one": one, "hotpot": hotpot, "out": d / "built"}


def test_version_help_and_data_commands_import_neither_torch_nor_transformers(files):
    from memrl import __version__

    rc, out, heavy = _run(["--version"])
    assert (rc, out.strip(), heavy) == (0, __version__, [])
    rc, out, heavy = _run(["--help"])
    assert (rc, heavy) == (0, []) and all(name in out for name in COMMANDS)
    rc, out, heavy = _run(["data", "show", str(files["one"])])
    assert (rc, heavy) == (0, []) and out.startswith("kind: tasks")
    rc, out, heavy = _run(["data", "build", "--source", str(files["hotpot"]), "--out", str(files["out"]),
                           "--docs", "2", "--num-questions", "2"])
    assert (rc, heavy) == (0, []) and (files["out"] / "eval_2.json").is_file()


def test_the_parser_lists_every_command_and_fills_only_the_chosen_one():
    full, mods = build_parser()
    light, one = build_parser(["data"])
    assert list(one) == ["data"] and sorted(mods) == sorted(COMMANDS)
    assert light.format_help() == full.format_help()  # `memrl --help` as before
    sub = next(a for a in light._actions if a.dest == "command")
    assert sorted(sub.choices) == sorted(COMMANDS)
    assert chosen_command(["--version"]) is None and chosen_command(["data", "show", "x"]) == "data"
    assert chosen_command(["--debug-nothing", "eval", "--out", "x"]) == "eval"
