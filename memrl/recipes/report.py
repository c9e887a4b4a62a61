"""The demos' reports: markdown tables and matplotlib plots from a demo's results dict (results.json).

MemAgent (`memrl demo`): results.json's one layout (memrl.recipes.pipeline.results): facts["lengths"]
(evaluated lengths, in chunks), the RL config's train.data.synthetic (num_chunks, min_chunks, chunk_words), and
the summary rows (policy, decoding "greedy" / "sampled", bucket: the length) of memrl.recipes.memagent.FIELDS.
Stages are the rows' policies (demonstrator, sft, rl: `MEMAGENT_STAGES`); the gain columns compare two of them on
the same tasks (paired standard error, `memrl.eval.evaluator.paired_gain`). `memagent_markdown` and
`plot_memagent` are its results.md and plots (memrl.recipes.memagent writes them).

MemAct (`memrl demo --agent memact`): the one results layout (memrl.recipes.pipeline.results), its
summary rows of policies sft and rl (memrl.recipes.memact.FIELDS); `MEMACT_TABLE`, `plot_memact`,
`print_memact_eval`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt

from memrl.eval import stats
from memrl.eval.evaluator import paired_gain
from memrl.eval.fields import one
from memrl.recipes.tables import RunTable

MODES = ("sampled", "greedy")


def cell(res: dict[str, Any] | None) -> str:
    """"45.3 ± 2.1" (accuracy ± one standard error, percent; memrl.eval.stats.cell), "-" when not evaluated."""
    return stats.cell(None if res is None else stats.recorded(res["accuracy"], res["se"]))


def gain_cell(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """"+12.3 ± 2.0": the paired gain in points and its standard error, "-" when either is missing."""
    if before is None or after is None:
        return "-"
    return stats.cell(stats.recorded(*paired_gain(before["per_task"], after["per_task"])), sign=True)


def _syn(results: dict[str, Any]) -> dict[str, Any]:
    """The RL config's synthetic task section results.json's train holds (memrl.recipes.memagent settings.train_keys)."""
    return results["train"]["data"]["synthetic"]


def _get(results: dict[str, Any], stage: str, n: str, mode: str) -> dict[str, Any] | None:
    """The summary row of policy `stage`, decoding `mode`, length `n` (None when not evaluated)."""
    return one(results["summary"], policy=stage, decoding=mode, bucket=n)  # type: ignore[return-value]


def accuracy_table(results: dict[str, Any], stages: list[tuple[str, str]], gain: tuple[str, str] | None) -> str:
    """One row per length; for each mode the stages' accuracy ± SE and, with `gain` = (before, after), the
    paired gain. Columns of a stage/mode that was not evaluated anywhere are left out."""
    lengths = [str(n) for n in results["facts"]["lengths"]]
    train, words = _syn(results)["num_chunks"], _syn(results)["chunk_words"]

    def get(stage: str, n: str, mode: str) -> dict[str, Any] | None:
        return _get(results, stage, n, mode)

    head = ["length (chunks)", "context tokens", "x training length"]
    cols: list[tuple[str, Any]] = []
    for mode in MODES:
        for key, label in stages:
            if any(get(key, n, mode) for n in lengths):
                head.append(f"{label} {mode}")
                cols.append((key, mode))
        if gain and all(get(k, n, mode) for k in gain for n in lengths):
            head.append(f"gain {mode} (points)")
            cols.append((gain, mode))
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for n in lengths:
        row = [n, str(int(n) * words), f"{int(n) // train}x" if int(n) % train == 0 else f"{int(n) / train:g}x"]
        for key, mode in cols:
            row.append(gain_cell(get(key[0], n, mode), get(key[1], n, mode)) if isinstance(key, tuple)
                       else cell(get(key, n, mode)))
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def retention_table(results: dict[str, Any], stages: list[tuple[str, str]], mode: str = "greedy") -> str:
    """Memory retention per length: % of trajectories whose memory held the answer at some call (seen) and
    at the end (kept)."""
    lengths = [str(n) for n in results["facts"]["lengths"]]
    present = [(k, label) for k, label in stages if any(_get(results, k, n, mode) for n in lengths)]
    head = ["length (chunks)"] + [f"{label} {w}" for _, label in present for w in ("seen", "kept")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for n in lengths:
        row = [n]
        for k, _ in present:
            m = _get(results, k, n, mode) or {}
            row += [f"{m.get('answer_seen', 0.0):.1f}%", f"{m.get('answer_kept', 0.0):.1f}%"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_accuracy(results: dict[str, Any], stages: list[tuple[str, str]], path: str | Path) -> None:
    """Accuracy vs document length (log x): one line per stage and mode (sampled solid, greedy dashed),
    error bars of one standard error."""
    matplotlib.use("Agg")

    words = _syn(results)["chunk_words"]
    lengths = [str(n) for n in results["facts"]["lengths"]]
    xs = [int(n) * words for n in lengths]
    markers = "o^sdv*"
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (key, label) in enumerate(stages):
        for mode, style in (("sampled", "-"), ("greedy", "--")):
            pts = [_get(results, key, n, mode) for n in lengths]
            if not all(pts):
                continue
            ax.errorbar(xs, [p["accuracy"] for p in pts], yerr=[p["se"] for p in pts], fmt=markers[i % 6] + style,
                        color=f"C{i}", capsize=3, label=f"{label} ({mode})")
    ax.set_xscale("log")
    ax.minorticks_off()
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("document length (tokens, log scale)")
    ax.set_ylabel("held-out accuracy (%)")
    ax.set_ylim(0, 100)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_reward(rewards: list[float], path: str | Path) -> None:
    """Mean sampled training reward per RL step."""
    matplotlib.use("Agg")

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, "-")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward (sampled, T=1)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------- the MemAgent demo


MEMAGENT_STAGES = [("demonstrator", "demonstrator"), ("sft", "SFT"), ("rl", "SFT+RL")]
"""The rows of the MemAgent demo's results, in order, with their table labels."""


