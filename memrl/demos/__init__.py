"""Demos: end-to-end recipes on CPU and the reusable pieces they are made of.

- evaluation: held-out evaluation of a policy or a scripted engine over tasks of several lengths,
  greedy and sampled, with standard errors over tasks (generic over the workflow).
- report: markdown tables and plots from a demo's results dict.
- memagent: the MemAgent demo recipe (`memrl demo`): configs, model init, cold start, RL.
- memact: the MemAct demo recipe (`memrl demo --agent memact`): copy warm-up, cold start, DCPO.
"""

SHARED_SECTIONS = ("engine", "workflow")


def split_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(demo overrides, training overrides): `train.<key>` and the shared sections (`engine`, `workflow`,
    spelled as in `memrl train` / `memrl eval`) go to the training config."""
    demo, train = [], []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        if ov.startswith("train."):
            train.append(ov.removeprefix("train."))
        elif key.split(".", 1)[0] in SHARED_SECTIONS:
            train.append(ov)
        else:
            demo.append(ov)
    return demo, train

