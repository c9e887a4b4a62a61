"""MemAgent vs ReMemR1 on the look-back synthetic task, on CPU: same model, SFT start and RL budget.

    .venv/bin/python benchmarks/lookback_compare.py --out runs/lookback [--rl-steps 12] [--eval-n 48]
    .venv/bin/python benchmarks/lookback_compare.py --out runs/lb3 --seeds 0,1,2 [recipe options]

Stages (each skipped when its output exists, so a killed run resumes; one directory per training seed
with --seeds, OUT/seed<k>, whose recipe.json records the training options a resume must repeat):
1. data: RL tasks (4 pieces) and SFT tasks (--sft-chunks pieces); eval files for N pieces in --lengths,
   seeded --eval-seed + N for every training seed (OUT/data/eval_s<eval seed>_n<eval n>/);
2. model: a random tiny Qwen2 whose tokenizer is trained on the task's words and both prompt formats;
3. sft: optional copy warm-up (--copy-warmup-steps), then ONE cold-start checkpoint trained on the
   scripted LookbackDemonstrator traces of BOTH workflows (recall steps repeated --oversample-recall times),
   so both RL runs start from the same weights;
4. rl: `Trainer` with presets lookback_memagent_cpu / lookback_rememr1_cpu (same steps, batch, n, lr);
5. eval: memrl.eval.runner.evaluate per policy on the eval files, greedy and (--sampled) one sample at
   temperature 1; RL ReMemR1 also with recall disabled (workflow.recall=false, the ablation); the SFT
   start and the scripted oracles are evaluated too, as references (rl and eval run with OLD_DEFAULTS,
   engine.hf.kv_cache=padded and trainer.prefix_sharing=never, as the tables of docs/results/rememr1.md);
6. report: accuracy (± s.e. over tasks) by length, recall rate and callback hit rate (OUT/eval_*/report.md);
   with --seeds, mean ± sd over the seeds, the paired gaps and the goal checks (OUT/seeds_report_*.md).

Training seed k shifts every seed the recipe trains with (tokenizer corpus and BPE, model init, copy
warm-up, SFT tasks and order, RL tasks, RL task order and sampling); seed 0 is the one-seed run.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path

PRESETS = {"memagent": "lookback_memagent_cpu", "rememr1": "lookback_rememr1_cpu"}
OLD_DEFAULTS = ["engine.hf.kv_cache=padded", "trainer.prefix_sharing=never"]
"""The defaults before 2026-11-28, with which docs/results/rememr1.md's tables were recorded: RL runs with both,
the evaluation with kv_cache=padded."""
SHAPE = dict(chunk_words=8, facts_per_chunk=1, num_keys=16, num_values=8, fact_position="start")
"""The look-back tasks' shape (memrl.data.synthetic_lookback.LookbackConfig) for training and evaluation."""


def train_config(workflow: str, overrides: list[str]):
    from memrl.config import load_config
    from memrl.training.config import TrainConfig

    return load_config(TrainConfig, overrides, preset=PRESETS[workflow])


def workflow_cfg(workflow: str, **extra):
    from memrl.workflows import parse_workflow

    section = dict(train_config(workflow, ["model.path=x", "data.path=x"]).workflow)
    section.update(extra)
    return parse_workflow(section)[1]


def task_seeds(seed: int, eval_seed: int, lengths: list[int]) -> dict[str, int]:
    """The task-stream seeds of training seed `seed`: RL tasks 1 + 2*seed, SFT tasks 2 + 2*seed (seed 0 = the
    one-seed benchmark's 1 and 2); the held-out eval tasks of length N use eval_seed + N for every training
    seed. Fails when a training stream would be an eval stream."""
    out = {"train": 1 + 2 * seed, "sft": 2 + 2 * seed}
    evals = {eval_seed + n for n in lengths}
    for k, v in out.items():
        if v in evals:
            raise SystemExit(f"--seed {seed}: the {k} task seed {v} is an eval task seed (--eval-seed {eval_seed})")
    return out