def _empty_note(config: dict[str, Any]) -> str:
    """How the optimal rule treats the memory before the asked fact (runs written before the option: kept)."""
    keep = config.get("sft", {}).get("keep_distractors", True)
    return " (an empty memory until the asked fact is read)" if keep is False else " (keeping the newest fact until the asked one is read)"


def memagent_markdown(results: dict[str, Any]) -> str:
    """The demo's results.md: accuracy (sampled and greedy, ± SE) per length, retention, recipe, timings."""
    c, e, t, syn = results["config"], results["config"]["eval"], results["timings"], _syn(results)
    train = (f"{syn['min_chunks']}-{syn['num_chunks']} chunks (mixed)" if syn["min_chunks"]
             else f"{syn['num_chunks']} chunks")
    parts = [
        accuracy_table(results, MEMAGENT_STAGES, gain=("sft", "rl")),
        f"Held-out synthetic tasks ({e['num_tasks']} per length, seed {e['seed']}), boxed exact match, accuracy in % "
        f"± one standard error over tasks. Sampled: {e['samples']} trajectories per task at temperature "
        f"{e['temperature']:g} (SE over the tasks' mean rewards); greedy: one per task. Gain: SFT+RL minus SFT "
        f"on the same tasks (paired SE). Cold start: SFT on a demonstrator that plays the optimal rule on "
        f"p_aware = {c['sft']['p_aware']:g} of its memory steps{_empty_note(c)} and the question-blind rule otherwise; "
        f"its own accuracy "
        f"is the demonstrator column. Training documents: {train}; {results['train']['trainer']['steps']} RL steps.",
        "",
        "Memory retention (held-out, greedy, % of tasks): the answer was in some memory (seen) / in the last one (kept).",
        "",
        retention_table(results, MEMAGENT_STAGES[1:], "greedy"),
        f"Time: init {t.get('init_s', 0):.0f}s, demonstrator eval "  # eval_demonstrator_s: before the pipeline
        f"{t.get('eval_scripted_s', t.get('eval_demonstrator_s', 0)):.0f}s, "
        f"SFT {t.get('sft_s', 0):.0f}s, SFT eval {t.get('eval_sft_s', 0):.0f}s, RL {t.get('rl_s', 0):.0f}s, "
        f"RL eval {t.get('eval_rl_s', 0):.0f}s, total {t.get('total_s', 0) / 60:.1f} min.",
    ]
    return "\n".join(parts) + "\n"


def plot_memagent(results: dict[str, Any], out: Path) -> None:
    """accuracy_vs_length.png and rl_reward.png in `out`."""
    plot_accuracy(results, MEMAGENT_STAGES, out / "accuracy_vs_length.png")
    plot_reward([h.get("reward/mean", 0.0) for h in results["history"]], out / "rl_reward.png")


# ---------------------------------------------------------------- the MemAct demo


def print_memact_eval(name: str, summary: list[dict[str, Any]]) -> None:
    """The line of one policy's held-out evaluation (its summary rows: memrl.eval.fields.summary_rows)."""
    g, s = (one(summary, decoding=d) for d in ("greedy", "sampled"))
    print(f"{name} held-out: greedy {g['accuracy']:.1f}% (+-{g['accuracy_se']:.1f}), sampled {s['accuracy']:.1f}% "
          f"(+-{s['accuracy_se']:.1f}); greedy prunes/task {g['prunes_per_task']:.2f}, overflow {g['overflow']:.1f}%")


