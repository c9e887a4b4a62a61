"""Summaries of eval results by dataset and context length: markdown + CSV tables and an accuracy-vs-length
plot.

Everything here is recomputed from results.jsonl, so a table always matches its rows. A table row is one
(dataset, N) of a run: files of two datasets at one N (ReMemR1 evaluates HotpotQA and 2Wiki at every N)
give two rows; the dataset column appears once any row names a dataset. Percentages
(EM, accuracy = sub-EM as in MemAgent's Table 2, F1) are means over questions x 100.
"""

from __future__ import annotations

import json
import logging
import os
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

from memrl.errors import UserError
from memrl.eval import by_type, evaluator
from memrl.eval.runner import CONFIG_FILE, RESULTS_FILE, read_results
from memrl.eval.stats import cell, recorded
from memrl.records import write_csv as write_rows_csv
from memrl.workflows import ReportSection, format_counts, format_keys, get_workflow, report_sections

log = logging.getLogger(__name__)


@dataclass
class LengthSummary:
    """One row of the table: a run on one dataset at one document count."""

    run: str
    num_docs: int
    """N: the rows' document count (RULER rows: the sequence length)."""
    questions: int
    em: float
    """Exact match, percent."""
    accuracy: float
    """Sub-EM, percent (MemAgent reports this as accuracy)."""
    f1: float
    """Token F1, percent."""
    mean_context_tokens: float
    mean_tokens_read: float
    mean_generated_tokens: float
    seconds_per_question: float
    """Wall time per question: per run session, first start to last finish, summed, / questions."""
    mean_latency_seconds: float
    """Mean of the rows' own start-to-finish seconds (includes waiting for the engine's batch)."""
    no_box: int = 0
    """Questions whose final answer had no \\boxed{} (scored as an empty prediction)."""
    format_errors: int = 0
    """Questions with any other format error or fallback (e.g. ReMemR1's missing_update)."""
    format_detail: str = ""
    """Those errors by kind, e.g. "missing_update=3 unclosed_update=1" (questions with each)."""
    string_match_all: float | None = None
    """RULER's string_match_all, percent, over the questions whose task names it (meta["metric"]);
    None when none does."""
    string_match_part: float | None = None
    """RULER's string_match_part, percent, likewise."""
    mean_model_calls: float | None = None
    """Model calls per question, for workflows whose calls vary by what the policy decides (InfMem's stops,
    MEM1's turns); None for the others (their column is then left out)."""
    mean_retrievals: float | None = None
    """InfMem: retrieve calls per question (None when the rows have none)."""
    stop_rate: float | None = None
    """InfMem: percent of questions where the policy stopped reading before the last chunk."""
    mean_stop_step: float | None = None
    """InfMem: the step reading ended at (the stop's, else the number of chunks), mean over questions."""
    dataset: str = ""
    """The rows' dataset (Task.meta["dataset"]; "" when their files did not say)."""
    samples: int = 1
    """Answers per question (`memrl eval samples=k`): the most samples any question of the row has."""
    mean_at_k: float | None = None
    """mean@k, percent: per question the mean score over its samples, then the mean over questions. A row's
    score is its task-named metric (RULER's string_match_all / string_match_part) when it has one, else
    sub-EM (accuracy). None when samples = 1."""
    mean_at_k_se: float | None = None
    """Standard error of mean@k over questions: the sample standard deviation (n - 1) of the per-question
    values / sqrt(questions); 0 with one question."""
    pass_at_k: float | None = None
    """pass@k, percent: per question the best score over its samples (1 when any sample is right, for 0/1
    scores), then the mean over questions."""
    pass_at_k_se: float | None = None
    """Standard error of pass@k over questions, as mean_at_k_se."""


SAMPLED_COLUMNS = ("samples", "mean_at_k", "mean_at_k_se", "pass_at_k", "pass_at_k_se")
"""Columns the CSV carries only when some row was sampled more than once (samples=1 output is unchanged)."""
ACTION_COLUMNS = ("mean_model_calls", "mean_retrievals", "stop_rate", "mean_stop_step")
"""Summary columns of the decided actions, shown when some row carries them (action_means)."""
TABLE_COLUMNS = [f.name for f in fields(LengthSummary) if f.name not in SAMPLED_COLUMNS and f.name not in ACTION_COLUMNS]
TASK_METRIC_COLUMNS = ("string_match_all", "string_match_part")
"""Row keys of the eval metrics a task can name (memrl.rewards.eval_metrics), summarized when present."""


