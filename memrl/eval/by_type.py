"""The by-question-type table of `memrl eval`'s report: rows that carry a `question_type` (LoCoMo's category
names, LongMemEval's question types) are grouped by (dataset, question type), under the standard table.

One line per (dataset, type): questions, EM, accuracy (sub-EM), F1 and each benchmark score the rows carry
(BENCHMARK_COLUMNS: locomo_f1, longmemeval_rule, longmemeval_judge), means over the rows x 100. Then per
dataset: "abstention" (rows marked abstention, whatever their type: LongMemEval's abstention accuracy) when
there are any, "all" (every row of the dataset) and "mean of types" (the unweighted mean of the type lines:
LongMemEval's task-averaged accuracy). Also written as by_type.csv.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from memrl.records import write_csv
from memrl.workflows import ReportSection

BENCHMARK_COLUMNS = ("locomo_f1", "longmemeval_judge", "longmemeval_rule")
"""The per-question scores the table averages when rows carry them (- where a line has none)."""
_BASE = ("em", "sub_em", "f1")


@dataclass
class TypeLine:
    run: str
    dataset: str
    question_type: str
    questions: int
    em: float
    accuracy: float
    f1: float
    locomo_f1: float | None = None
    """The mean of the rows' benchmark score (percent), None where no row of the line has one; likewise
    the next two."""
    longmemeval_judge: float | None = None
    longmemeval_rule: float | None = None

    def score(self, key: str) -> float | None:
        return getattr(self, key)


def _line(run: str, dataset: str, qtype: str, rows: Sequence[dict[str, Any]]) -> TypeLine:
    def mean(key: str) -> float | None:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        return 100 * sum(vals) / len(vals) if vals else None

    em, acc, f1 = (mean(k) or 0.0 for k in _BASE)
    return TypeLine(run, dataset, qtype, len(rows), em, acc, f1, **{k: mean(k) for k in BENCHMARK_COLUMNS})


def _mean_line(run: str, dataset: str, lines: Sequence[TypeLine]) -> TypeLine:
    def avg(vals: list[float | None]) -> float | None:
        got = [v for v in vals if v is not None]
        return sum(got) / len(got) if got else None

    return TypeLine(run, dataset, "mean of types", sum(s.questions for s in lines),
                    avg([s.em for s in lines]) or 0.0, avg([s.accuracy for s in lines]) or 0.0,
                    avg([s.f1 for s in lines]) or 0.0,
                    **{k: avg([s.score(k) for s in lines]) for k in BENCHMARK_COLUMNS})


def type_lines(rows: Sequence[dict[str, Any]], run: str) -> list[TypeLine] | None:
    """The by-type lines of one run's rows; None when no row has a question_type."""
    typed = [r for r in rows if r.get("question_type")]
    if not typed:
        return None
    by_ds: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in typed:
        by_ds[str(r.get("dataset") or "")][str(r["question_type"])].append(r)
    out: list[TypeLine] = []
    for ds in sorted(by_ds):
        types = [_line(run, ds, t, rs) for t, rs in sorted(by_ds[ds].items())]
        out += types
        every = [r for rs in by_ds[ds].values() for r in rs]
        abstained = [r for r in every if r.get("abstention")]
        if abstained:
            out.append(_line(run, ds, "abstention", abstained))
        out.append(_line(run, ds, "all", every))
        out.append(_mean_line(run, ds, types))
    return out


def types_markdown(summaries: Sequence[Sequence[TypeLine]]) -> str:
    lines = [s for run in summaries for s in run]
    cols = [k for k in BENCHMARK_COLUMNS if any(s.score(k) is not None for s in lines)]
    out = ["### By question type", "",
           ("| run | dataset | question type | questions | EM | accuracy (sub-EM) | F1 | "
            + "".join(f"{k} | " for k in cols)).rstrip(),
           "|---|---|---|---:|---:|---:|---:|" + "---:|" * len(cols)]
    for s in lines:
        cells = "".join("- | " if s.score(k) is None else f"{s.score(k):.2f} | " for k in cols)
        out.append(f"| {s.run} | {s.dataset or '-'} | {s.question_type} | {s.questions} | {s.em:.2f} | "
                   f"{s.accuracy:.2f} | {s.f1:.2f} | {cells}".rstrip())
    return "\n".join(out) + "\n"


def write_types(out_dir: Path, summaries: Sequence[Sequence[TypeLine]]) -> tuple[Path, ...]:
    path = Path(out_dir) / "by_type.csv"
    write_csv(path, [s for run in summaries for s in run], [f.name for f in fields(TypeLine)])
    return (path,)


SECTION = ReportSection(type_lines, types_markdown, write_types)  # (rows, run) -> lines; markdown; files
"""The by-type table as a report section (memrl.eval.report.section_summaries adds it to every report)."""
