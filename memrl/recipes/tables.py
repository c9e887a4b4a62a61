"""Tables as data: a recipe method declares its results.md run table (`RunTable`) and its seed sweep's table
(`SweepTable`) and the code here renders both for every method (memrl.recipes.pipeline.Recipe's `markdown` and
`sweep_table`). Also the results schema's one walk over a policy's evaluation (`nested`) and the sweep's cells:
mean ± sd over seeds (memrl.eval.stats' `stat` of the runs' long rows, grouped by memrl.recipes.seeds.cells) and
their text (memrl.eval.stats' `cell`, spread "sd"; a run table's mean ± SE, `mean_se`, is that cell too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from memrl.eval.stats import EMPTY, cell, recorded

DECODINGS = ("greedy", "sampled")

NESTINGS = ("decoding", "decoding/bucket", "bucket/decoding")
"""How a policy's evaluation nests in results.json: decoding -> summary (one bucket, "all"), decoding -> bucket
-> summary, or bucket -> decoding -> summary."""


def nested(evaluation: dict[str, Any], nesting: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(decoding, bucket, summary) of a policy's evaluation, in its order in results.json."""
    if nesting == "decoding":
        for mode, summary in evaluation.items():
            yield mode, "all", summary
    elif nesting == "decoding/bucket":
        for mode, by_bucket in evaluation.items():
            for bucket, summary in by_bucket.items():
                yield mode, bucket, summary
    elif nesting == "bucket/decoding":
        for bucket, modes in evaluation.items():
            for mode, summary in modes.items():
                yield mode, bucket, summary
    else:
        raise ValueError(f"nesting must be one of {', '.join(NESTINGS)}, got {nesting!r}")


def by_decoding(evaluation: dict[str, Any], nesting: str) -> dict[str, dict[str, Any]]:
    """A policy's evaluation as the results schema's decoding -> bucket -> summary."""
    out: dict[str, dict[str, Any]] = {}
    for mode, bucket, summary in nested(evaluation, nesting):
        out.setdefault(mode, {})[bucket] = summary
    return out


# ---------------------------------------------------------------------------------------------- results.md


Cell = str | Callable[[Mapping[str, Any]], str]
"""A run table's cell of one summary: a format template ("{peak_context_tokens:.0f}") or a function (`mean_se`)."""


def mean_se(mean: str, se: str, digits: int = 1) -> Callable[[Mapping[str, Any]], str]:
    """The cell of a summary's `mean` ± its `se` (two recorded numbers), through memrl.eval.stats.cell."""
    return lambda s: cell(recorded(s[mean], s[se]), digits)


ACCURACY_SE = mean_se("accuracy", "accuracy_se")
"""A run table's accuracy cell: accuracy ± its standard error."""


def _text(c: Cell, summary: Mapping[str, Any]) -> str:
    return c(summary) if callable(c) else c.format_map(summary)


