"""Issue 48: hostile and careless input on the surfaces added since round two (the OpenAI chat engine,
checkpoint conversion, the RULER builder, trackers, validation): each probe is one line naming the
option / file / row / field / endpoint (exit 2 for a command-line value, 1 otherwise), no traceback, and
nothing half-written."""

from __future__ import annotations

import pytest
from conftest import one_line

from memrl.cli import main


def _fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


# ------------------------------------------------------------------- item 9: flags a --kind does not read


@pytest.mark.parametrize(("extra", "said"), [
    (["--kind", "ruler", "--num-questions", "4"],
     "--num-questions is not used by --kind ruler; it reads --samples (rows per task and length)"),
    (["--kind", "ruler", "--docs", "50"], "--docs is not used by --kind ruler; it reads --lengths (target lengths in tokens)"),
    (["--kind", "ruler", "--source", "h.json"],
     "--source is not used by --kind ruler; it reads --qa-source (qa tasks) and --haystack (essay haystacks)"),
    (["--source", "h.json", "--samples", "3"], "--samples is not used by --kind auto (eval sets); it reads --num-questions"),
    (["--source", "h.json", "--lengths", "8k"], "--lengths is not used by --kind auto (eval sets); it reads --docs "
                                                "(document counts)"),
    (["--kind", "multiobjective", "--source", "h.json", "--haystack", "e.txt"],
     "--haystack is not used by --kind multiobjective (only by --kind ruler)"),
    (["--kind", "hotpotqa", "--source", "h.json", "--sub-questions", "2"],
     "--sub-questions is not used by --kind hotpotqa (eval sets) (only by --kind multiobjective)"),
])
def test_data_build_refuses_an_option_its_kind_would_ignore(extra, said, tmp_path, capsys):
    # before: `--kind ruler --num-questions 4` built 100 rows per task (the builder reads --samples)
    line = _fails(["data", "build", "--out", str(tmp_path / "out"), *extra], capsys)
    assert line == f"memrl data: error: {said}"
    assert not (tmp_path / "out").exists()


def test_serve_retrieval_refuses_dense_options_for_bm25(tmp_path, capsys):
    line = _fails(["serve", "retrieval", "--corpus", str(tmp_path / "c.jsonl"), "--model", "m"], capsys)
    assert line == "memrl serve: error: --model is not used by --retriever bm25 (only by --retriever dense)"


def test_serve_help_lists_only_services_that_exist(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    serve = next(ln for ln in out.splitlines() if ln.strip().startswith("serve"))
    assert "judge" not in serve and "retrieval" in serve
