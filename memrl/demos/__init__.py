"""Demos: end-to-end recipes on CPU and the reusable pieces they are made of.

- evaluation: held-out evaluation of a policy or a scripted engine over tasks of several lengths,
  greedy and sampled, with standard errors over tasks (generic over the workflow).
- report: markdown tables and plots from a demo's results dict.
- memagent: the MemAgent demo recipe (`memrl demo`): configs, model init, cold start, RL.
- memact: the MemAct demo recipe (`memrl demo --agent memact`): copy warm-up, cold start, DCPO.
"""

from pathlib import Path
from typing import Any

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


def logged_sft(model: Any, tokenizer: Any, rows: list[Any], scfg: Any, log_dir: Path, *, desc: str,
               progress: bool, tensorboard: bool = False, save_dir: Path | None = None) -> list[float]:
    """`sft_train` over `rows` with a progress bar and metrics.jsonl in `log_dir` (one line per step);
    the model and tokenizer are saved to `save_dir` when given. Returns the per-step losses."""
    from memrl.training.logging import MetricsLogger
    from memrl.training.sft import sft_train

    steps = scfg.epochs * ((len(rows) + scfg.batch_rows - 1) // scfg.batch_rows)
    logger = MetricsLogger(log_dir, tensorboard=tensorboard, progress_total=steps, progress=progress, desc=desc)
    try:
        losses = sft_train(model, rows, scfg, pad_id=tokenizer.pad_token_id or 0,
                           on_step=lambda s, n, m: logger.log(s, m))
    finally:
        logger.close()
    if save_dir is not None:
        model.save_pretrained(save_dir, safe_serialization=True)
        tokenizer.save_pretrained(save_dir)
    return losses
