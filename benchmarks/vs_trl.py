"""memrl against TRL, side by side: single-turn GRPO (memrl's `full_context` workflow against TRL's GRPOTrainer)
on the same model, prompts, group size, completion length, steps, dtype and threads, in one invocation.

  .venv/bin/python benchmarks/vs_trl.py --trl-python .venv-trl/bin/python [--model DIR] [--steps 4]
      [--prompts 1] [--n 4] [--max-tokens 32] [--lr 1e-6] [--threads 1] [--out runs/vs_trl] [--order memrl,trl]
      [KEY=VALUE ...]   (more `memrl train` overrides, memrl side only)

TRL is not a memrl dependency: make its virtualenv with `bash scripts/install_trl.sh` (.venv-trl).
Each side runs in its own subprocess (memrl: `memrl train`; TRL: this file with `--side trl` under the TRL
venv's python); the peak RSS is that child's (os.wait4's ru_maxrss). Measured per step:
  step s           wall time of the step (memrl time/step_s; TRL on_step_begin -> on_step_end)
  gen tok/s        generated tokens / generation time (memrl time/rollout_s; TRL the time in model.generate)
  update tok/s     prompt + completion tokens of the step's rows / (step time - generation time)
  reward           mean reward of the step's completions (the same verifier, `lenient` below, on both sides)
Settings matched on both: full fine-tuning, float32, AdamW at --lr with no warmup, constant schedule, temperature
1.0, top_p 1, no KL (beta 0), no gradient checkpointing (TRL's default turns it on: --trl-gradient-checkpointing), one optimizer step per generation batch (no PPO epochs), group-mean advantages
without std scaling, token-mean loss over the step's rows. The prompt text is memrl's (chat template applied);
TRL receives it as a plain-text prompt.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = Path.home() / ".cache" / "memrl" / "hf" / "smollm2-135m-instruct"

try:  # the memrl side names `vs_trl:lenient` as workflow.reward, which must be a marked verifier
    from memrl.rewards.verifiers import verifier
except ImportError:  # the TRL venv has no memrl dependencies: the function is used unmarked there
    def verifier(fn):  # type: ignore[no-untyped-def]
        return fn


def _normalize(text: str) -> str:
    """memrl's SQuAD normalization (memrl/rewards/qa.py, stdlib only), loaded by path so the TRL venv can use
    the same code without memrl's dependencies."""
    mod = sys.modules.get("_memrl_qa")
    if mod is None:
        spec = importlib.util.spec_from_file_location("_memrl_qa", ROOT / "memrl" / "rewards" / "qa.py")
        assert spec and spec.loader
        mod = importlib.util.module_from_spec(spec)
        sys.modules["_memrl_qa"] = mod
        spec.loader.exec_module(mod)
    return mod.normalize_answer(text)


@verifier
def lenient(response_text: str, golds: str | list[str]) -> float:
    """1.0 when a normalized gold answer occurs anywhere in the normalized reply (the lenient reader of
    benchmarks/real_model_rl.py): a reward the untuned model earns now and then, so both sides update (the
    zero-shot model boxes no answer, and an all-zero group has no gradient)."""
    golds = [golds] if isinstance(golds, str) else list(golds)
    t = _normalize(response_text or "")
    return float(any(_normalize(g) and _normalize(g) in t for g in golds))


# ----------------------------------------------------------------------------------------------- data


