"""The copy warm-up: random token sequences, each followed by itself, that give a model trained from
scratch its induction heads before the cold start (the one cold start itself is memrl.recipes.pipeline's:
the method's scripted policy played through its workflow, its rows, the SFT update).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memrl.training.sft import SFTConfig, copy_warmup_segments, sft_train_logged


def copy_warmup(model: Any, tokenizer: Any, steps: int, batch_rows: int, lr: float, seed: int, out_dir: str | Path,
                progress: bool = True) -> list[float]:
    """Train `model` to copy by content for `steps` steps of `batch_rows` rows: random sequences over its
    whole vocabulary (special tokens aside), each followed by itself (copy_warmup_segments); returns the
    losses."""
    special = set(tokenizer.all_special_ids)
    ids = [i for i in range(len(tokenizer)) if i not in special]
    rows = copy_warmup_segments(ids, steps * batch_rows, block=batch_rows, seed=seed)
    scfg = SFTConfig(epochs=1, batch_rows=batch_rows, lr=lr, warmup_steps=20, lr_floor=1.0, shuffle=False, seed=seed)
    losses = sft_train_logged(model, tokenizer, rows, scfg, Path(out_dir), desc="copy warm-up", progress=progress,
                              tensorboard=False)
    print(f"copy warm-up: {len(losses)} steps over {len(ids)} tokens, loss {losses[0]:.2f} -> "
          f"{sum(losses[-20:]) / len(losses[-20:]):.3f} (mean of the last 20; chance {math.log(len(ids)):.2f})")
    return losses
