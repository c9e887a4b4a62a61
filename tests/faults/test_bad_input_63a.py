"""Issue 63 (items 1-11): settings that were silently ignored, contradictions found late, values with no upper
bound. Each probe is refused before any work in one line naming the field, file or endpoint (exit 2 for a
command-line value, 1 otherwise), or the run says which setting won. The huge-value items (1, 9) are pinned
with the range walk in tests/unit/test_config_ranges.py, the seed sweep's (8) in tests/unit/test_demo_seeds.py."""

from __future__ import annotations

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.config import ConfigError, load_config
from memrl.training.assemble import validate
from memrl.training.config import TrainConfig


def _fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


def _validate(*overrides: str):
    return validate(load_config(TrainConfig, ["model.path=unused", *overrides]))


# ------------------------------------------------------- item 4: foldgrpo on a workflow without branches


@pytest.mark.parametrize("workflow", ["memagent", "mem1", "memact", "summarize"])
def test_foldgrpo_on_a_workflow_without_branches_is_refused_before_any_work(workflow, tmp_path, capsys):
    line = _fails(["train", f"model.path={tmp_path / 'no_model'}", f"out_dir={tmp_path / 'out'}",
                   f"workflow={workflow}", "algorithm.name=foldgrpo"], capsys)
    assert line == (f"memrl train: error: algorithm.name=foldgrpo on workflow={workflow}: its process rewards "
                    "(unfolded, scope, failure) read the branches workflow=fold records, and this workflow records "
                    "none, so it would train as plain GRPO; use workflow=fold or algorithm.name=grpo")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_foldgrpo_runs_where_its_terms_mean_something():
    assert _validate("workflow=fold", "algorithm.name=foldgrpo")[0].name == "fold"
    # no process rewards: FoldGRPO's GRPO over threads, asked for by name
    assert _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[]")
    # a process reward of the user's own may read any workflow's rows
    from memrl.algorithms.process_rewards import PROCESS_REWARDS, register_process_reward

    register_process_reward("mine")(lambda traj, seg, opts: [0.0] * len(seg.response_ids))
    try:
        assert _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[mine]")
        with pytest.raises(ConfigError, match=r"^algorithm.name=foldgrpo on workflow=memagent: its process rewards "
                                              r"\(scope\) read"):
            _validate("workflow=memagent", "algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[scope]")
    finally:
        del PROCESS_REWARDS["mine"]