def build_prompts(args: argparse.Namespace, out: Path) -> Path:
    """HotpotQA dev questions at 2 documents (`memrl data build`), rendered with memrl's full_context prompt and
    the model's chat template: prompts.jsonl (prompt text, answers) for TRL, train.json for memrl."""
    data = out / "data"
    if not (data / "eval_2.json").is_file():
        if args.hotpot is None:  # the default: the file `memrl data fetch` keeps, looked up only when needed
            from memrl.data.fetch import fetched_path  # noqa: PLC0415
            from memrl.errors import UserError  # noqa: PLC0415

            try:
                args.hotpot = str(fetched_path("hotpotqa_dev_distractor"))
            except UserError as e:
                raise SystemExit(f"--hotpot: {e} (or pass --hotpot FILE)") from None
        sh([sys.executable, "-m", "memrl.cli", "data", "build", "--kind", "hotpotqa", "--source", str(args.hotpot),
            "--docs", "2", "--num-questions", str(args.steps * args.prompts), "--seed", "0", "--out", str(data)])
    from transformers import AutoTokenizer

    from memrl.quiet import encode_document
    from memrl.workflows.full_context import FULL_CONTEXT_TEMPLATE
    from memrl.workflows.templates import chat_prompt, load_template

    tok = AutoTokenizer.from_pretrained(args.model)
    tpl = load_template("full_context", ("problem", "context"), None, FULL_CONTEXT_TEMPLATE)
    rows = json.loads((data / "eval_2.json").read_text())[: args.steps * args.prompts]
    (out / "train.json").write_text(json.dumps(rows))
    with (out / "prompts.jsonl").open("w") as f:
        for r in rows:
            ctx = tok.decode(encode_document(tok, r["context"]))  # as full_context: encoded, then decoded
            text, _ = chat_prompt(tok, tpl.render(problem=r["input"], context=ctx))
            f.write(json.dumps({"prompt": text, "answers": r["answers"]}) + "\n")
    return out / "prompts.jsonl"


# ----------------------------------------------------------------------------------------------- sides