@dataclass(frozen=True)
class RunTable:
    """results.md: a title, one row "| label | decoding | [bucket |] cells |" per policy (in `policies`' order:
    row label, the results.json key of its evaluation), decoding and bucket as results.json holds them (the
    method's nesting), then notes. A column is (header, cell[, alignment]): the cell a `Cell` of one summary,
    e.g. "{peak_context_tokens:.0f}" or ACCURACY_SE; title and notes are format templates over results.json and
    `values`."""

    columns: tuple[tuple[Any, ...], ...]
    policies: tuple[tuple[str, str], ...]
    bucket: str = ""
    """The bucket column's header ("" = no bucket column)."""
    title: str = ""
    notes: tuple[str, ...] = ()
    defaults: Mapping[str, float] = field(default_factory=dict)
    """Summary fields a run may lack (e.g. no task with that question count), and the value shown then."""
    align: str = "---:"
    """The columns' markdown alignment unless a column sets its own ("---", "---:")."""
    values: Callable[[dict[str, Any]], Mapping[str, Any]] | None = None
    """What the title and notes name beside results.json's entries (e.g. a difference), from results.json."""

    def render(self, results: dict[str, Any], nesting: str) -> str:
        ns = {**results, **(self.values(results) if self.values else {})}
        head = ["policy", "decoding", *([self.bucket] if self.bucket else []), *(c[0] for c in self.columns)]
        aligns = ["---", "---", *(["---:"] if self.bucket else []), *(c[2] if c[2:] else self.align for c in self.columns)]
        lines = [self.title.format_map(ns), ""] if self.title else []
        lines += ["| " + " | ".join(head) + " |", "|" + "|".join(aligns) + "|"]
        for label, key in self.policies:
            for mode, bucket, summary in nested(results[key], nesting):
                s = {**self.defaults, **summary}
                cells = [label, mode, *([bucket] if self.bucket else []), *(_text(c[1], s) for c in self.columns)]
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
    sft, rl, gain or a benchmark's arm: the "<key>_<field>" cells of memrl.recipes.seeds.cells) of `labels`, decoding (the outer loop with `by_decoding`) and
    (`per_bucket`) bucket; gains signed."""
    rows = []
    modes = list(e["cells"] or DECODINGS)
    order = [(lk, m) for m in modes for lk in labels] if by_decoding else [(lk, m) for lk in labels for m in modes]
    for (label, key), mode in order:
        for b in (e["cells"].get(mode, {}) if per_bucket else ["all"]):
            cells = [cell(cell_of(e, mode, b, f"{key}_{f}"), digits(f), key == "gain", spread="sd") for f in fields]
            rows.append(f"| {label} | {mode} | " + (f"{b} | " if per_bucket else "") + " | ".join(cells) + " |")
    return rows


GAIN_ROWS = (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain"))


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
    bucket (header `bucket` with the bucket) of one cell, then `pooled` columns of the "all" bucket (header,
    field, digits; "n/a" for a None). results.md (`render`): the policies a run has, the buckets its results.json
    entry `buckets` lists, a bucket's cell `cell` (a `Cell` of its summary); the seed sweep (`render_sweep`): mean ± sd of
    `field` per bucket, the gain row ("rl - sft") after rl."""

    cell: Cell
    field: str
    pooled: tuple[tuple[str, str, int], ...]
    bucket: str = "{}"
    buckets: str = "lengths"
    title: str = ""
    sweep_title: str = ""
    policies: tuple[tuple[str, str], ...] = ()
    """The rows: (policy, its results.json key), in table order (a method's `policies`)."""

    def _head(self, buckets: list[Any]) -> list[str]:
        head = ["policy", *(self.bucket.format(b) for b in buckets), *(h for h, _, _ in self.pooled)]
        return ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]

    def render(self, results: dict[str, Any], nesting: str = "") -> str:
        """results.md (a method's `table`; `nesting` is always decoding -> bucket)."""
        buckets = results[self.buckets]
        lines = [self.title.format_map(results), ""]
        for mode in DECODINGS:
            rows = [(key, results[key][mode]) for _, key in self.policies if mode in results.get(key, {})]
            if rows:
                lines += [f"{mode}:", "", *self._head(buckets)]
                for key, by in rows:
                    pooled = ["n/a" if by["all"][f] is None else f"{by['all'][f]:.{d}f}" for _, f, d in self.pooled]
                    lines.append(f"| {key} | " + " | ".join([*(_text(self.cell, by[str(b)]) for b in buckets),
                                                             *pooled]) + " |")
                lines.append("")
        return "\n".join(lines)

    def render_sweep(self, e: dict[str, Any]) -> list[str]:
        buckets = [b for b in e["buckets"] if b != "all"]
        keys = [k for p, _ in self.policies for k in ((p, "gain") if p == "rl" else (p,))]
        lines = [self.sweep_title.format_map(e), ""]
        for mode, by in e["cells"].items():
            lines += [f"{mode}:", "", *self._head(buckets)]
            for p in (k for k in keys if f"{k}_{self.field}" in by.get("all", {})):
                cells = [cell(cell_of(e, mode, b, f"{p}_{self.field}"), sign=p == "gain", spread="sd") for b in buckets]
                cells += [cell(cell_of(e, mode, "all", f"{p}_{f}"), d, p == "gain", spread="sd") for _, f, d in self.pooled]
                lines.append(f"| {'rl - sft' if p == 'gain' else p} | " + " | ".join(cells) + " |")
            lines.append("")
        return lines
