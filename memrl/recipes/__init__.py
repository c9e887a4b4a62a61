"""Recipes: the CPU demos as methods of one pipeline (memrl.recipes.pipeline: init -> [copy warm-up] -> cold
start -> evaluate -> RL -> evaluate -> write). Each method module holds its configs and its `Recipe`, which
declares only what differs (the module's other functions are the stage helpers its `Recipe` and benchmarks call).

- memagent: `memrl demo` (model init, cold start on a mixture demonstrator, GRPO, evaluation).
- memact: `memrl demo --agent memact` (task splits, model init, budget, copy warm-up, cold start, DCPO,
  evaluation).
- context: `memrl demo --agent context method=...` (the context-management family: task splits, model init,
  budget, copy warm-up, cold start on the method's scripted agent, GRPO / FoldGRPO, evaluation).
- mem1: `memrl demo --agent mem1 method=mem1|full_history` (peak context vs objective count).
- infmem: `memrl demo --agent infmem method=infmem|memagent` (synthetic one-fact tasks, model init shared by
  both methods, cold start on the reading oracle through the method's workflow, GRPO, evaluation at 1x / 4x /
  16x the training length).
- lookback: `memrl demo --agent lookback method=memagent|rememr1` (the look-back task: one cold start on both
  workflows' scripted traces, the same in both arms; ReMemR1's recall-off ablation, recall and callback hit
  rates; benchmarks/lookback_compare.py compares the arms).

The stages they call: memrl.data.synthetic / synthetic_memact (tasks), memrl.recipes.scratch (model init),
memrl.demonstrators.stages (scripted policies, their demonstrations, MemAct's budget), memrl.recipes.cold_start
(copy warm-up), memrl.training.trainer (RL), memrl.eval.evaluator (the one evaluator) with the methods'
held-out protocols (memrl.recipes.summaries) and their fields (memrl.eval.fields), memrl.recipes.report (tables
and plots) and memrl.recipes.seeds (the sweep over training seeds and its one aggregation).
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