def task_metric_means(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Mean x 100 of each task-named eval metric over the rows that carry it (None when none does)."""
    out: dict[str, float | None] = {}
    for key in TASK_METRIC_COLUMNS:
        vals = [float(r[key]) for r in rows if r.get(key) is not None]
        out[key] = 100 * sum(vals) / len(vals) if vals else None
    return out


def action_means(rows: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """ACTION_COLUMNS over rows whose metrics report decided actions (InfMem's stop_step, MEM1's invalid_turn);
    all None when none does."""
    ms = [r.get("metrics") or {} for r in rows]
    out: dict[str, float | None] = dict.fromkeys(ACTION_COLUMNS)
    if not rows or not any("stop_step" in m or "invalid_turn" in m for m in ms):
        return out
    out["mean_model_calls"] = sum(float(r["model_calls"]) for r in rows) / len(rows)
    if all("stop_step" in m for m in ms):
        out["mean_retrievals"] = sum(m["retrievals"] for m in ms) / len(ms)
        out["stop_rate"] = 100 * sum(m["stopped"] for m in ms) / len(ms)
        out["mean_stop_step"] = sum(m["stop_step"] for m in ms) / len(ms)
    return out


GROUP_BY = ("dataset", "file")


def row_score(row: dict[str, Any]) -> float:
    """A row's score for mean@k / pass@k: its task-named metric when it has one, else sub-EM."""
    for key in TASK_METRIC_COLUMNS:
        if row.get(key) is not None:
            return float(row[key])
    return float(row["sub_em"])


def mean_and_se(values: Sequence[float]) -> tuple[float, float]:
    """(mean, standard error) of per-question values, both x 100: memrl.eval.evaluator.mean_and_se (SE =
    sample std (n - 1) / sqrt(n)), the one the demos and `memrl eval` share."""
    m, se = evaluator.mean_and_se(values)
    return 100 * m, 100 * se


def question_key(row: dict[str, Any], i: int) -> tuple[str, str]:
    """Which question a row answers: (file digest, else file name; task_id); a row without a task_id
    (rows made elsewhere) is a question of its own."""
    if "task_id" not in row:
        return ("row", str(i))
    return (str(row.get("file_sha256") or row.get("file", "")), str(row["task_id"]))


def sampled_stats(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """samples, mean@k, pass@k and their standard errors over the questions of `rows` (one (dataset, N));
    a question is (file digest or name, task_id). samples = 1: only {"samples": 1}."""
    per_q: dict[tuple[str, str], list[float]] = defaultdict(list)
    for i, r in enumerate(rows):
        per_q[question_key(r, i)].append(row_score(r))
    k = max(len(v) for v in per_q.values())
    if k < 2:
        return {"samples": 1}
    mean_k, mean_se = mean_and_se(evaluator.task_means(per_q.values()))
    pass_k, pass_se = mean_and_se(evaluator.task_best(per_q.values()))
    return {"samples": k, "mean_at_k": mean_k, "mean_at_k_se": mean_se, "pass_at_k": pass_k, "pass_at_k_se": pass_se}


def summarize(rows: Sequence[dict[str, Any]], run: str, group_by: str = "dataset",
              format_keys: Sequence[str] | None = None) -> list[LengthSummary]:
    """One LengthSummary per (dataset, num_docs), by dataset then ascending N. group_by="file": one per
    (eval file, num_docs) instead, the file name in the dataset column (MemAgent's and vime's evaluators
    score each eval file on its own). `format_keys`: the run's workflow's (None: every known workflow's)."""
    if group_by not in GROUP_BY:
        raise UserError(f"--group-by {group_by!r} is not one of {', '.join(GROUP_BY)}")
    by_n: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        label = r.get("file") if group_by == "file" else r.get("dataset")
        by_n[(str(label or ""), int(r["num_docs"]))].append(r)
    out = []
    for ds, n in sorted(by_n):
        rs = by_n[(ds, n)]
        k = len(rs)
        sampled = sampled_stats(rs)
        questions = len({question_key(r, i) for i, r in enumerate(rs)}) if sampled["samples"] > 1 else k

        def mean(key: str, rs: list[dict[str, Any]] = rs, k: int = k) -> float:
            return sum(float(r[key]) for r in rs) / k

        counts = format_counts([r.get("metrics") or {} for r in rs], format_keys)
        other = {kk: v for kk, v in counts.items() if kk != "no_box" and v}
        flagged = sum(1 for r in rs if any((r.get("metrics") or {}).get(kk, 0.0) > 0 for kk in other))
        out.append(LengthSummary(
            run=run, num_docs=n, questions=questions, dataset=ds, **sampled,
            em=100 * mean("em"), accuracy=100 * mean("sub_em"), f1=100 * mean("f1"),
            mean_context_tokens=mean("context_tokens"), mean_tokens_read=mean("tokens_read"),
            mean_generated_tokens=mean("generated_tokens"), seconds_per_question=wall_seconds(rs) / k,
            mean_latency_seconds=mean("seconds"), no_box=counts.get("no_box", 0), format_errors=flagged,
            format_detail=" ".join(f"{kk}={v}" for kk, v in other.items()), **task_metric_means(rs),
            **action_means(rs),
        ))
    return out


def wall_seconds(rows: Sequence[dict[str, Any]]) -> float:
    """Summed wall spans (first start to last finish) of the sessions that produced `rows`."""
    spans: dict[str, list[float]] = {}
    total = 0.0
    for r in rows:
        if "started" not in r or "finished" not in r:
            total += float(r.get("seconds", 0.0))  # rows from elsewhere: fall back to latency
            continue
        lo_hi = spans.setdefault(str(r.get("session", "")), [float(r["started"]), float(r["finished"])])
        lo_hi[0] = min(lo_hi[0], float(r["started"]))
        lo_hi[1] = max(lo_hi[1], float(r["finished"]))
    return total + sum(hi - lo for lo, hi in spans.values())


def run_name(result_dir: str | os.PathLike[str]) -> str:
    """The run's name from its eval_config.json, else the directory name."""
    p = Path(result_dir) / CONFIG_FILE
    if p.exists():
        name = json.loads(p.read_text()).get("name")
        if name:
            return str(name)
    return Path(result_dir).resolve().name


def load_summaries(result_dir: str | os.PathLike[str], group_by: str = "dataset") -> list[LengthSummary]:
    path = Path(result_dir) / RESULTS_FILE
    if not path.exists():
        raise UserError(f"{path} does not exist; is {result_dir} an eval output directory?")
    return summarize(read_results(path), run_name(result_dir), group_by, run_format_keys(result_dir))


def run_format_keys(result_dir: str | os.PathLike[str]) -> tuple[str, ...] | None:
    """The format-error keys a report of this run counts: the built-in workflows' and the run's own (a
    plugin's, resolved from eval_config.json's import path, so a report in a new process counts them too);
    None (the known workflows') when the file or the workflow cannot be read, which is logged."""
    p = Path(result_dir) / CONFIG_FILE
    try:
        name = json.loads(p.read_text(encoding="utf-8")).get("workflow") if p.exists() else None
        if not name:
            return None
        spec = get_workflow(str(name))
    except Exception as e:  # noqa: BLE001 - a report still prints, with the built-ins' keys
        log.warning("%s: workflow of the run not resolved (%s: %s); counting the known workflows' format keys",
                    p, type(e).__name__, e)
        return None

    return tuple(dict.fromkeys([*format_keys(), *spec.format_keys]))


def markdown_table(summaries: Sequence[LengthSummary]) -> str:
    """A markdown table, one line per (run, dataset, num_docs); a dataset column when any row names one; a
    task-named metric (RULER's string_match_all / string_match_part) gets a column when some row has it
    ("-" where a row does not)."""
    with_ds = any(s.dataset for s in summaries)
    extra = [k for k in (*TASK_METRIC_COLUMNS, *ACTION_COLUMNS) if any(getattr(s, k) is not None for s in summaries)]
    sampled = any(s.samples > 1 for s in summaries)
    head = ("| run |" + (" dataset |" if with_ds else "") + " docs | questions | EM | accuracy (sub-EM) | F1 | "
            + "".join(f"{k} | " for k in extra)
            + ("samples | mean@k ± SE | pass@k ± SE | " if sampled else "")
            + "context tokens | tokens read | generated tokens | s / question | latency s | no box | format errors |")
    lines = [head, "|---|" + ("---|" if with_ds else "") + "---:|---:|---:|---:|---:|" + "---:|" * len(extra)
             + ("---:|---:|---:|" if sampled else "") + "---:|---:|---:|---:|---:|---:|---|"]
    for s in summaries:
        ds = f" {s.dataset or '-'} |" if with_ds else ""
        cells = "".join("- | " if getattr(s, k) is None else f"{getattr(s, k):.2f} | " for k in extra)
        if sampled:
            cells += f"{s.samples} | " + ("- | - | " if s.mean_at_k is None else
                                          f"{cell(recorded(s.mean_at_k, s.mean_at_k_se), 2)} | "
                                          f"{cell(recorded(s.pass_at_k, s.pass_at_k_se), 2)} | ")
        lines.append(
            f"| {s.run} |{ds} {s.num_docs} | {s.questions} | {s.em:.2f} | {s.accuracy:.2f} | {s.f1:.2f} | {cells}"
            f"{s.mean_context_tokens:.0f} | {s.mean_tokens_read:.0f} | {s.mean_generated_tokens:.1f} "
            f"| {s.seconds_per_question:.3f} | {s.mean_latency_seconds:.3f} | {s.no_box} "
            f"| {s.format_errors}{f' ({s.format_detail})' if s.format_detail else ''} |"
        )
    return "\n".join(lines) + "\n"


def write_csv(path: str | os.PathLike[str], summaries: Sequence[LengthSummary]) -> None:
    """The summaries as CSV at full precision (columns = LengthSummary fields; an absent metric is empty)."""
    cols = TABLE_COLUMNS + [k for k in ACTION_COLUMNS if any(getattr(s, k) is not None for s in summaries)]
    cols += list(SAMPLED_COLUMNS) if any(s.samples > 1 for s in summaries) else []
    write_rows_csv(path, summaries, cols)


def plot_accuracy(path: str | os.PathLike[str], summaries: Sequence[LengthSummary], title: str = "") -> None:
    """PNG of accuracy (sub-EM, %) vs document count, log-x, one line per run and dataset (Agg backend)."""
    matplotlib.use("Agg", force=True)

    runs: dict[str, list[LengthSummary]] = defaultdict(list)
    for s in summaries:
        runs[f"{s.run} / {s.dataset}" if s.dataset else s.run].append(s)
    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    ns: set[int] = set()
    for name, ss in runs.items():
        ss = sorted(ss, key=lambda s: s.num_docs)
        ns.update(s.num_docs for s in ss)
        if any(s.mean_at_k is not None for s in ss):  # sampled: mean@k and pass@k with their standard errors
            xs = [s.num_docs for s in ss]
            ax.errorbar(xs, [s.mean_at_k or 0.0 for s in ss], yerr=[s.mean_at_k_se or 0.0 for s in ss],
                        marker="o", capsize=3, label=f"{name} mean@{max(s.samples for s in ss)}")
            ax.errorbar(xs, [s.pass_at_k or 0.0 for s in ss], yerr=[s.pass_at_k_se or 0.0 for s in ss],
                        marker="s", linestyle="--", capsize=3, label=f"{name} pass@{max(s.samples for s in ss)}")
            continue
        ax.plot([s.num_docs for s in ss], [s.accuracy for s in ss], marker="o", label=name)
    if ns and min(ns) > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(ns))
        ax.set_xticklabels([str(n) for n in sorted(ns)])
    ax.set_xlabel("documents per context")
    ax.set_ylabel("accuracy (sub-EM, %)")
    ax.set_ylim(0, 100)
    ax.grid(True, alpha=0.3)
    ax.set_title(title or "accuracy vs context length")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


@dataclass
class ReportFiles:
    markdown: Path
    csv: Path
    png: Path
    extra: tuple[Path, ...] = ()
    """What the workflows' own report sections wrote beside them (a CSV, a plot)."""


Sections = Sequence[tuple[ReportSection, Sequence[Any]]]
"""A workflow's report section and its summaries, one per run (memrl.workflows.ReportSection)."""


def section_summaries(rows: Sequence[dict[str, Any]], run: str,
                      sections: Sections = ()) -> list[tuple[ReportSection, list[Any]]]:
    """`sections` with the summary of `rows` added where a known workflow's section claims them (every
    built-in's and every spec's resolved in this process, memrl.workflows.report_sections), and the
    by-question-type table when rows carry a question type (memrl.eval.by_type)."""
    out = [(sec, list(sums)) for sec, sums in sections]
    for sec in (*report_sections(), by_type.SECTION):  # the workflows' own tables, then the by-type one
        s = sec.summarize(rows, run)
        if s is None:
            continue
        entry = next((e for e in out if e[0] == sec), None)
        if entry is None:
            out.append(entry := (sec, []))
        entry[1].append(s)
    return out


def write_report(out_dir: str | os.PathLike[str], summaries: Sequence[LengthSummary], title: str = "",
                 sections: Sections = ()) -> ReportFiles:
    """summary.md, summary.csv and accuracy.png in out_dir (+ each workflow section's table under the
    standard one and its files beside them, for the sections given with summaries)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = ReportFiles(out / "summary.md", out / "summary.csv", out / "accuracy.png")
    files.markdown.write_text(markdown_table(summaries), encoding="utf-8")
    write_csv(files.csv, summaries)
    plot_accuracy(files.png, summaries, title)
    for sec, sums in sections:
        if not sums:
            continue
        with open(files.markdown, "a", encoding="utf-8") as f:
            f.write("\n" + sec.markdown(sums))
        files.extra += sec.write(out, sums)
    return files


def report_dirs(result_dirs: Sequence[str | os.PathLike[str]], out_dir: str | os.PathLike[str],
                group_by: str = "dataset") -> ReportFiles:
    """One table and one plot over several result directories (a line per run)."""
    summaries: list[LengthSummary] = []
    sections: list[tuple[ReportSection, list[Any]]] = []
    for d in result_dirs:
        summaries += load_summaries(d, group_by)
        sections = section_summaries(read_results(Path(d) / RESULTS_FILE), run_name(d), sections)
    return write_report(out_dir, summaries, sections=sections)
