"""MemAgent vs ReMemR1 on the look-back synthetic task, on CPU: same model, SFT start and RL budget.

    .venv/bin/python benchmarks/lookback_compare.py --out runs/lookback [--rl-steps 12] [--eval-n 48]

Stages (each skipped when its output exists, so a killed run resumes):
1. data: train tasks (4 pieces) and eval files eval_{N}.json for N pieces in --lengths;
2. model: a random tiny Qwen2 whose tokenizer is trained on the task's words and both prompt formats;
3. sft: ONE cold-start checkpoint trained on the scripted LookbackOracle traces of BOTH workflows
   (memrl.training.sft), so both RL runs start from the same weights;
4. rl: `Trainer` with presets lookback_memagent_cpu / lookback_rememr1_cpu (same steps, batch, n, lr);
5. eval: memrl.eval.runner.evaluate per workflow on the eval files, greedy; the SFT start and the scripted
   oracles are evaluated too, as references;
6. report: accuracy by length, recall rate and callback hit rate, into OUT/report.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import time
from pathlib import Path

PRESETS = {"memagent": "lookback_memagent_cpu", "rememr1": "lookback_rememr1_cpu"}


def train_config(workflow: str, overrides: list[str]):
    from memrl.config import load_config
    from memrl.training.config import TrainConfig

    return load_config(TrainConfig, overrides, preset=PRESETS[workflow])


def workflow_cfg(workflow: str, **extra):
    from memrl.workflows import parse_workflow

    section = dict(train_config(workflow, ["model.path=x", "data.path=x"]).workflow)
    section.update(extra)
    return parse_workflow(section)[1]


def stage_data(out: Path, args) -> None:
    from memrl.data.memagent_files import write_eval_json
    from memrl.data.synthetic_lookback import LookbackConfig, make_lookback_tasks

    d = out / "data"
    if (d / "done").exists():
        return
    d.mkdir(parents=True, exist_ok=True)
    shape = dict(chunk_words=8, facts_per_chunk=1, num_keys=16, num_values=8, fact_position="start")
    train = make_lookback_tasks(LookbackConfig(num_chunks=4, **shape), args.train_tasks, seed=1)
    write_eval_json(d / "train.json", train)
    sft = make_lookback_tasks(LookbackConfig(num_chunks=4, **shape), args.sft_tasks, seed=2)
    write_eval_json(d / "sft.json", sft)
    for n in args.lengths:
        tasks = make_lookback_tasks(LookbackConfig(num_chunks=n, **shape), args.eval_n, seed=1000 + n)
        for t in tasks:
            t.meta["num_docs"] = n
        write_eval_json(d / f"eval_{n}.json", tasks)
    (d / "done").write_text("ok")


def stage_model(out: Path) -> Path:
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
    corpus.write_text(corpus_text(extra=corpus_extra(tuple(tpls))), encoding="utf-8")
    init_tiny_model(m, "tiny", corpus=[corpus], vocab_size=2048)
    return m


def stage_sft(out: Path, model_dir: Path, args) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.io import load_tasks
    from memrl.demonstrators import LookbackOracle, ScriptedEngine
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.workflows import get_workflow
    from memrl.workflows.runner import rollout

    s = out / "sft"
    if (s / "config.json").exists():
        return s
    tok = AutoTokenizer.from_pretrained(model_dir)
    tasks = load_tasks(out / "data" / "sft.json")
    segs = []
    for wf in PRESETS:
        c = workflow_cfg(wf, temperature=0.0)
        eng = ScriptedEngine(LookbackOracle.for_config(wf, c), tokenizer=tok)
        groups = asyncio.run(rollout(tasks, get_workflow(wf), eng, c, n=1))
        acc = sum(g.rewards[0] for g in groups) / len(groups)
        rows = [x for g in groups for x in g.segments()]
        # Recalls are rare steps (~6% of the demonstrations); repeat them so the cold start learns them.
        rows += [x for x in rows if x.info.get("recall_query")] * (args.oversample_recall - 1)
        segs += rows
        print(f"sft traces {wf}: {len(rows)} rows, demonstrator accuracy {acc:.3f}")
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    t0 = time.time()

    def on_step(step: int, total: int, m: dict[str, float]) -> None:
        if step % 25 == 0 or step == total:
            print(f"sft {step}/{total} loss {m['sft/loss']:.3f} ({time.time() - t0:.0f}s)", flush=True)

    sft_train(model, segs, SFTConfig(epochs=args.sft_epochs, batch_rows=32, lr=3e-3, warmup_steps=20),
              pad_id=tok.pad_token_id, on_step=on_step)
    model.save_pretrained(s)
    tok.save_pretrained(s)
    return s


def stage_rl(out: Path, sft_dir: Path, wf: str, args) -> Path:
    from memrl.training.checkpoint import latest_checkpoint
    from memrl.training.trainer import Trainer

    run = out / f"rl_{wf}"
    cfg = train_config(wf, [f"model.path={sft_dir}", f"data.path={out / 'data' / 'train.json'}",
                            f"out_dir={run}", f"trainer.steps={args.rl_steps}", "trainer.progress=false"])
    ck = latest_checkpoint(run / "checkpoints") if (run / "checkpoints").exists() else None
    if ck is not None and (run / "done").exists():
        return ck

    def on_step(step: int, m: dict[str, float]) -> None:
        print(f"rl {wf} step {step}: reward {m.get('reward/mean', 0):.3f} "
              f"step {m.get('time/step_s', 0):.0f}s", flush=True)

    Trainer(cfg, resume=True, on_step=on_step).fit()
    (run / "done").write_text("ok")
    return latest_checkpoint(run / "checkpoints")


def stage_eval(out: Path, name: str, wf: str, model_dir: Path | None, args) -> Path:
    from memrl.engines import EngineConfig
    from memrl.eval.runner import EvalConfig, evaluate

    res = out / "eval" / name
    files = [str(out / "data" / f"eval_{n}.json") for n in args.lengths]
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
    engine = None
    if model_dir is None:  # the scripted oracle
        from transformers import AutoTokenizer

        from memrl.demonstrators import LookbackOracle, ScriptedEngine

        engine = ScriptedEngine(LookbackOracle.for_config(wf, c), tokenizer=AutoTokenizer.from_pretrained(out / "model"))
    ecfg = EvalConfig(workflow=section, engine=EngineConfig(model=str(model_dir or "oracle"), max_batch_size=256),
                      concurrency=256, name=name, progress=False)
    evaluate(files, res, ecfg, engine=engine)
    return res


def summarize(res_dir: Path) -> dict[int, dict[str, float]]:
    rows = [json.loads(x) for x in (res_dir / "results.jsonl").read_text().splitlines() if x.strip()]
    by: dict[int, list[dict]] = {}
    for r in rows:
        by.setdefault(int(r["num_docs"]), []).append(r)
    out = {}
    for n, rs in sorted(by.items()):
        steps = sum(r["metrics"].get("num_chunks", 0) for r in rs)
        recalls = sum(r["metrics"].get("recalls", 0) for r in rs)
        hits = sum(r["metrics"].get("callback_hits", 0) for r in rs)
        out[n] = {"n": len(rs), "em": 100 * sum(r["em"] for r in rs) / len(rs),
                  "recall_rate": recalls / steps if steps else 0.0,
                  "callback_hit_rate": hits / recalls if recalls else float("nan"),
                  "format_errors": sum(r["metrics"].get("format_errors", 0) for r in rs) / max(steps, 1)}
    return out


def report(out: Path, runs: list[tuple[str, str]], args) -> str:
    lines = ["| run | " + " | ".join(f"N={n}" for n in args.lengths) + " | recall rate | callback hit rate |",
             "|---|" + "---|" * len(args.lengths) + "---|---|"]
    for name, wf in runs:
        d = out / "eval" / name
        if not (d / "results.jsonl").exists():
            continue
        s = summarize(d)
        rows = [json.loads(x) for x in (d / "results.jsonl").read_text().splitlines() if x.strip()]
        st = sum(r["metrics"].get("num_chunks", 0) for r in rows)
        rc = sum(r["metrics"].get("recalls", 0) for r in rows)
        hi = sum(r["metrics"].get("callback_hits", 0) for r in rows)
        rr = f"{rc / st:.3f}" if wf == "rememr1" and st else "-"
        hr = (f"{hi / rc:.3f}" if rc else "n/a (no recalls)") if wf == "rememr1" else "-"
        accs = " | ".join(f"{s[n]['em']:.1f}" if n in s else "" for n in args.lengths)
        lines.append(f"| {name} | {accs} | {rr} | {hr} |")
    text = "\n".join(lines) + "\n"
    (out / "report.md").write_text(text, encoding="utf-8")
    return text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/lookback")
    p.add_argument("--lengths", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--train-tasks", type=int, default=2000)
    p.add_argument("--sft-tasks", type=int, default=500)
    p.add_argument("--sft-epochs", type=int, default=2)
    p.add_argument("--oversample-recall", type=int, default=1, help="repeat demonstrated recall steps k times")
    p.add_argument("--rl-steps", type=int, default=12)
    p.add_argument("--eval-n", type=int, default=48)
    p.add_argument("--stage", choices=["all", "prep", "rl-memagent", "rl-rememr1", "eval", "report"], default="all")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    import torch

    torch.set_num_threads(1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.stage in ("all", "prep"):
        stage_data(out, args)
        model = stage_model(out)
        stage_sft(out, model, args)
    sft = out / "sft"
    if args.stage in ("all", "rl-memagent"):
        stage_rl(out, sft, "memagent", args)
    if args.stage in ("all", "rl-rememr1"):
        stage_rl(out, sft, "rememr1", args)
    runs = [("oracle_memagent", "memagent"), ("oracle_rememr1", "rememr1"), ("sft_memagent", "memagent"),
            ("sft_rememr1", "rememr1"), ("rl_memagent", "memagent"), ("rl_rememr1", "rememr1")]
    if args.stage in ("all", "eval"):
        from memrl.training.checkpoint import latest_checkpoint

        for name, wf in runs:
            if name.startswith("oracle"):
                model_dir = None
            elif name.startswith("sft"):
                model_dir = sft
            else:
                root = out / name / "checkpoints"
                if not root.exists():
                    print(f"skip {name}: no checkpoint")
                    continue
                model_dir = latest_checkpoint(root)
            t0 = time.time()
            stage_eval(out, name, wf, model_dir, args)
            print(f"eval {name} done ({time.time() - t0:.0f}s)", flush=True)
    print(report(out, runs, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