MEMACT_ROWS = (("cold start (SFT)", "sft"), ("SFT + DCPO", "rl"))
"""The MemAct demo's policies (row label, the summary rows' policy): its table's rows and its plot's bars."""


def _memact_row(res: dict[str, Any], policy: str, decoding: str) -> dict[str, Any]:
    row = one(res["summary"], policy=policy, decoding=decoding, bucket="all")
    if row is None:
        raise KeyError(f"summary row {policy}/{decoding}")
    return dict(row)


def memact_values(res: dict[str, Any]) -> dict[str, Any]:
    """The MemAct table's computed notes: DCPO's gain per decoding, the model's size, the timings (0 if absent)."""
    t = defaultdict(int, res["timings"])
    return {"gain": {d: _memact_row(res, "rl", d)["accuracy"] - _memact_row(res, "sft", d)["accuracy"] for d in MODES},
            "params_m": res["num_parameters"] / 1e6, "t": t, "total_min": t["total_s"] / 60}


MEMACT_TABLE = RunTable(
    (("accuracy (%)", "{accuracy:.1f}"), ("+- s.e.", "{accuracy_se:.1f}"), ("2-question", "{accuracy_2q:.1f}"),
     ("3-question", "{accuracy_3q:.1f}"), ("sub-question acc. (%)", "{subq_accuracy:.1f}"),
     ("mean context (tokens)", "{mean_context_tokens:.1f}"), ("peak context (tokens)", "{peak_context_tokens:.1f}"),
     ("prunes / task", "{prunes_per_task:.2f}"), ("overflow (%)", "{overflow:.1f}")),
    MEMACT_ROWS, defaults={"accuracy_2q": 0.0, "accuracy_3q": 0.0}, values=memact_values,
    notes=("DCPO - cold start: greedy {gain[greedy]:+.1f} points, sampled {gain[sampled]:+.1f} points.",
           "Held-out: {budget[eval_tasks]} tasks (fact sheets never trained on), working-context budget "
           "{budget[max_context_tokens]} tokens (the prompt and two search results; 3-question tasks need a prune).",
           "Scripted cold-start agent (SFT tasks): accuracy {cold_start[summary][accuracy]:.1f}%, prunes/task "
           "{cold_start[summary][prunes_per_task]:.2f}, overflow {cold_start[summary][overflow]:.1f}% (it prunes "
           "late on purpose).",
           "Model: {params_m:.2f}M parameters. Time: init {t[init_s]:.0f}s, copy warm-up {t[copy_warmup_s]:.0f}s, "
           "SFT {t[sft_s]:.0f}s, SFT eval {t[eval_sft_s]:.0f}s, DCPO {t[rl_s]:.0f}s, DCPO eval {t[eval_rl_s]:.0f}s, "
           "total {total_min:.1f} min."))
"""The MemAct demo's results.md: one row per policy and decoding, then DCPO's gain, the budget, the scripted
agent and the timings."""


def plot_memact(path: Path, res: dict[str, Any]) -> None:
    """Held-out accuracy (with standard errors) and mean working context per policy; the DCPO reward curve."""
    matplotlib.use("Agg")

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    xs = range(len(MEMACT_ROWS))
    at = {(k, dec): _memact_row(res, k, dec) for _, k in MEMACT_ROWS for dec in ("greedy", "sampled")}
    for j, dec in enumerate(("greedy", "sampled")):
        accs = [at[k, dec]["accuracy"] for _, k in MEMACT_ROWS]
        ses = [at[k, dec]["accuracy_se"] for _, k in MEMACT_ROWS]
        axes[0].bar([x + 0.38 * j for x in xs], accs, 0.38, yerr=ses, capsize=3, label=dec)
        axes[1].bar([x + 0.38 * j for x in xs], [at[k, dec]["mean_context_tokens"] for _, k in MEMACT_ROWS], 0.38,
                    label=dec)
    for ax, ylabel in ((axes[0], "held-out accuracy (%)"), (axes[1], "mean working context (tokens)")):
        ax.set_xticks([x + 0.19 for x in xs], [label for label, _ in MEMACT_ROWS])
        ax.set_ylabel(ylabel)
        ax.legend(loc="upper left", fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylim(0, 100)
    top = max(r["mean_context_tokens"] for r in at.values())
    axes[1].set_ylim(0, 1.35 * top if top > 0 else 1)  # room for the legend above the bars
    steps = range(1, len(res["history"]) + 1)
    axes[2].plot(steps, [h.get("reward/mean", 0.0) for h in res["history"]], "-", label="mean reward")
    axes[2].plot(steps, [h.get("dcpo/pruned_share", 0.0) for h in res["history"]], "--", label="share that pruned")
    axes[2].set_xlabel("DCPO step")
    axes[2].set_ylim(0, 1)
    axes[2].legend()
    axes[2].grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
