"""MemAct's table in `memrl eval`'s report (memrl.workflows.memact's SPEC.report): accuracy against context
size and tool use, one line per run, appended to summary.md, with memact_summary.csv and memact_context.png
beside it. Recomputed from results.jsonl rows, as the standard table is (memrl.eval.report)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from memrl.records import write_csv
from memrl.workflows import ReportSection


@dataclass
class MemActSummary:
    """One run of MemAct (multi-question rows): accuracy and what the context cost."""

    run: str
    questions: int
    accuracy: float
    """All sub-questions right, percent (MemAct's "fully correct")."""
    subq_accuracy: float
    """Sub-questions right, percent of all sub-questions."""
    f1: float
    """Mean sub-question F1, percent."""
    mean_context_tokens: float
    """Mean over questions of the mean working-context (prompt) tokens per turn."""
    peak_context_tokens: float
    """Mean over questions of the largest working context."""
    max_context_tokens: float
    """Largest working context of the run."""
    mean_generated_tokens: float
    mean_turns: float
    mean_searches: float
    mean_prunes: float
    failed_prunes: int
    """Totals over the run (counted failures)."""
    malformed_calls: int
    search_errors: int
    reward_errors: int
    prune_withheld: float
    """Fraction of questions run without the prune tool."""
    judge_errors: int = 0
    """Questions whose LLM judgement failed (workflow.judge; scored 0 or excluded, by judge.on_failure);
    the kinds are in each row's metrics (judge_error_http_error / _timeout / _no_verdict / _garbled)."""


MEMACT_COLUMNS = [f.name for f in fields(MemActSummary)]


def is_memact(rows: Sequence[dict[str, Any]]) -> bool:
    return bool(rows) and all("multiq_questions" in r.get("metrics", {}) for r in rows)


def summarize_memact(rows: Sequence[dict[str, Any]], run: str) -> MemActSummary:
    """The MemAct summary of a run's rows (see memrl.workflows.memact for the metrics)."""
    k = len(rows)
    ms = [r["metrics"] for r in rows]

    def mean(key: str) -> float:
        return sum(float(m.get(key, 0.0)) for m in ms) / k

    def total(key: str) -> int:
        return int(sum(float(m.get(key, 0.0)) for m in ms))

    subq = sum(float(m["multiq_questions"]) for m in ms)
    return MemActSummary(
        run=run, questions=k, accuracy=100 * mean("multiq_all_correct"),
        subq_accuracy=100 * sum(float(m["multiq_correct"]) for m in ms) / subq if subq else 0.0,
        f1=100 * mean("multiq_f1_mean"), mean_context_tokens=mean("mean_context_tokens"),
        peak_context_tokens=mean("peak_context_tokens"),
        max_context_tokens=max(float(m.get("peak_context_tokens", 0.0)) for m in ms),
        mean_generated_tokens=mean("generated_tokens"), mean_turns=mean("turns"), mean_searches=mean("searches"),
        mean_prunes=mean("prunes"), failed_prunes=total("failed_prunes"), malformed_calls=total("malformed_calls"),
        search_errors=total("search_errors"), reward_errors=total("reward_error"),
        prune_withheld=mean("prune_withheld"), judge_errors=total("judge_error"),
    )


def memact_markdown(summaries: Sequence[MemActSummary]) -> str:
    """The MemAct table: accuracy against context size and tool use, one line per run."""
    lines = ["| run | questions | accuracy (all) | sub-question acc. | F1 | mean context | peak context "
             "| max context | generated | turns | searches | prunes | failed prunes | malformed calls "
             "| search errors | reward errors | prune withheld | judge errors |",
             "|---|" + "---:|" * 17]
    for s in summaries:
        lines.append(
            f"| {s.run} | {s.questions} | {s.accuracy:.2f} | {s.subq_accuracy:.2f} | {s.f1:.2f} "
            f"| {s.mean_context_tokens:.0f} | {s.peak_context_tokens:.0f} | {s.max_context_tokens:.0f} "
            f"| {s.mean_generated_tokens:.1f} | {s.mean_turns:.2f} | {s.mean_searches:.2f} | {s.mean_prunes:.2f} "
            f"| {s.failed_prunes} | {s.malformed_calls} | {s.search_errors} | {s.reward_errors} "
            f"| {s.prune_withheld:.2f} | {s.judge_errors} |"
        )
    return "\n".join(lines) + "\n"


def plot_memact(path: str | os.PathLike[str], summaries: Sequence[MemActSummary]) -> None:
    """PNG: accuracy (all correct, %) against mean working-context tokens, one point per run."""
    import matplotlib  # noqa: PLC0415 - here, so that loading the workflow loads no plotting library

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for s in summaries:
        ax.scatter([s.mean_context_tokens], [s.accuracy], label=s.run)
        ax.annotate(s.run, (s.mean_context_tokens, s.accuracy), fontsize=8)
    ax.set_xlabel("mean working-context tokens")
    ax.set_ylabel("accuracy (all sub-questions, %)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.set_title("MemAct: accuracy vs context size")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def summarize_run(rows: Sequence[dict[str, Any]], run: str) -> MemActSummary | None:
    """The MemAct summary of a run's rows, or None where they are not MemAct's (multi-question) rows."""
    return summarize_memact(rows, run) if is_memact(rows) else None


def write_memact_files(out: Path, summaries: Sequence[MemActSummary]) -> tuple[Path, ...]:
    """memact_summary.csv and memact_context.png in `out`."""
    csv_path, png_path = out / "memact_summary.csv", out / "memact_context.png"
    write_csv(csv_path, summaries, MEMACT_COLUMNS)
    plot_memact(png_path, summaries)
    return csv_path, png_path


REPORT = ReportSection(summarize=summarize_run, markdown=memact_markdown, write=write_memact_files)