def stage_data(out: Path, args) -> None:
    from memrl.data.memagent_files import write_eval_json
    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks

    d = out / "data"
    if (d / "done").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    seeds = task_seeds(args.seed, args.eval_seed, args.lengths)
    shape = SHAPE
    train = make_lookback_tasks(LookbackConfig(num_chunks=4, **shape), args.train_tasks, seed=seeds["train"])
    write_eval_json(d / "train.json", train)
    sft = make_lookback_tasks(LookbackConfig(num_chunks=args.sft_chunks, **shape), args.sft_tasks, seed=seeds["sft"])
    write_eval_json(d / "sft.json", sft)
    (d / "done").write_text("ok")


def stage_eval_data(out: Path, args) -> Path:
    """The eval files of --eval-seed: OUT/data/eval_s<seed>_n<eval_n>/eval_<N>.json (the same for every training seed)."""
    from memrl.data.memagent_files import write_eval_json
    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks

    d = out / "data" / f"eval_s{args.eval_seed}_n{args.eval_n}"
    if (d / "done").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    for n in args.lengths:
        tasks = make_lookback_tasks(LookbackConfig(num_chunks=n, **SHAPE), args.eval_n, seed=args.eval_seed + n)
        for t in tasks:
            t.meta["num_docs"] = n
        write_eval_json(d / f"eval_{n}.json", tasks)
    (d / "done").write_text("ok")
    return d


def stage_model(out: Path, args) -> Path:
    from memrl.data.synthetic import corpus_text
    from memrl.data.synthetic_lookback import corpus_extra
    from memrl.models.tiny import init_tiny_model

    m = out / "model"
    if (m / "memrl_model.json").exists():
        return m
    tpls = []
    for wf in PRESETS:
        c = workflow_cfg(wf)
        mem, fin = c.templates()
        tpls += [mem.text, fin.text]
    corpus = out / "corpus.txt"
    # the training seed shifts the tokenizer corpus, the BPE and the model init (seed 0 = the one-seed run)
    corpus.write_text(corpus_text(seed=args.seed, extra=corpus_extra(tuple(tpls))), encoding="utf-8")
    init_tiny_model(m, "tiny", corpus=[corpus], vocab_size=2048, seed=args.seed)
    return m


