"""Tables as data, rendered from summary rows: a recipe method declares its results.md table (`RunTable` or
`GridTable`) and its seed sweep's table (`SweepTable`, or any `Sweep`), and the code here renders them for every
method (memrl.recipes.pipeline.markdown; memrl.recipes.seeds renders the `sweep`).

results.md reads results.json's "summary" (memrl.eval.fields.summary_rows: one row {"policy", "decoding",
"bucket", <field>: value, ...} per group of evaluation rows); a column names a field (a format template over the
summary row, "{peak_context_tokens:.0f}", or a function of it, `mean_se`). Titles and notes are templates over
results.json, its "facts" entries by their own name, and the table's computed `values`.

The seed sweep reads the cells memrl.recipes.seeds aggregates from the runs' summary rows: decoding -> bucket ->
"<policy>_<field>" -> memrl.eval.stats.stat over the seeds (mean ± sd, memrl.eval.stats.cell with spread "sd");
"gain" is each run's rl - sft of the same decoding and bucket.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memrl.eval.fields import POOLED
from memrl.eval.stats import EMPTY, cell, recorded

DECODINGS = ("greedy", "sampled")

# ---------------------------------------------------------------------------------------------- results.md


Cell = str | Callable[[Mapping[str, Any]], str]
"""A run table's cell of one summary row: a format template ("{peak_context_tokens:.0f}") or a function (`mean_se`)."""


def mean_se(mean: str, se: str, digits: int = 1) -> Callable[[Mapping[str, Any]], str]:
    """The cell of a summary row's `mean` ± its `se` (two recorded numbers), through memrl.eval.stats.cell."""
    return lambda s: cell(recorded(s[mean], s[se]), digits)


ACCURACY_SE = mean_se("accuracy", "accuracy_se")
"""A run table's accuracy cell: accuracy ± its standard error."""


def _text(c: Cell, summary: Mapping[str, Any]) -> str:
    return c(summary) if callable(c) else c.format_map(summary)


def policy_rows(results: Mapping[str, Any], policy: str, decoding_major: bool = True) -> list[Mapping[str, Any]]:
    """The summary rows of `policy` in results.json, decoding-major (decodings, then buckets, in first-seen order),
    or else in the summary's order (the evaluation's: e.g. each bucket's greedy then sampled rows)."""
    rows = [s for s in results["summary"] if s["policy"] == policy]
    if not decoding_major:
        return rows
    order = {d: i for i, d in enumerate(dict.fromkeys(s["decoding"] for s in rows))}
    return sorted(rows, key=lambda s: order[s["decoding"]])


def namespace(results: Mapping[str, Any], values: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
              ) -> dict[str, Any]:
    """What a title or note template names: results.json's entries, its facts by their own name, `values`."""
    return {**results, **results.get("facts", {}), **(values(results) if values else {})}


@dataclass(frozen=True)
class RunTable:
    """results.md: a title, one row "| label | decoding | [bucket |] cells |" per summary row of each policy (in
    `policies`' order: row label, the policy column's value), decoding-major, then notes. A column is (header,
    cell[, alignment]): the cell a `Cell` of one summary row, e.g. "{peak_context_tokens:.0f}" or ACCURACY_SE;
    title and notes are format templates over `namespace` (results.json, its facts, `values`)."""

    columns: tuple[tuple[Any, ...], ...]
    policies: tuple[tuple[str, str], ...]
    bucket: str = ""
    """The bucket column's header ("" = no bucket column)."""
    title: str = ""
    notes: tuple[str, ...] = ()
    defaults: Mapping[str, float] = field(default_factory=dict)
    """Fields a summary row may hold as None (e.g. no task with that question count), and the value shown then."""
    align: str = "---:"
    """The columns' markdown alignment unless a column sets its own ("---", "---:")."""
    values: Callable[[Mapping[str, Any]], Mapping[str, Any]] | None = None
    """What the title and notes name beside results.json's entries (e.g. a difference), from results.json."""
    decoding_major: bool = True
    """A policy's rows decoding-major (`policy_rows`), or in the summary's order (False: bucket-major where the
    evaluation ran each bucket's decodings in turn)."""

    def render(self, results: Mapping[str, Any]) -> str:
        ns = namespace(results, self.values)
        head = ["policy", "decoding", *([self.bucket] if self.bucket else []), *(c[0] for c in self.columns)]
        aligns = ["---", "---", *(["---:"] if self.bucket else []), *(c[2] if c[2:] else self.align for c in self.columns)]
        lines = [self.title.format_map(ns), ""] if self.title else []
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join(aligns) + "|"]
        for label, key in self.policies:
            for summary in policy_rows(results, key, self.decoding_major):
                s = {**summary, **{k: v for k, v in self.defaults.items() if summary.get(k) is None}}
                cells = [label, s["decoding"], *([s["bucket"]] if self.bucket else []),
                         *(_text(c[1], s) for c in self.columns)]
                lines.append("| " + " | ".join(cells) + " |")
        if self.notes:
            lines += ["", *(n.format_map(ns) for n in self.notes)]
        return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- the seed sweep


def cell_of(e: dict[str, Any], mode: str, bucket: str, key: str) -> dict[str, Any]:
    """One aggregated cell of a capability's entry (EMPTY when no run has it)."""
    return e["cells"].get(mode, {}).get(bucket, {}).get(key, EMPTY)


