"""Demos: end-to-end recipes on CPU, one module per demo that chains the library's stages.

- memagent: `memrl demo` (configs, model init, cold start on a mixture demonstrator, GRPO, evaluation).
- memact: `memrl demo --agent memact` (copy warm-up, cold start, DCPO, evaluation).

The evaluation is `memrl.eval.evaluator` (the one `memrl eval` and validation use: greedy and sampled per
length, standard errors over tasks); the tables and plots are `memrl.eval.demo_report`.
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