def stage_sft(out: Path, model_dir: Path, args) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.io import load_tasks
    from memrl.demonstrators import LookbackDemonstrator, ScriptedEngine
    from memrl.runtime import rollout_once
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.workflows import get_workflow

    s = out / "sft"
    if (s / "config.json").exists():
        return s
    tok = AutoTokenizer.from_pretrained(model_dir)
    tasks = load_tasks(out / "data" / "sft.json")
    segs = []
    for wf in PRESETS:
        c = workflow_cfg(wf, temperature=0.0)
        eng = ScriptedEngine(LookbackDemonstrator.for_config(wf, c), tokenizer=tok)
        groups = rollout_once(tasks, get_workflow(wf), eng, c, n=1)
        acc = sum(g.rewards[0] for g in groups) / len(groups)
        rows = [x for g in groups for x in g.segments()]
        n_recall = sum(1 for x in rows if x.info.get("recall_query"))
        # Recalls are rare steps (~6% of the demonstrations); repeat them so the cold start learns them.
        rows += [x for x in rows if x.info.get("recall_query")] * (args.oversample_recall - 1)
        segs += rows
        print(f"sft traces {wf}: {len(rows)} rows ({n_recall} recall steps x{args.oversample_recall}), "
              f"demonstrator accuracy {acc:.3f}", flush=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    t0 = time.time()
    if args.copy_warmup_steps:
        from memrl.demos.cold_start import copy_warmup

        copy_warmup(model, tok, args.copy_warmup_steps, args.copy_warmup_rows, args.copy_warmup_lr, args.seed,
                    out / "copy_warmup", progress=False)
        print(f"copy warm-up: {args.copy_warmup_steps} steps ({time.time() - t0:.0f}s)", flush=True)

    def on_step(step: int, total: int, m: dict[str, float]) -> None:
        if step % 25 == 0 or step == total:
            print(f"sft {step}/{total} loss {m['sft/loss']:.3f} ({time.time() - t0:.0f}s)", flush=True)

    sft_train(model, segs, SFTConfig(epochs=args.sft_epochs, batch_rows=32, lr=args.sft_lr, warmup_steps=20,
                                     seed=args.seed),
              pad_id=tok.pad_token_id, on_step=on_step)
    model.save_pretrained(s)
    tok.save_pretrained(s)
    return s


def stage_rl(out: Path, sft_dir: Path, wf: str, args) -> Path:
    from memrl.training.assemble import assemble
    from memrl.training.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    run = out / f"rl_{wf}"
    base = train_config(wf, ["model.path=x", "data.path=x"])
    ov = [f"model.path={sft_dir}", f"data.path={out / 'data' / 'train.json'}", f"out_dir={run}",
          f"trainer.steps={args.rl_steps}", "trainer.progress=false", *OLD_DEFAULTS,
          # training seed k shifts the RL task order and the RL sampling (k = 0: the presets' own)
          f"data.seed={base.data.seed + args.seed}", f"trainer.seed={base.trainer.seed + args.seed}"]
    if args.rl_lr is not None:
        ov.append(f"optim.lr={args.rl_lr}")
    if args.rl_batch is not None:
        ov.append(f"trainer.batch_size={args.rl_batch}")
    cfg = train_config(wf, ov)
    ck = latest_checkpoint(run / "checkpoints") if (run / "checkpoints").exists() else None
    if ck is not None and (run / "done").exists():
        return ck

    def on_step(step: int, m: dict[str, float]) -> None:
        print(f"rl {wf} step {step}: reward {m.get('reward/mean', 0):.3f} "
              f"step {m.get('time/step_s', 0):.0f}s", flush=True)

    Trainer(assemble(cfg, resume=True), on_step=on_step).fit()
    (run / "done").write_text("ok")
    return latest_checkpoint(run / "checkpoints")


def stage_eval(out: Path, name: str, wf: str, model_dir: Path | None, args, *, sampled: bool = False,
               recall: bool = True) -> Path:
    from memrl.engines import EngineConfig, HFSection
    from memrl.eval.runner import EvalConfig, evaluate

    res = eval_dir(out, args) / (name + ("_sampled" if sampled else ""))
    if (res / "done").exists():
        return res
    files = [str(stage_eval_data(out, args) / f"eval_{n}.json") for n in args.lengths]
    c = workflow_cfg(wf)
    tdir = out / "templates" / wf
    tdir.mkdir(parents=True, exist_ok=True)
    mem, fin = c.templates()
    # a template file's text is used exactly (template_strip=false): write the prompt text, no final newline
    (tdir / "memory.txt").write_text(mem.text, encoding="utf-8", newline="")
    (tdir / "final.txt").write_text(fin.text, encoding="utf-8", newline="")
    keep = ("chunk_tokens", "max_memory_tokens", "max_final_tokens", "scorer")
    section = {"name": wf, **{k: getattr(c, k) for k in keep if hasattr(c, k)},
               "memory_template_file": str(tdir / "memory.txt"), "final_template_file": str(tdir / "final.txt")}
    if sampled:
        section["temperature"] = 1.0  # one sample per task at temperature 1 (eval seed 0: the same coins per run)
    if not recall:
        section["recall"] = False  # the ablation: queries retrieve nothing
    engine = None
    if model_dir is None:  # the scripted oracle
        from transformers import AutoTokenizer

        from memrl.demonstrators import LookbackDemonstrator, ScriptedEngine

        engine = ScriptedEngine(LookbackDemonstrator.for_config(wf, c), tokenizer=AutoTokenizer.from_pretrained(out / "model"))
    ecfg = EvalConfig(workflow=section, engine=EngineConfig(model=str(model_dir or "oracle"), max_batch_size=256,
                                                            hf=HFSection(kv_cache="padded")),  # OLD_DEFAULTS
                      concurrency=256, name=res.name, progress=False)
    evaluate(files, res, ecfg, engine=engine)
    (res / "done").write_text("ok")
    return res


def eval_dir(out: Path, args) -> Path:
    """Where one training seed's evaluations on the --eval-seed tasks go: OUT/eval_s<seed>_n<eval_n>."""
    d = out / f"eval_s{args.eval_seed}_n{args.eval_n}"
    d.mkdir(parents=True, exist_ok=True)
    return d


def summarize(res_dir: Path) -> dict[int, dict[str, float]]:
    """Per length N: n tasks, em (%), its standard error over tasks (%), recall rate (recalls / memory steps),
    callback hit rate (hits / recalls; nan without recalls), and format errors per memory step."""
    rows = [json.loads(x) for x in (res_dir / "results.jsonl").read_text().splitlines() if x.strip()]
    by: dict[int, list[dict]] = {}
    for r in rows:
        by.setdefault(int(r["num_docs"]), []).append(r)
    out = {}
    for n, rs in sorted(by.items()):
        steps = sum(r["metrics"].get("num_chunks", 0) for r in rs)
        recalls = sum(r["metrics"].get("recalls", 0) for r in rs)
        hits = sum(r["metrics"].get("callback_hits", 0) for r in rs)
        p = sum(r["em"] for r in rs) / len(rs)
        out[n] = {"n": len(rs), "em": 100 * p, "se": 100 * math.sqrt(p * (1 - p) / len(rs)),
                  "steps": steps, "recalls": recalls, "hits": hits,
                  "recall_rate": recalls / steps if steps else 0.0,
                  "callback_hit_rate": hits / recalls if recalls else float("nan"),
                  "format_errors": sum(r["metrics"].get("format_errors", 0) for r in rs) / max(steps, 1)}
    return out


# (run name, workflow, recall on) of every evaluated policy; the oracles are scripted references
RUNS = (("oracle_memagent", "memagent", True), ("oracle_rememr1", "rememr1", True),
        ("sft_memagent", "memagent", True), ("sft_rememr1", "rememr1", True),
        ("rl_memagent", "memagent", True), ("rl_rememr1", "rememr1", True),
        ("rl_rememr1_norecall", "rememr1", False))
MODES = ("greedy", "sampled")


def seed_summary(out: Path, args) -> dict:
    """{run: {mode: {"by_length": summarize(...), "recall_rate", "callback_hit_rate" (pooled over lengths)}}}
    of one training seed's evaluations (what exists)."""
    table: dict = {}
    for name, _, _ in RUNS:
        for mode in MODES:
            d = eval_dir(out, args) / (name + ("_sampled" if mode == "sampled" else ""))
            if not (d / "results.jsonl").exists():
                continue
            s = summarize(d)
            steps = sum(v["steps"] for v in s.values())
            rc = sum(v["recalls"] for v in s.values())
            hi = sum(v["hits"] for v in s.values())
            table.setdefault(name, {})[mode] = {
                "by_length": {str(n): v for n, v in s.items()},
                "recall_rate": rc / steps if steps else 0.0,
                "callback_hit_rate": hi / rc if rc else None}
    return table


def report(out: Path, args) -> str:
    """OUT/report.md: one seed's accuracy (± s.e. over tasks) by length, recall and callback hit rates."""
    table = seed_summary(out, args)
    lines = []
    for mode in MODES:
        lines += [f"{mode}:", "", "| run | " + " | ".join(f"N={n}" for n in args.lengths)
                  + " | recall rate | callback hit rate |", "|---|" + "---|" * len(args.lengths) + "---|---|"]
        for name, wf, _ in RUNS:
            e = table.get(name, {}).get(mode)
            if e is None:
                continue
            bl = e["by_length"]
            accs = " | ".join(f"{bl[str(n)]['em']:.1f} ± {bl[str(n)]['se']:.1f}" if str(n) in bl else ""
                              for n in args.lengths)
            rr = f"{e['recall_rate']:.3f}" if wf == "rememr1" else "-"
            hr = "-" if wf != "rememr1" else ("n/a (no recalls)" if e["callback_hit_rate"] is None
                                             else f"{e['callback_hit_rate']:.3f}")
            lines.append(f"| {name} | {accs} | {rr} | {hr} |")
        lines.append("")
    text = "\n".join(lines)
    (eval_dir(out, args) / "report.md").write_text(text, encoding="utf-8")
    (eval_dir(out, args) / "summary.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    return text


def aggregate(tables: dict[int, dict], lengths: list[int]) -> dict:
    """Mean ± sd over training seeds (memrl.demos.seeds.mean_sd, sd with ddof 1) of every run's accuracy per
    length and mode, its recall and callback hit rates, the per-seed gaps the goals name, and the goals.

    `tables`: {seed: seed_summary(...)}. A hit rate is averaged over the seeds that recalled at all."""
    from memrl.demos.seeds import mean_sd

    seeds = sorted(tables)
    agg: dict = {"seeds": seeds, "runs": {}, "gaps": {}, "goals": {}}
    for name, _, _ in RUNS:
        for mode in MODES:
            per = [tables[s][name][mode] for s in seeds if mode in tables[s].get(name, {})]
            if not per:
                continue
            cell = {"n_seeds": len(per),
                    "em": {str(n): mean_sd([p["by_length"][str(n)]["em"] for p in per]) for n in lengths},
                    "se_tasks": {str(n): math.fsum(p["by_length"][str(n)]["se"] for p in per) / len(per)
                                 for n in lengths},
                    "recall_rate": mean_sd([p["recall_rate"] for p in per]),
                    "callback_hit_rate": mean_sd([p["callback_hit_rate"] for p in per
                                                  if p["callback_hit_rate"] is not None])}
            agg["runs"].setdefault(name, {})[mode] = cell

    def gap(a: str, b: str, mode: str, n: int) -> dict | None:
        both = [s for s in seeds if mode in tables[s].get(a, {}) and mode in tables[s].get(b, {})]
        if not both:
            return None
        return mean_sd([tables[s][a][mode]["by_length"][str(n)]["em"] - tables[s][b][mode]["by_length"][str(n)]["em"]
                        for s in both])

    for mode in MODES:
        g = {}
        for n in lengths:
            g[f"ablation_drop_N{n}"] = gap("rl_rememr1", "rl_rememr1_norecall", mode, n)
            g[f"rememr1_minus_memagent_N{n}"] = gap("rl_rememr1", "rl_memagent", mode, n)
        agg["gaps"][mode] = g
        rl = agg["runs"].get("rl_rememr1", {}).get(mode)
        goals = {}
        if rl is not None:
            rr, hr = rl["recall_rate"]["mean"], rl["callback_hit_rate"]["mean"]
            goals["recall rate > 0"] = (rr, rr is not None and rr > 0)
            goals["callback hit rate > 0.5"] = (hr, hr is not None and hr > 0.5)
        for n in (8, 16):
            d = g.get(f"ablation_drop_N{n}")
            if d is not None:
                goals[f"recall off drops accuracy >= 10 at N={n}"] = (d["mean"], d["mean"] >= 10)
        d = g.get("rememr1_minus_memagent_N16")
        if d is not None:
            goals["RL ReMemR1 - RL MemAgent >= 10 at N=16"] = (d["mean"], d["mean"] >= 10)
        agg["goals"][mode] = goals
    return agg


def _fmt(c: dict | None, digits: int = 1, sign: bool = False) -> str:
    """memrl.demos.seeds.fmt, with "n/a" for a cell no seed had (no recalls, a missing run)."""
    from memrl.demos.seeds import fmt

    return "n/a" if c is None or c["mean"] is None else fmt(c, sign=sign, digits=digits)


def aggregate_markdown(agg: dict, lengths: list[int], command: str = "") -> str:
    """The multi-seed table: accuracy (%) mean ± sd over training seeds per run, length and decoding, the
    recall and callback hit rates, the gaps and the goals (met / missed, with the value reached)."""
    seeds = ", ".join(map(str, agg["seeds"]))
    lines = [f"`{command}`", ""] if command else []
    lines += [f"Mean ± sd over training seeds {seeds} (n = {len(agg['seeds'])}); the evaluation tasks are the same "
              "for every seed. s.e. = the mean standard error over tasks of one seed's cell.", ""]
    for mode in MODES:
        if not any(mode in v for v in agg["runs"].values()):
            continue
        lines += [f"{mode}:", "", "| run | " + " | ".join(f"N={n}" for n in lengths) + " | recall rate | "
                  "callback hit rate |", "|---|" + "---:|" * len(lengths) + "---:|---:|"]
        for name, wf, _ in RUNS:
            c = agg["runs"].get(name, {}).get(mode)
            if c is None:
                continue
            accs = " | ".join(_fmt(c["em"][str(n)]) for n in lengths)
            rr = _fmt(c["recall_rate"], 3) if wf == "rememr1" else "-"
            hr = _fmt(c["callback_hit_rate"], 3) if wf == "rememr1" else "-"
            label = name if c["n_seeds"] == len(agg["seeds"]) else f"{name} (n = {c['n_seeds']})"
            lines.append(f"| {label} | {accs} | {rr} | {hr} |")
        se = agg["runs"].get("rl_rememr1", {}).get(mode, {}).get("se_tasks")
        if se:
            lines += ["", "s.e. over tasks (rl_rememr1, one seed): "
                      + ", ".join(f"N={n} {se[str(n)]:.1f}" for n in lengths)]
        g = agg["gaps"].get(mode, {})
        lines += ["", "| gap (points, paired per seed) | " + " | ".join(f"N={n}" for n in lengths) + " |",
                  "|---|" + "---:|" * len(lengths)]
        for label, key in (("rl_rememr1 - rl_rememr1_norecall", "ablation_drop"),
                           ("rl_rememr1 - rl_memagent", "rememr1_minus_memagent")):
            lines.append(f"| {label} | " + " | ".join(_fmt(g.get(f"{key}_N{n}"), sign=True) for n in lengths) + " |")
        lines += ["", "| goal | reached (mean over seeds) | status |", "|---|---:|---|"]
        for goal, (val, ok) in agg["goals"].get(mode, {}).items():
            v = "n/a" if val is None else f"{val:.3f}" if "rate" in goal else f"{val:+.1f}"
            lines.append(f"| {goal} | {v} | {'met' if ok else 'MISSED'} |")
        lines.append("")
    return "\n".join(lines)


RECIPE_KEYS = ("seed", "train_tasks", "sft_tasks", "sft_chunks", "sft_epochs", "sft_lr", "oversample_recall",
               "copy_warmup_steps", "copy_warmup_rows", "copy_warmup_lr", "rl_steps", "rl_lr", "rl_batch")
"""The options a seed directory's trained stages depend on (OUT/recipe.json): a resume must use the same."""


def check_recipe(out: Path, args) -> None:
    """Write OUT/recipe.json, or fail in one line when it exists with other training options."""
    want = {k: getattr(args, k) for k in RECIPE_KEYS}
    path = out / "recipe.json"
    if path.exists():
        got = json.loads(path.read_text(encoding="utf-8"))
        diff = next((k for k in RECIPE_KEYS if got.get(k) != want[k]), None)
        if diff is not None:
            raise SystemExit(f"{path}: {diff} is {got.get(diff)!r}, this run has {want[diff]!r} (use another --out)")
        return
    path.write_text(json.dumps(want, indent=1) + "\n", encoding="utf-8")


def run_seed(out: Path, args) -> dict:
    """Every stage of one training seed into `out` (each skipped when its output exists); its summary."""
    from memrl.training.checkpoint import latest_checkpoint

    out.mkdir(parents=True, exist_ok=True)
    check_recipe(out, args)
    t_start = time.time()
    if args.stage in ("all", "prep"):
        stage_data(out, args)
        model = stage_model(out, args)
        stage_sft(out, model, args)
        print(f"[seed {args.seed}] prep done ({time.time() - t_start:.0f}s)", flush=True)
    sft = out / "sft"
    for wf in PRESETS:
        if args.stage in ("all", f"rl-{wf}"):
            t0 = time.time()
            stage_rl(out, sft, wf, args)
            print(f"[seed {args.seed}] rl {wf} done ({time.time() - t0:.0f}s)", flush=True)
    if args.stage in ("all", "eval"):
        for name, wf, recall in RUNS:
            if name.startswith("oracle"):
                if not args.oracles:
                    continue
                model_dir = None
            elif name.startswith("sft"):
                model_dir = sft
            else:
                root = out / ("rl_" + wf) / "checkpoints"
                if not root.exists():
                    print(f"skip {name}: no checkpoint")
                    continue
                model_dir = latest_checkpoint(root)
            for mode in MODES:
                if mode == "sampled" and (model_dir is None or not args.sampled):
                    continue  # the oracles are deterministic
                t0 = time.time()
                stage_eval(out, name, wf, model_dir, args, sampled=mode == "sampled", recall=recall)
                print(f"[seed {args.seed}] eval {name} {mode} done ({time.time() - t0:.0f}s)", flush=True)
    text = report(out, args)
    print(text, flush=True)
    wall = out / "wall_s.json"
    prev = json.loads(wall.read_text()) if wall.exists() else {"wall_s": 0.0}
    wall.write_text(json.dumps({"wall_s": prev["wall_s"] + time.time() - t_start}) + "\n")
    return seed_summary(out, args)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/lookback")
    p.add_argument("--seed", type=int, default=0, help="training seed: shifts model init, tokenizer, SFT and RL "
                   "tasks, SFT order, RL order and sampling; never the eval tasks")
    p.add_argument("--seeds", default="", help="comma-separated training seeds: one run per seed in OUT/seed<k>, "
                   "then OUT/seeds_report.md (mean ± sd)")
    p.add_argument("--eval-seed", type=int, default=1000, help="eval tasks of length N use seed EVAL_SEED + N "
                   "(1000: the held-out tasks; tune on another, e.g. 5000)")
    p.add_argument("--lengths", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--train-tasks", type=int, default=2000)
    p.add_argument("--sft-tasks", type=int, default=500)
    p.add_argument("--sft-chunks", type=int, default=4, help="pieces per SFT task")
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--sft-lr", type=float, default=3e-3)
    p.add_argument("--oversample-recall", type=int, default=1, help="repeat demonstrated recall steps k times")
    p.add_argument("--copy-warmup-steps", type=int, default=0, help="copy warm-up steps before the cold start "
                   "(memrl.demos.cold_start.copy_warmup; 0 = none)")
    p.add_argument("--copy-warmup-rows", type=int, default=32)
    p.add_argument("--copy-warmup-lr", type=float, default=1e-3)
    p.add_argument("--rl-steps", type=int, default=12)
    p.add_argument("--rl-lr", type=float, default=None, help="RL learning rate (default: the presets' 3e-4)")
    p.add_argument("--rl-batch", type=int, default=None, help="RL tasks per step (default: the presets' 8)")
    p.add_argument("--eval-n", type=int, default=48)
    p.add_argument("--sampled", action=argparse.BooleanOptionalAction, default=True,
                   help="also evaluate sampled (temperature 1, one sample per task)")
    p.add_argument("--oracles", action=argparse.BooleanOptionalAction, default=True,
                   help="evaluate the scripted oracles (references; with --seeds only for the first seed)")
    p.add_argument("--stage", choices=["all", "prep", "rl-memagent", "rl-rememr1", "eval", "report"], default="all")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if not args.seeds:
        run_seed(out, args)
        return 0
    from memrl.config import ConfigError
    from memrl.demos.seeds import parse_seeds

    try:
        seeds = parse_seeds(args.seeds)
    except ConfigError as e:
        raise SystemExit(str(e)) from None
    tables = {}
    oracles = args.oracles
    for i, k in enumerate(seeds):
        args.seed, args.oracles = k, oracles and i == 0
        print(f"=== training seed {k} -> {out / f'seed{k}'}", flush=True)
        tables[k] = run_seed(out / f"seed{k}", args)
    agg = aggregate(tables, args.lengths)
    walls = {k: json.loads((out / f"seed{k}" / "wall_s.json").read_text())["wall_s"] for k in seeds}
    command = "python benchmarks/lookback_compare.py " + " ".join(sys.argv[1:])
    text = aggregate_markdown(agg, args.lengths, command)
    text += "\nWall time per seed (s, this process's stages): " + ", ".join(
        f"seed {k} {w:.0f}" for k, w in walls.items()) + "\n"
    (out / f"seeds_report_s{args.eval_seed}_n{args.eval_n}.md").write_text(text, encoding="utf-8")
    (out / f"seeds_report_s{args.eval_seed}_n{args.eval_n}.json").write_text(json.dumps({**agg, "command": command, "wall_s": walls}, indent=1,
                                                      default=str) + "\n", encoding="utf-8")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