def table_rows(e: dict[str, Any], labels: tuple[tuple[str, str], ...], fields: tuple[str, ...],
               digits: Callable[[str], int] = lambda f: 1, per_bucket: bool = False,
               by_decoding: bool = False) -> list[str]:
    """A sweep table's rows "| label | decoding | [bucket |] one cell per field |": per (label, policy key:
    sft, rl, gain or a benchmark's arm: the "<key>_<field>" cells of memrl.recipes.seeds.cells) of `labels`,
    decoding (the outer loop with `by_decoding`) and (`per_bucket`) bucket; gains signed."""
    rows = []
    modes = list(e["cells"] or DECODINGS)
    order = [(lk, m) for m in modes for lk in labels] if by_decoding else [(lk, m) for lk in labels for m in modes]
    for (label, key), mode in order:
        for b in (e["cells"].get(mode, {}) if per_bucket else [POOLED]):
            cells = [cell(cell_of(e, mode, b, f"{key}_{f}"), digits(f), key == "gain", spread="sd") for f in fields]
            rows.append(f"| {label} | {mode} | " + (f"{b} | " if per_bucket else "") + " | ".join(cells) + " |")
    return rows


GAIN_ROWS = (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain"))


@dataclass(frozen=True)
class Sweep:
    """Any seed sweep table: the summary fields it aggregates, the policies beside sft / rl / gain whose cells it
    reads (e.g. a scripted one), and its renderer of one capability's entry (markdown lines)."""

    fields: tuple[str, ...]
    render: Callable[[dict[str, Any]], list[str]]
    policies: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class CustomTable:
    """results.md written by a function of results.json's dict (a table no RunTable / GridTable shape holds)."""

    render: Callable[[Mapping[str, Any]], str]


@dataclass(frozen=True)
class SweepTable:
    """The seed sweep's table: one row per policy (label, sft / rl / gain), decoding and (with `bucket`, its
    header) bucket; one column per summary field (header, field, digits): mean ± sd over the seeds. `title`: a
    format template over the capability's entry, above; `note`: (an entry of the method's sweep extras, a
    template of its mean ± sd), below when some run has it."""

    columns: tuple[tuple[str, str, int], ...]
    policies: tuple[tuple[str, str], ...] = GAIN_ROWS
    bucket: str = ""
    title: str = ""
    note: tuple[str, str] | None = None

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(f for _, f, _ in self.columns)

    def render(self, e: dict[str, Any]) -> list[str]:
        digits = {f: d for _, f, d in self.columns}
        head = ["policy", "decoding", *([self.bucket] if self.bucket else []), *(h for h, _, _ in self.columns)]
        lines = [self.title.format_map(e), ""] if self.title else []
        lines += ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2),
                  *table_rows(e, self.policies, self.fields, digits.__getitem__, per_bucket=bool(self.bucket))]
        if self.note and e[self.note[0]]["n"]:
            lines += ["", self.note[1].format(cell(e[self.note[0]], spread="sd"))]
        return lines


@dataclass(frozen=True)
class GridTable:
    """A table per decoding ("greedy:", "sampled:"), one row per policy (labelled by its key): a column per
    bucket (header `bucket` with the bucket) of one cell, then `pooled` columns of the pooled "all" bucket
    (header, field, digits; "n/a" for a None). results.md (`render`): the policies a run has, the buckets the
    dotted path `buckets` of results.json lists, a bucket's cell `cell` (a `Cell` of its summary row); the seed
    sweep (`sweep`): mean ± sd of `field` per bucket, the gain row ("rl - sft") after rl."""

    cell: Cell
    field: str
    pooled: tuple[tuple[str, str, int], ...]
    bucket: str = "{}"
    buckets: str = "facts.lengths"
    title: str = ""
    sweep_title: str = ""
    policies: tuple[tuple[str, str], ...] = ()
    """The rows: (policy, its policy column value), in table order."""

    def _head(self, buckets: Sequence[Any]) -> list[str]:
        head = ["policy", *(self.bucket.format(b) for b in buckets), *(h for h, _, _ in self.pooled)]
        return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def render(self, results: Mapping[str, Any]) -> str:
        """results.md (a method's `table`)."""
        buckets: Any = results
        for part in self.buckets.split("."):
            buckets = buckets[part]
        lines = [self.title.format_map(namespace(results)), ""]
        for mode in DECODINGS:
            rows = [(key, {s["bucket"]: s for s in policy_rows(results, key) if s["decoding"] == mode})
                    for _, key in self.policies]
            rows = [(key, by) for key, by in rows if by]
            if rows:
                lines += [f"{mode}:", "", *self._head(buckets)]
                for key, by in rows:
                    pooled = ["n/a" if by[POOLED][f] is None else f"{by[POOLED][f]:.{d}f}" for _, f, d in self.pooled]
                    lines.append(f"| {key} | " + " | ".join([*(_text(self.cell, by[str(b)]) for b in buckets),
                                                             *pooled]) + " |")
                lines.append("")
        return "\n".join(lines)

    def render_sweep(self, e: dict[str, Any]) -> list[str]:
        buckets = [b for b in e["buckets"] if b != POOLED]
        keys = [k for p, _ in self.policies for k in ((p, "gain") if p == "rl" else (p,))]
        lines = [self.sweep_title.format_map(e), ""]
        for mode, by in e["cells"].items():
            lines += [f"{mode}:", "", *self._head(buckets)]
            for p in (k for k in keys if f"{k}_{self.field}" in by.get(POOLED, {})):
                cells = [cell(cell_of(e, mode, b, f"{p}_{self.field}"), sign=p == "gain", spread="sd") for b in buckets]
                cells += [cell(cell_of(e, mode, POOLED, f"{p}_{f}"), d, p == "gain", spread="sd")
                          for _, f, d in self.pooled]
                lines.append(f"| {'rl - sft' if p == 'gain' else p} | " + " | ".join(cells) + " |")
            lines.append("")
        return lines

    def sweep(self) -> Sweep:
        """This grid as the seed sweep's table: its field and pooled fields, its policies."""
        return Sweep((self.field, *(f for _, f, _ in self.pooled)), self.render_sweep, self.policies)