def sh(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    if subprocess.run(cmd, cwd=ROOT, check=False).returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")


def child_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks")]))
    return env


def run_child(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float, float]:
    """(wall seconds, peak RSS in MiB, CPU seconds user + system) of one child process (its own rusage, from
    os.wait4): on a shared machine the CPU seconds move much less with the other jobs' load than wall time."""
    print("+", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        _, status, ru = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"failed ({proc.returncode}), see {log}")
    return time.perf_counter() - t0, ru.ru_maxrss / 1024, ru.ru_utime + ru.ru_stime


def memrl_cmd(args: argparse.Namespace, out: Path) -> list[str]:
    return [sys.executable, "-m", "memrl.cli", "train", f"model.path={args.model}", "data.name=file",
            f"data.path={out / 'train.json'}", "workflow=full_context", f"workflow.max_final_tokens={args.max_tokens}",
            "workflow.temperature=1.0", "workflow.reward=vs_trl:lenient", "algorithm=grpo", f"algorithm.n={args.n}",
            "algorithm.grpo.norm_by_std=false", "algorithm.loss_agg=token-mean", "algorithm.kl_coef=0",
            f"trainer.batch_size={args.prompts}", f"trainer.steps={args.steps}", f"optim.lr={args.lr}",
            "optim.warmup_steps=0", "optim.weight_decay=0", "model.compute_dtype=float32", f"trainer.seed={args.seed}",
            f"trainer.skip_zero_advantage={str(args.memrl_skip_zero).lower()}",
            f"out_dir={out / 'memrl'}", *args.memrl_overrides, "--overwrite"]


def memrl_steps(out: Path) -> list[dict]:
    rows = []
    for ln in (out / "memrl" / "metrics.jsonl").read_text().splitlines():
        if not ln.strip():
            continue
        m = json.loads(ln)
        gen = m.get("time/rollout_s", float("nan"))
        step = m.get("time/step_s", float("nan"))
        gen_tokens = m.get("rollout/generated_tokens", 0.0)
        rows.append({"step": m["step"], "step_s": step, "gen_s": gen, "gen_tokens": gen_tokens,
                     "update_tokens": m.get("train/tokens", 0.0), "reward": m.get("reward/mean", float("nan"))})
    return rows


def trl_side(args: argparse.Namespace) -> None:
    """Runs in the TRL venv: GRPOTrainer over prompts.jsonl; one json line per step into steps.jsonl."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    rows = [json.loads(ln) for ln in (out / "prompts.jsonl").read_text().splitlines() if ln.strip()]
    ds = Dataset.from_list(rows)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    per_step = args.prompts * args.n
    cfg = GRPOConfig(output_dir=str(out / "trl"), use_cpu=True, bf16=False, fp16=False, report_to="none",
                     max_steps=args.steps, per_device_train_batch_size=per_step, gradient_accumulation_steps=1,
                     num_generations=args.n, max_completion_length=args.max_tokens, temperature=1.0, top_p=1.0,
                     beta=0.0, num_iterations=1, scale_rewards="none", loss_type="dapo", learning_rate=args.lr,
                     lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, logging_steps=1,
                     save_strategy="no", seed=args.seed, dataloader_num_workers=0, max_grad_norm=1.0,
                     gradient_checkpointing=args.trl_gradient_checkpointing)
    stat = {"gen_s": 0.0, "gen_tokens": 0, "update_tokens": 0, "rewards": []}

    def reward(prompts, completions, answers, completion_ids=None, **kw):  # noqa: ANN001, ANN202
        rs = [lenient(c, a) for c, a in zip(completions, answers, strict=True)]
        stat["rewards"] += rs
        ids = completion_ids or [tok(c, add_special_tokens=False)["input_ids"] for c in completions]
        n_gen = sum(len(i) for i in ids)
        stat["gen_tokens"] += n_gen
        stat["update_tokens"] += n_gen + sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts)
        return rs

    trainer = GRPOTrainer(model=model, reward_funcs=[reward], args=cfg, train_dataset=ds, processing_class=tok)
    gen = model.generate

    def timed_generate(*a, **kw):  # noqa: ANN002, ANN003, ANN202
        t = time.perf_counter()
        try:
            return gen(*a, **kw)
        finally:
            stat["gen_s"] += time.perf_counter() - t

    model.generate = timed_generate
    log = (out / "trl_steps.jsonl").open("w")

    class Steps(TrainerCallback):
        def on_step_begin(self, a, state, control, **kw):  # noqa: ANN001, ANN202
            stat.update(t=time.perf_counter(), gen_s=0.0, gen_tokens=0, update_tokens=0, rewards=[])

        def on_step_end(self, a, state, control, **kw):  # noqa: ANN001, ANN202
            r = stat["rewards"]
            log.write(json.dumps({"step": state.global_step, "step_s": time.perf_counter() - stat["t"],
                                  "gen_s": stat["gen_s"], "gen_tokens": stat["gen_tokens"],
                                  "update_tokens": stat["update_tokens"],
                                  "reward": sum(r) / len(r) if r else float("nan")}) + "\n")
            log.flush()

    trainer.add_callback(Steps())
    trainer.train()


def trl_steps(out: Path) -> list[dict]:
    return [json.loads(ln) for ln in (out / "trl_steps.jsonl").read_text().splitlines() if ln.strip()]


# ----------------------------------------------------------------------------------------------- table


def summarize(rows: list[dict], skip_first: bool = True) -> dict[str, float]:
    """Medians over the steps (the first one left out when there are more: warm-up)."""
    use = rows[1:] if skip_first and len(rows) > 1 else rows
    med = lambda k: statistics.median([r[k] for r in use]) if use else float("nan")  # noqa: E731
    upd = [r["update_tokens"] / max(r["step_s"] - r["gen_s"], 1e-9) for r in use if r["update_tokens"]]
    return {"step_s": med("step_s"), "gen_tok_s": statistics.median([r["gen_tokens"] / r["gen_s"] for r in use
                                                                     if r["gen_s"] > 0] or [float("nan")]),
            "update_tok_s": statistics.median(upd) if upd else float("nan"),
            "reward": statistics.mean([r["reward"] for r in rows]) if rows else float("nan")}


def table(sides: dict[str, dict]) -> str:
    """The markdown table: one row per measure, memrl, TRL and the ratio memrl/TRL."""
    m, t = sides["memrl"], sides["trl"]
    lines = ["| measure | memrl | TRL | memrl / TRL |", "|---|---:|---:|---:|"]
    for key, name in (("step_s", "step time (s, median)"), ("gen_tok_s", "generation tokens/s (median)"),
                      ("update_tok_s", "update tokens/s (median)"), ("rss_mib", "peak RSS (MiB)"),
                      ("reward", "mean reward (all steps)"), ("wall_s", "process wall time (s)"),
                      ("cpu_s", "process CPU time (s, user + system)")):
        a, b = m.get(key, float("nan")), t.get(key, float("nan"))
        ratio = a / b if b == b and b and a == a else float("nan")
        lines.append(f"| {name} | {a:.3g} | {b:.3g} | {ratio:.2f} |")
    lines += ["", "| step | memrl reward | TRL reward | memrl step s | TRL step s |", "|---:|---:|---:|---:|---:|"]
    mr, tr = {r["step"]: r for r in m["rows"]}, {r["step"]: r for r in t["rows"]}
    for s in sorted(set(mr) | set(tr)):
        def cell(d: dict, k: str, s: int = s) -> str:
            return f"{d[s][k]:.3g}" if s in d else "-"
        lines.append(f"| {s} | {cell(mr, 'reward')} | {cell(tr, 'reward')} | {cell(mr, 'step_s')} | "
                     f"{cell(tr, 'step_s')} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=str(MODEL))
    p.add_argument("--hotpot", default=None,
                   help="HotpotQA dev distractor file (default: `memrl data fetch hotpotqa_dev_distractor`'s)")
    p.add_argument("--trl-python", default=str(ROOT / ".venv-trl" / "bin" / "python"))
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--prompts", type=int, default=1, help="prompts per step")
    p.add_argument("--n", type=int, default=4, help="samples per prompt (the group)")
    p.add_argument("--max-tokens", type=int, default=32, help="completion tokens at most")
    p.add_argument("--lr", type=float, default=1e-6)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trl-gradient-checkpointing", action="store_true",
                   help="TRL's own default (GRPOConfig turns it on); off = as memrl, which does not checkpoint")
    p.add_argument("--memrl-skip-zero", action="store_true",
                   help="memrl leaves zero-advantage rows out of the update (its default, trainer.skip_zero_advantage); "
                        "off here so both sides forward and backward every row (TRL does)")
    p.add_argument("--order", default="memrl,trl", help="which side runs first")
    p.add_argument("--out", default=str(ROOT / "runs" / "vs_trl"))
    p.add_argument("--side", choices=("both", "trl"), default="both", help=argparse.SUPPRESS)
    p.add_argument("memrl_overrides", nargs="*", metavar="KEY=VALUE",
                   help="more `memrl train` overrides for the memrl side (the log's run at the defaults before "
                        "2026-11-28: engine.hf.kv_cache=padded trainer.prefix_sharing=never)")
    a = p.parse_args(argv)
    if sorted(a.order.split(",")) != ["memrl", "trl"]:
        p.error("--order must name memrl and trl")
    return a


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.side == "trl":
        return trl_side(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build_prompts(args, out)
    env = child_env(args.threads)
    sides: dict[str, dict] = {}
    for side in args.order.split(","):
        if side == "memrl":
            wall, rss, cpu = run_child(memrl_cmd(args, out), env, out / "memrl.log")
            rows = memrl_steps(out)
        else:
            cmd = [args.trl_python, str(Path(__file__).resolve()), "--side", "trl", "--out", str(out),
                   "--model", args.model, "--steps", str(args.steps), "--prompts", str(args.prompts), "--n",
                   str(args.n), "--max-tokens", str(args.max_tokens), "--lr", str(args.lr), "--threads",
                   str(args.threads), "--seed", str(args.seed)]
            cmd += ["--trl-gradient-checkpointing"] if args.trl_gradient_checkpointing else []
            wall, rss, cpu = run_child(cmd, env, out / "trl.log")
            rows = trl_steps(out)
        sides[side] = {**summarize(rows), "rss_mib": rss, "wall_s": wall, "cpu_s": cpu, "rows": rows}
    text = table(sides)
    (out / "table.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
