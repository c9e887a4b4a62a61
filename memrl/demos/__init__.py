"""Demos: end-to-end recipes on CPU, one module per demo: its configs and one function that chains the
library's stages (the module's other functions only map its configs onto one library call each).

- memagent: `memrl demo` (model init, cold start on a mixture demonstrator, GRPO, evaluation).
- memact: `memrl demo --agent memact` (task splits, model init, budget, copy warm-up, cold start, DCPO,
  evaluation).
- context: `memrl demo --agent context method=...` (the context-management family: task splits, model init,
  budget, copy warm-up, cold start on the method's scripted agent, GRPO / FoldGRPO, evaluation).
- infmem: `memrl demo --agent infmem method=infmem|memagent` (synthetic one-fact tasks, model init shared by
  both methods, cold start on the reading oracle through the method's workflow, GRPO, evaluation at 1x / 4x /
  16x the training length).

The stages: memrl.data.synthetic / synthetic_memact (tasks), memrl.demos.scratch (model init),
memrl.demonstrators.stages (demonstrators, their demonstrations, MemAct's budget), memrl.demos.cold_start
(cold-start SFT, copy warm-up), memrl.training.trainer (RL), memrl.eval.evaluator (the one evaluator
`memrl eval` and validation use: greedy and sampled per length, standard errors over tasks) and
memrl.demos.report (the tables and plots).
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

