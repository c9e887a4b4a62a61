"""Markdown tables and matplotlib plots from a demo's results dict (the content of results.json).

The dict: `lengths` (evaluated lengths, in chunks), `recipe.train_chunks`, `recipe.chunk_words`, and
`stages`: {stage: {length (str): {mode: EvalResult.to_json()}}} with modes "greedy" / "sampled". Stages
are named by the caller (the MemAgent demo: demonstrator, sft, rl); the gain columns compare two of them
on the same tasks (paired standard error, `memrl.demos.evaluation.paired_gain`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from memrl.demos.evaluation import paired_gain

MODES = ("sampled", "greedy")


def cell(res: dict[str, Any] | None) -> str:
    """"45.3 ± 2.1" (accuracy ± one standard error, percent), "-" when not evaluated."""
    return "-" if res is None else f"{res['accuracy']:.1f} ± {res['se']:.1f}"


def gain_cell(before: dict[str, Any] | None, after: dict[str, Any] | None) -> str:
    """"+12.3 ± 2.0": the paired gain in points and its standard error, "-" when either is missing."""
    if before is None or after is None:
        return "-"
    g, se = paired_gain(before["per_task"], after["per_task"])
    return f"{g:+.1f} ± {se:.1f}"


def accuracy_table(results: dict[str, Any], stages: list[tuple[str, str]], gain: tuple[str, str] | None) -> str:
    """One row per length; for each mode the stages' accuracy ± SE and, with `gain` = (before, after), the
    paired gain. Columns of a stage/mode that was not evaluated anywhere are left out."""
    st = results["stages"]
    lengths = [str(n) for n in results["lengths"]]
    train, words = results["recipe"]["train_chunks"], results["recipe"]["chunk_words"]

    def get(stage: str, n: str, mode: str) -> dict[str, Any] | None:
        return st.get(stage, {}).get(n, {}).get(mode)

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
    st = results["stages"]
    lengths = [str(n) for n in results["lengths"]]
    present = [(k, label) for k, label in stages if any(st.get(k, {}).get(n, {}).get(mode) for n in lengths)]
    head = ["length (chunks)"] + [f"{label} {w}" for _, label in present for w in ("seen", "kept")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for n in lengths:
        row = [n]
        for k, _ in present:
            m = st[k][n][mode]["metrics"]
            row += [f"{m.get('answer_seen', 0.0):.1f}%", f"{m.get('answer_kept', 0.0):.1f}%"]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def plot_accuracy(results: dict[str, Any], stages: list[tuple[str, str]], path: str | Path) -> None:
    """Accuracy vs document length (log x): one line per stage and mode (sampled solid, greedy dashed),
    error bars of one standard error."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    st, words = results["stages"], results["recipe"]["chunk_words"]
    lengths = [str(n) for n in results["lengths"]]
    xs = [int(n) * words for n in lengths]
    markers = "o^sdv*"
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, (key, label) in enumerate(stages):
        for mode, style in (("sampled", "-"), ("greedy", "--")):
            pts = [st.get(key, {}).get(n, {}).get(mode) for n in lengths]
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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(range(1, len(rewards) + 1), rewards, "-")
    ax.set_xlabel("RL step")
    ax.set_ylabel("mean reward (sampled, T=1)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
