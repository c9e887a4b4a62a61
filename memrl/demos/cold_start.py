"""Cold-start SFT stages: supervised training on a scripted demonstrator's trajectories (recorded through
the workflow by memrl.demonstrators.stages, so the SFT rows are RL's rows), and the copy warm-up that
gives a model trained from scratch its induction heads first.

- `memagent_cold_start`: the MemAgent demo's cold start (a `MixtureRule` on the synthetic task, optional
  reading-comprehension rows).
- `copy_warmup`, `memact_cold_start`: the MemAct demo's warm-up and cold start.
- `context_cold_start`: the context demo's cold start (a scripted fold / summary / search agent through its
  workflow; memrl.demos.context).
- `reading_cold_start`: the InfMem demo's cold start (the reading oracle through the memagent or infmem
  workflow; memrl.demos.infmem).

Each trains in place, logs under its `out_dir` (memrl.training.sft.sft_train_logged) and returns the
per-step losses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from memrl.demonstrators.stages import (
    context_demonstrations,
    memact_demonstrations,
    reading_segments,
    record_demonstrations,
)
from memrl.eval.evaluator import context_summary_of, memact_summary_of, reading_summary_of
from memrl.training.sft import SFTConfig, copy_warmup_segments, sft_train_logged
from memrl.types import Task


def memagent_cold_start(model: Any, tokenizer: Any, rule: Any, tasks: list[Task], wf_cfg: Any, scfg: SFTConfig,
                        out_dir: str | Path, *, reading_tasks: list[Task] | None = None, progress: bool = True,
                        tensorboard: bool = False) -> list[float]:
    """SFT on `rule`'s traces on `tasks` through the memagent workflow (plus one reading row per
    `reading_tasks` task); saves the model to `out_dir` and returns the per-step losses."""
    _, fin_tpl = wf_cfg.templates()
    groups = record_demonstrations(rule, tasks, tokenizer, wf_cfg)
    segments = [s for g in groups for s in g.segments()]
    rule_acc = sum(g.rewards[0] for g in groups) / len(groups)
    share = rule.aware_steps / max(1, rule.memory_steps)
    print(f"SFT: {len(segments)} rows from {len(groups)} demonstrations (p_aware {rule.p_aware}: "
          f"{100 * share:.1f}% of {rule.memory_steps} memory steps question-aware; the demonstrator's own "
          f"accuracy {100 * rule_acc:.1f}%)")
    if reading_tasks:
        reading = reading_segments(reading_tasks, tokenizer, fin_tpl)
        segments += reading
        print(f"SFT: + {len(reading)} reading-comprehension rows (answer from the whole document)")
    out_dir = Path(out_dir)
    return sft_train_logged(model, tokenizer, segments, scfg, out_dir, progress=progress, tensorboard=tensorboard,
                            save_dir=out_dir)


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


def memact_cold_start(model: Any, tokenizer: Any, tasks: list[Task], wf_cfg: Any, scfg: SFTConfig,
                      out_dir: str | Path, *, late_prob: float, seed: int, topk: int, keep_results: int = 2,
                      progress: bool = True) -> tuple[list[float], dict[str, float]]:
    """SFT on the scripted MemAct agent's segments on `tasks` (memact_demonstrations with `late_prob`,
    `seed`, `topk`, `keep_results`, and `wf_cfg.prune_tool`: False = the search-only agent, the prune tool
    withheld); saves the model to `out_dir`. Returns (losses, the scripted agent's statistics)."""
    groups = memact_demonstrations(tasks, tokenizer, wf_cfg, late_prob, seed, topk, keep_results,
                                   prune_tool=wf_cfg.prune_tool)
    segments = [s for g in groups for s in g.trajectories[0].segments]
    stats = memact_summary_of(groups)
    print(f"cold start: {len(segments)} rows from {len(groups)} scripted trajectories (its accuracy "
          f"{stats['accuracy']:.1f}%, prunes/task {stats['prunes_per_task']:.2f}, overflow {stats['overflow']:.1f}%)")
    out_dir = Path(out_dir)
    losses = sft_train_logged(model, tokenizer, segments, scfg, out_dir, progress=progress, tensorboard=False,
                              save_dir=out_dir)
    return losses, stats


def context_cold_start(model: Any, tokenizer: Any, tasks: list[Task], workflow: str, wf_cfg: Any, agent: Any,
                       scfg: SFTConfig, out_dir: str | Path, *, seed: int = 0, max_rows: int = 0,
                       progress: bool = True) -> tuple[list[float], dict[str, Any]]:
    """SFT on the scripted `agent`'s trajectories on `tasks` through `workflow` (memrl.demonstrators.stages.
    context_demonstrations): every row as the workflow cuts it (fold: one per branch + the main thread;
    summarize: one per part; sliding_window: one per window shift + the last); saves the model to
    `out_dir`. `max_rows` > 0 trains on the first `max_rows` rows only (task order, each task's rows in
    order). Returns (losses, {"summary": the agent's context_summary_of, "rows", "rows_trained",
    "rows_per_task", "branches_per_task", "summaries_per_task"})."""
    groups = context_demonstrations(tasks, tokenizer, workflow, wf_cfg, agent, seed=seed)
    trajs = [g.trajectories[0] for g in groups]
    segments = [s for t in trajs for s in t.segments]
    summary = context_summary_of(groups)
    print(f"cold start: {len(segments)} rows from {len(groups)} scripted {workflow} trajectories (its accuracy "
          f"{summary['accuracy']:.1f}%, peak context {summary['peak_context_tokens']:.0f}, stopped by the budget "
          f"{summary['stopped_by_budget']:.1f}%)" + (f"; the first {max_rows} trained (sft.max_rows)"
                                                    if 0 < max_rows < len(segments) else ""))
    trained = segments[:max_rows] if max_rows else segments
    losses = sft_train_logged(model, tokenizer, trained, scfg, Path(out_dir), progress=progress, tensorboard=False,
                              save_dir=Path(out_dir))
    return losses, {"summary": summary, "rows": len(segments), "rows_trained": len(trained), "rows_per_task": [len(t.segments) for t in trajs],
                    "branches_per_task": [int(t.metrics.get("branches", 0)) for t in trajs],
                    "summaries_per_task": [int(t.metrics.get("summaries", 0)) for t in trajs]}


def reading_cold_start(model: Any, tokenizer: Any, tasks: list[Task], workflow: str, wf_cfg: Any, agent: Any,
                       scfg: SFTConfig, out_dir: str | Path, *, progress: bool = True) -> tuple[list[float], dict[str, Any]]:
    """SFT on the scripted reading `agent`'s trajectories (memrl.demonstrators.infmem.ReadingOracle) on `tasks`
    through `workflow` (memagent: one memory row per chunk + the final; infmem: plan, memory, ..., the
    final), every row as the workflow cuts it; saves the model to `out_dir`. Returns (losses, {"summary": the
    agent's reading_summary_of, "rows", "rows_per_task"})."""
    groups = context_demonstrations(tasks, tokenizer, workflow, wf_cfg, agent)
    trajs = [g.trajectories[0] for g in groups]
    segments = [s for t in trajs for s in t.segments]
    summary = reading_summary_of(groups)
    print(f"cold start: {len(segments)} rows from {len(groups)} scripted {workflow} trajectories (its accuracy "
          f"{summary['accuracy']:.1f}%, {summary['model_calls']:.2f} calls per task)")
    losses = sft_train_logged(model, tokenizer, segments, scfg, Path(out_dir), progress=progress, tensorboard=False,
                              save_dir=Path(out_dir))
    return losses, {"summary": summary, "rows": len(segments), "rows_per_task": [len(t.segments) for t in trajs]}
