"""`memrl eval workflow=memact`: every retriever mistake is one line on stderr with the documented exit
code (ConfigError 2, DataError 1), never a traceback; an import path naming a non-factory runs nothing
(issue 28: `retriever_kind=os:system` with a shell command as the corpus, from an override or a preset).

In-process `memrl.cli.main` on the cached tiny model (no server); 1 task, 1 turn of 4 tokens.
"""

from __future__ import annotations

import pytest

from memrl.cli import main
from memrl.data.tasks_jsonl import write_tasks
from memrl.types import Task

BASE = ["workflow=memact", "workflow.max_assistant_turns=1", "workflow.max_turn_tokens=4"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from memrl.models.tiny import cached_tiny_model

    root = tmp_path_factory.mktemp("probe")
    write_tasks(root / "tasks.jsonl", [Task("t1", "Where is Paris?", "", ["France"])])
    (root / "bad.jsonl").write_text('{"id": "x"\n')
    (root / "empty.jsonl").write_text("")
    return root, str(cached_tiny_model("tiny"))


def run_eval(setup, capsys, *extra: str, preset: str | None = None) -> tuple[int, list[str]]:
    root, model = setup
    out = root / f"out{len(list(root.glob('out*')))}"
    argv = ["eval", "--model", model, "--out", str(out), "--no-progress", str(root / "tasks.jsonl"), *BASE, *extra]
    if preset:
        argv[1:1] = ["--preset", preset]
    capsys.readouterr()
    rc = main(argv)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("memrl eval:") or "Traceback" in ln]
    assert "Traceback" not in err
    return rc, lines


@pytest.mark.parametrize("extra, rc, message", [
    ([], 2, "workflow=memact needs a retriever: set workflow.retriever_url, workflow.retriever_corpus"),
    (["workflow.retriever_corpus={root}/nope.jsonl"], 1, "workflow.retriever_corpus={root}/nope.jsonl: no such file"),
    (["workflow.retriever_corpus={root}/bad.jsonl"], 1, "bad.jsonl: line 1: not valid JSON"),
    (["workflow.retriever_corpus={root}/empty.jsonl"], 1, "empty.jsonl: the corpus is empty"),
    (["workflow.retriever_corpus={root}", "workflow.retriever_kind=keyword"], 1, "is a directory, not a corpus JSONL"),
    (["workflow.retriever_kind=zzz", "workflow.retriever_corpus={root}/bad.jsonl"], 2,
     "workflow.retriever_kind='zzz' is unknown"),
    (["workflow.retriever_scope=task"], 1, "task 't1': workflow.retriever_scope=task needs task.meta['documents']"),
])
def test_each_retriever_mistake_is_one_line(setup, capsys, extra, rc, message):
    root = setup[0]
    got_rc, lines = run_eval(setup, capsys, *(e.format(root=root) for e in extra))
    assert got_rc == rc
    assert len(lines) == 1 and lines[0].startswith("memrl eval: error: ")
    assert message.format(root=root) in lines[0]


def test_os_system_is_refused_and_runs_nothing(setup, capsys, tmp_path):
    marker = tmp_path / "pwned"
    rc, lines = run_eval(setup, capsys, "workflow.retriever_kind=os:system",
                         f"workflow.retriever_corpus=touch {marker}")
    assert rc == 2 and len(lines) == 1
    assert "workflow.retriever_kind='os:system' is not a retriever factory" in lines[0]
    preset = tmp_path / "evil.yaml"  # the same from a preset someone hands you
    preset.write_text(f"workflow:\n  name: memact\n  retriever_kind: os:system\n  retriever_corpus: touch {marker}\n")
    rc, lines = run_eval(setup, capsys, preset=str(preset))
    assert rc == 2 and len(lines) == 1 and "is not a retriever factory" in lines[0]
    assert not marker.exists()
