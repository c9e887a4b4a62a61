"""The demos' held-out evaluation protocols, each returning its rows (memrl.eval.evaluator.evaluate_rows: one
row per trajectory, its reward and metrics, labelled with policy, decoding, bucket, seed and held-out digest):
MemAct's, the context-management family's, the reading methods' (MemAgent / InfMem on the synthetic task, per
length) and MEM1's (per objective count). Each is greedy then sampled, one trajectory per task; what a table
shows of the rows is the method's `fields` (memrl.eval.fields, declared beside each method), and the reducers
the methods share beyond memrl.eval.fields are here (`one_per_task`, `outcome`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from memrl.eval.evaluator import Rollout, append_rows, evaluate_rows, evaluation_rows, per_task
from memrl.types import Task

Row = Mapping[str, Any]


def one_per_task(who: str) -> Callable[[Sequence[Row]], float]:
    """A reducer (memrl.eval.fields): the number of tasks (a float) of rows with one trajectory per task; fails
    in one line naming `who` otherwise."""

    def reduce(rows: Sequence[Row]) -> float:
        n = len(per_task(rows))
        if n != len(rows):
            raise ValueError(f"{who}: {len(rows)} rows for {n} tasks; one trajectory per task needed")
        return float(n)

    return reduce


def outcome(row: Row) -> float:
    """A reading agent's exact-match outcome (memrl.workflows.boxed_em_outcome): InfMem's reward mixes it with its
    early-stop and format terms and reports it as the metric infmem_outcome; MemAgent's reward is the outcome."""
    return row["metrics"].get("infmem_outcome", row["reward"])


def greedy_and_sampled(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float, seed: int,
                       **labels: Any) -> list[dict[str, Any]]:
    """The rows of a greedy then a sampled evaluation (at `temperature`), one trajectory per task each, both
    seeded with `seed`. `labels`: evaluate_rows' (the rows' bucket: the length or objective count, "all" for
    one task set; the policy, held-out digest and rows file: memrl.recipes.parts.policy_labels)."""
    return [r for temp in (0.0, temperature) for r in evaluate_rows(rollout, wf_cfg, tasks, 1, temp, seed, **labels)]


def evaluate_memact(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                    seed: int, prune_tool: bool = True, **labels: Any) -> list[dict[str, Any]]:
    """The MemAct demo's held-out protocol (`greedy_and_sampled`, bucket "all"; sampled at `temperature`, top_p 1,
    no top-k), the prune tool offered and never withheld (or, with `prune_tool=False`, withheld in every
    trajectory: the search-only baseline)."""
    base = replace(wf_cfg, no_prune_prob=0.0, prune_tool=prune_tool, top_p=1.0, top_k=-1)
    return greedy_and_sampled(rollout, base, tasks, temperature, seed, bucket="all", **labels)


def evaluate_context(rollout: Rollout, wf_cfg: Any, tasks: Sequence[Task], temperature: float,
                     seed: int, **labels: Any) -> list[dict[str, Any]]:
    """The context demo's held-out protocol (memrl.recipes.context): `greedy_and_sampled`, bucket "all"
    (sampled at `temperature`, top_p 1, no top-k)."""
    return greedy_and_sampled(rollout, replace(wf_cfg, top_p=1.0, top_k=-1), tasks, temperature, seed,
                              bucket="all", **labels)


def evaluate_by_bucket(rollout: Rollout, wf_cfg: Any, tasks: Mapping[int, Sequence[Task]], temperature: float,
                       seed: int, **labels: Any) -> list[dict[str, Any]]:
    """The InfMem and MEM1 demos' held-out protocol: per bucket of `tasks` (a length in chunks, an objective
    count), in its order, `greedy_and_sampled` (sampled at `temperature`, top_p 1, no top-k), the bucket the
    rows' bucket."""
    base = replace(wf_cfg, top_p=1.0, top_k=-1)
    return [r for b, ts in tasks.items() for r in greedy_and_sampled(rollout, base, ts, temperature, seed, bucket=b,
                                                                    **labels)]


def played_rows(groups: Sequence[Any], bucket: Any, labels: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The rows of a scripted policy's played groups (memrl.eval.evaluator.evaluation_rows: greedy, one trajectory
    per task) in `bucket`, labelled with `labels` (memrl.recipes.parts.policy_labels: the policy, the held-out
    digest and the run's rows file of the policy, which they are appended to, as an evaluation's are)."""
    rows = evaluation_rows(groups, bucket=bucket, policy=labels["policy"], heldout_sha256=labels["heldout_sha256"])
    append_rows(labels["rows_to"], rows)
    return rows
