"""Child process of the kill tests: `memrl train` with the parity workflow registered (run by path)."""

from __future__ import annotations

import sys

from memrl.cli import main
from memrl.workflows import WorkflowSpec, register_workflow


def _parity_reward(task, traj) -> float:
    """Half the samples of a random model earn it (first answer token even): every step really updates."""
    final = traj.segments[-1].response_ids
    return float(bool(final) and final[0] % 2 == 0)


def _parity_spec() -> WorkflowSpec:
    from memrl.workflows import memagent

    return WorkflowSpec("memagent_parity", memagent.run, memagent.MemAgentConfig, _parity_reward)


register_workflow("memagent_parity", _parity_spec)

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
