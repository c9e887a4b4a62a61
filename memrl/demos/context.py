"""The context-management CPU demo (issue 44): per method, a tiny model trained from scratch, cold start on
the method's scripted agent, then RL, evaluated on held-out tasks at one working-context budget.

  memrl demo --agent context --out runs/context/fold/seed0 method=fold
  memrl demo --agent context --out runs/context/fold --seeds 0,1,2 method=fold   # 3 training seeds
  python benchmarks/context_management.py --trained runs/context                 # the trained table

`method` picks one arm of ARMS below (its workflow section, scripted agent and estimator): react
(sliding_window, window_turns 0: no management, stopped by the budget), window (window_turns 2), summarize,
fold (FoldGRPO with its process rewards), fold_no_process (FoldGRPO with `process_rewards=[]`: the ablation).

`run_context_demo` chains the library's stages: write the task splits (memrl.data.synthetic_memact.write_splits
with `task.padding_words`: every search result costs what a passage does) -> calibrate the budget (0 = the
flawless folding agent's largest prompt, memrl.demonstrators.stages.calibrate_fold_budget, the same for every
arm; it fails when the unmanaged agent would fit) -> init a tiny Qwen2 whose BPE tokenizer is trained on the
task's text and every arm's scripted contexts, so all arms share it (memrl.demos.scratch.init_context_model) -> copy warm-up
(memrl.demos.cold_start.copy_warmup) -> cold start: SFT on the arm's scripted agent (memrl.demonstrators.
context, flaw `sft.late_prob`) played through the arm's workflow, every row as the workflow cuts it
(memrl.demos.context.take_cold_start) -> held-out evaluation of the SFT model -> RL (preset
context_cpu, `algorithm.name` from ARMS) -> the same evaluation after RL. The evaluation
(memrl.demos.summaries.evaluate_context) is greedy and sampled (one sample per task at `eval.temperature`):
accuracy (all sub-questions right) +- SE over tasks, mean peak / mean context, tokens discarded, turns,
branches, summaries and the share stopped by the budget; beside them the scripted agent on its SFT tasks
and the scripted search agent without a budget on the held-out tasks (`reference.react_unbounded`: the
trained table's "vs unbounded ReAct" peak). Writes results.json and results.md.

Overrides: `key=value` for ContextDemoConfig, `train.<key>=value` for the RL config (preset context_cpu);
`engine.*` and `workflow.*` are spelled as in `memrl train` (they set the RL config's sections, which the
cold start and evaluations use too; the arm's own workflow keys go first, so explicit ones win).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors.torch import load_file
from transformers import AutoTokenizer

from memrl.config import (
    MAX_COUNT,
    MAX_PARALLEL,
    MAX_SEED,
    MAX_TOKENS,
    ConfigError,
    load_config,
    to_yaml,
    valid,
)
from memrl.data.synthetic_memact import MemActTaskConfig, write_splits
from memrl.demonstrators.stages import calibrate_fold_budget, context_agent, context_demonstrations
from memrl.demos import split_overrides
from memrl.demos.pipeline import (
    EvalSettings,
    ModelShape,
    Recipe,
    RecipeRun,
    WarmupSFTSettings,
    load_train,
    run_recipe,
    set_threads,
)
from memrl.demos.scratch import init_context_model
from memrl.demos.seeds import budget_extra, budget_line, table_rows
from memrl.demos.summaries import context_summary_of, evaluate_context
from memrl.eval.evaluator import EngineRollout, model_engine
from memrl.training.assemble import validate
from memrl.types import Segment
from memrl.workflows import get_workflow, parse_workflow

__all__ = ["ARMS", "RECIPE", "Arm", "ContextDemoConfig", "ContextDemoEval", "ContextDemoModel", "ContextDemoSFT",
           "load_configs", "results_markdown", "run_context_demo"]


@dataclass(frozen=True)
class Arm:
    """One method of the comparison: its workflow section (merged over the preset's), its scripted agent
    (memrl.demonstrators.stages.context_agent kind) and its RL overrides."""

    workflow: dict[str, Any]
    agent: str
    algorithm: tuple[str, ...]


_GRPO = ("algorithm.name=grpo", "algorithm.grpo.norm_by_std=true")
ARMS: dict[str, Arm] = {
    "react": Arm({"name": "sliding_window", "window_turns": 0}, "search", _GRPO),
    "window": Arm({"name": "sliding_window", "window_turns": 2}, "search", _GRPO),
    "summarize": Arm({"name": "summarize", "summary_fraction": 0.7}, "summary", _GRPO),
    "fold": Arm({"name": "fold"}, "fold", ("algorithm.name=foldgrpo",)),
    "fold_no_process": Arm({"name": "fold"}, "fold", ("algorithm.name=foldgrpo", "algorithm.foldgrpo.process_rewards=[]")),
}
"""`method` -> its arm. GRPO arms divide by the group's reward std (as FoldGRPO does), so the estimators differ
only in the process rewards and the rows they weigh; the scripted agents are benchmarks/context_management.py's.
summary_fraction 0.7 (the benchmark's 0.8 at its sizes): at the demo's sizes one search result is ~30% of the
calibrated budget, and at 0.8 the flawless summary agent searches past the budget before it is asked for a
summary (0% on 100 held-out tasks, 100% at 0.7, seed 0)."""


ContextDemoModel = ModelShape
"""The tiny Qwen2 trained from scratch: the MemAct demo's shape settings (its max_positions must hold the
budget plus one turn, checked once the budget is known)."""


@dataclass
class ContextDemoSFT(WarmupSFTSettings):
    """Cold start on the arm's scripted agent (memrl.demonstrators.context) through the arm's workflow; the
    copy warm-up before it gives a model trained from scratch the induction heads it needs to copy names and
    values (the MemAct demo's finding)."""

    num_tasks: int = valid(2000, ge=1, le=MAX_COUNT)
    late_prob: float = valid(0.0, ge=0, le=1)
    """The fold / summary agent's flaw (FoldDemonstrator: searches in the main thread; SummaryDemonstrator:
    keeps only the last fact); must be 0 for react and window (the search agent has none)."""
    seed: int = valid(500, ge=0, le=MAX_SEED)
    """Seed of the demonstration tasks (and of the agent's flaw)."""
    copy_warmup_steps: int = valid(1500, ge=0, le=MAX_COUNT, note="0 = off")
    max_rows: int = valid(0, ge=0, le=MAX_COUNT, note="0 = every row")
    """Train on the first max_rows demonstration rows only (task order): caps a method whose scripted agent cuts
    many rows per task (window: a row per window shift) at another method's cold-start size, without changing
    the SFT tasks (and so the tokenizer every method of a seed shares)."""


@dataclass
class ContextDemoEval(EvalSettings):
    """Held-out evaluation, fixed before any run: benchmarks/context_management.py's task seed (901, used by
    no other split), greedy then one sample per task at `temperature`."""

    num_tasks: int = valid(200, ge=2, le=MAX_COUNT)
    seed: int = valid(901, ge=0, le=MAX_SEED)


@dataclass
class ContextDemoConfig:
    """`memrl demo --agent context` settings; the RL settings are the `context_cpu` preset (+ train.*)."""

    method: str = valid("fold", choices=tuple(ARMS))
    model: ContextDemoModel = field(default_factory=ContextDemoModel)
    task: MemActTaskConfig = field(default_factory=lambda: MemActTaskConfig(sub_questions=[5], padding_words=40))
    """5 facts per task, 40 filler words per document: the calibrated budget (folding's largest prompt, 481
    tokens at seed 0) stops the unmanaged agent after its second search (its unbounded peak is 784)."""
    sft: ContextDemoSFT = field(default_factory=ContextDemoSFT)
    eval: ContextDemoEval = field(default_factory=ContextDemoEval)
    rl_tasks: int = valid(2000, ge=1, le=MAX_COUNT)
    rl_task_seed: int = valid(100, ge=0, le=MAX_SEED)
    context_budget: int = valid(0, ge=0, le=MAX_TOKENS, note="0 = calibrated")
    """workflow.max_context_tokens of the cold start, RL and evaluation, the same for every arm. 0 = the
    flawless folding agent's largest prompt on the first 200 SFT tasks (calibrate_fold_budget)."""
    seed: int = valid(0, ge=0, le=MAX_SEED)
    """Seed of the tokenizer, the model's initial weights, the copy warm-up and the SFT order."""
    train_preset: str = "context_cpu"
    threads: int = valid(0, ge=0, le=MAX_PARALLEL, note="0 = torch's default")
    warmup_from: str = ""
    """A finished run whose copy warm-up this one reuses ('' = run it here): the warm-up depends only on the
    initial model and tokenizer (the same for every method at one seed) and its own settings, so the methods
    of one seed need one. Its init/ (tokenizer and initial weights) must be byte-equal to this run's and its
    seed and sft.copy_warmup_steps / copy_warmup_rows / lr / batch_rows equal. Under `--seeds` it names the
    other sweep's root, as `sft_from` does."""
    sft_from: str = ""
    """A finished run whose cold start this one reuses ('' = train it here): its SFT checkpoint, budget and
    SFT evaluation are taken as they are and only RL and its evaluation run, so two methods that share a
    cold start (fold and fold_no_process) compare from the same model. Its demo_config.yaml must equal this
    run's apart from `method`, `threads` and `sft_from`, its method must play the same agent through the same
    workflow section, and its RL config's workflow and engine sections must equal this run's. Under
    `--seeds` it names the other sweep's root: each seed reuses the run of the same seed there."""


def load_configs(overrides: list[str], out_dir: str | Path) -> tuple[ContextDemoConfig, Any, Path, Arm]:
    """(demo config, RL config, writable output dir, arm); fails on a bad value before any work."""
    demo_ov, train_ov = split_overrides(list(overrides))
    cfg = load_config(ContextDemoConfig, demo_ov)
    if cfg.method not in ARMS:
        raise ConfigError(f"method must be one of {', '.join(ARMS)}, got {cfg.method!r}")
    arm = ARMS[cfg.method]
    if arm.agent == "search" and cfg.sft.late_prob:
        raise ConfigError(f"sft.late_prob must be 0 for method={cfg.method} (the search agent has no flaw), "
                          f"got {cfg.sft.late_prob}")
    arm_ov = [f"workflow={arm.workflow['name']}",
              *[f"workflow.{k}={v}" for k, v in arm.workflow.items() if k != "name"], *arm.algorithm]
    run = load_train(cfg, train_ov, out_dir, ["data.name=file", f"data.path={Path(out_dir) / 'data' / 'train_tasks.jsonl'}",
                                              *arm_ov])
    tcfg, out, spec = run.tcfg, run.out, run.spec
    if spec.name != arm.workflow["name"]:
        raise ConfigError(f"workflow.name must be {arm.workflow['name']} for method={cfg.method}, got {spec.name!r}")
    set_threads(cfg)
    return cfg, tcfg, out, arm


_NOT_COLD_START = ("method", "threads", "sft_from", "warmup_from")
_RESULT_KEYS = ("budget.max_context_tokens", "num_parameters", "copy_warmup_losses", "sft_losses", "sft",
                "reference.react_unbounded", "demonstrator", "scripted.greedy")
"""The results.json entries a run reusing another's cold start (sft_from) reads."""


def _run_file(src: Path, name: str, key: str) -> Any:
    """File `name` of the finished demo `src` named by `key` (sft_from / warmup_from): a YAML file as a
    DictConfig, a .json file as a dict; a ConfigError naming the file when it is missing or damaged."""
    path = src / name
    try:
        if name.endswith(".json"):
            value = json.loads(path.read_text(encoding="utf-8"))
        else:
            value = OmegaConf.load(path)
    except FileNotFoundError:
        raise ConfigError(f"{key}={src}: {name} is missing (not a finished context demo)") from None
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as e:
        what = e.strerror if isinstance(e, OSError) else (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}={src}: {name} is damaged ({what}); rerun that demo or drop {key}") from None
    if not isinstance(value, dict | DictConfig):
        raise ConfigError(f"{key}={src}: {name} is damaged (it holds a {type(value).__name__}, not a mapping); rerun "
                          f"that demo or drop {key}")
    return value


def _their_config(src: Path, key: str) -> dict[str, Any]:
    """The demo config of the finished demo `src`, fields it predates at their defaults (a run written before a
    field existed ran with its default); ConfigError naming demo_config.yaml when it does not fit the schema."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ContextDemoConfig), _run_file(src, "demo_config.yaml", key))
        return OmegaConf.to_container(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        what = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}={src}: demo_config.yaml is damaged ({what}); rerun that demo or drop {key}") from None
_WARMUP_FIELDS = ("seed", "sft.copy_warmup_steps", "sft.copy_warmup_rows", "sft.lr", "sft.batch_rows")


def reused_warmup(cfg: ContextDemoConfig, out: Path, model: Any) -> list[float]:
    """Load the copy-warmed weights of `cfg.warmup_from` into `model` once that run is checked to have warmed
    up this run's initial model and tokenizer with this run's settings (ContextDemoConfig.warmup_from); saves
    them to out/copy_warmup and returns that run's warm-up losses. Fails in one line naming what differs."""
    src = Path(cfg.warmup_from)
    weights = src / "copy_warmup" / "model.safetensors"
    if not weights.is_file() or not (src / "copy_warmup" / "metrics.jsonl").is_file():
        raise ConfigError(f"warmup_from={src}: no finished copy warm-up there (copy_warmup/model.safetensors)")
    for name in ("tokenizer.json", "model.safetensors"):
        if (src / "init" / name).read_bytes() != (out / "init" / name).read_bytes():
            raise ConfigError(f"warmup_from={src}: its init/{name} differs from this run's (another seed, task, "
                              "model or SFT tasks)")
    theirs = OmegaConf.create(_their_config(src, "warmup_from"))
    for key in _WARMUP_FIELDS:
        a, b = OmegaConf.select(theirs, key), _dotted(cfg, key)
        if a != b:
            raise ConfigError(f"warmup_from={src}: its {key} is {a!r}, this run's is {b!r}")
    missing, unexpected = model.load_state_dict(load_file(weights), strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:  # tied embeddings: lm_head is not stored
        raise ConfigError(f"warmup_from={src}: its weights do not fit this model (missing {missing[:3]}, "
                          f"unexpected {unexpected[:3]})")
    model.save_pretrained(out / "copy_warmup")
    lines = (src / "copy_warmup" / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    shutil.copy(src / "copy_warmup" / "metrics.jsonl", out / "copy_warmup" / "metrics.jsonl")
    losses = [float(json.loads(line)["sft/loss"]) for line in lines if line.strip()]
    print(f"copy warm-up: the {len(losses)} steps of {src}")
    return losses


def _dotted(obj: Any, key: str) -> Any:
    for part in key.split("."):
        obj = getattr(obj, part)
    return obj


def reused_cold_start(cfg: ContextDemoConfig, tcfg: Any, arm: Arm) -> dict[str, Any]:
    """The results.json of `cfg.sft_from` once it is checked to hold this run's cold start (ContextDemoConfig.
    sft_from); fails in one line naming the run and the first field that differs."""
    src = Path(cfg.sft_from)
    res_path = src / "results.json"
    if not res_path.is_file() or not (src / "sft" / "model.safetensors").is_file():
        raise ConfigError(f"sft_from={src}: no finished context demo there (results.json and sft/ are needed)")
    results = _run_file(src, "results.json", "sft_from")
    for dotted in _RESULT_KEYS:
        node: Any = results
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ConfigError(f"sft_from={src}: results.json is damaged (it has no {dotted}); rerun that demo or drop "
                              "sft_from")
    theirs = _their_config(src, "sft_from")
    ours = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))
    for key in sorted(set(theirs) | set(ours)):
        if key not in _NOT_COLD_START and theirs.get(key) != ours.get(key):
            raise ConfigError(f"sft_from={src}: its {key} is {theirs.get(key)!r}, this run's is {ours.get(key)!r} "
                              "(the cold start must be the same)")
    src_arm = ARMS.get(str(theirs.get("method")))
    if src_arm is None or (src_arm.workflow, src_arm.agent) != (arm.workflow, arm.agent):
        raise ConfigError(f"sft_from={src}: its method {theirs.get('method')!r} has another cold start than "
                          f"method={cfg.method} (workflow and scripted agent must match)")
    their_rl = _run_file(src, "rl/config.yaml", "sft_from")
    for section in ("workflow", "engine"):
        if not isinstance(their_rl.get(section), DictConfig):
            raise ConfigError(f"sft_from={src}: rl/config.yaml is damaged (it has no {section} section); rerun that "
                              "demo or drop sft_from")
        a, b = OmegaConf.to_container(their_rl[section]), OmegaConf.to_container(OmegaConf.structured(tcfg)[section])
        if section == "workflow":
            b = {**b, "max_context_tokens": a.get("max_context_tokens")}  # set from the budget below
        if a != b:
            diff = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            raise ConfigError(f"sft_from={src}: its RL config's {section}.{diff[0]} is {a.get(diff[0])!r}, this "
                              f"run's is {b.get(diff[0])!r}")
    return results


def _section(tcfg: Any, name: str, **changes: Any) -> Any:
    """The config of workflow `name` with `changes`, its other fields from the RL config's workflow section
    where that workflow has them (the calibration's and the reference's unbudgeted agents)."""
    return parse_workflow({"name": name, **changes}, defaults=dict(tcfg.workflow))[1]


def evaluate(model: Any, tokenizer: Any, spec: Any, wf_cfg: Any, tasks: list[Any], temperature: float, seed: int,
             engine_cfg: Any, model_dir: str | Path = "") -> dict[str, dict[str, float]]:
    """{"greedy": summary, "sampled": summary} on the held-out tasks (memrl.demos.summaries.evaluate_context)."""
    with model_engine(model, tokenizer, engine_cfg, model_dir) as engine:
        return evaluate_context(EngineRollout(engine, spec), wf_cfg, tasks, temperature, seed)


def results_markdown(results: dict[str, Any]) -> str:
    """The run's table: one row per policy and decoding."""
    lines = [f"# context demo: method={results['method']} ({results['budget']['eval_tasks']} held-out tasks, "
             f"budget {results['budget']['max_context_tokens']} tokens)", "",
             "| policy | decoding | accuracy | peak context | mean context | tokens discarded | turns | branches "
             "| summaries | stopped by budget |", "|---|---|---|---|---|---|---|---|---|---|"]
    for policy, label in (("scripted", "scripted (its SFT tasks)"), ("sft", "SFT"), ("rl", "SFT + RL")):
        for mode, r in results[policy].items():
            lines.append(f"| {label} | {mode} | {r['accuracy']:.1f} +- {r['accuracy_se']:.1f} "
                         f"| {r['peak_context_tokens']:.0f} | {r['mean_context_tokens']:.0f} "
                         f"| {r['tokens_discarded']:.0f} | {r['turns']:.1f} | {r['branches']:.2f} "
                         f"| {r['summaries']:.2f} | {r['stopped_by_budget']:.0f}% |")
    return "\n".join(lines) + "\n"


def take_cold_start(run: RecipeRun, prior: dict[str, Any]) -> None:
    """Fill `run` with the cold start of run.cfg.sft_from (its results.json `prior`, checked by
    reused_cold_start): its SFT checkpoint and tokenizer, budget, losses, scripted and SFT evaluations."""
    cfg, tcfg, out = run.cfg, run.tcfg, run.out
    shutil.copytree(Path(cfg.sft_from) / "sft", out / "sft", dirs_exist_ok=True)
    run.tokenizer = AutoTokenizer.from_pretrained(out / "sft")
    budget = int(prior["budget"]["max_context_tokens"])
    tcfg.workflow["max_context_tokens"] = budget
    run.spec, run.wf_cfg = validate(tcfg)
    print(f"method {cfg.method}: workflow {run.spec.name}, {tcfg.algorithm.name}; budget {budget} tokens; the cold "
          f"start of {cfg.sft_from}")
    run.reused = True
    run.warmup_losses, run.sft_losses, run.evals["sft"] = prior["copy_warmup_losses"], prior["sft_losses"], prior["sft"]
    run.demo = {**prior["demonstrator"], "summary": prior["scripted"]["greedy"]}
    run.extra.update(budget=budget, n_params=int(prior["num_parameters"]), unbounded=prior["reference"]["react_unbounded"])


class ContextRecipe(Recipe):
    """The context-management demo as a recipe method (module docstring)."""

    name = "context"
    config = ContextDemoConfig
    seed_keys = (("seed", "demo"), ("sft.seed", "demo"), ("rl_task_seed", "demo"), ("train.data.seed", "train"),
                 ("train.trainer.seed", "train"))
    task_seeds = ("sft.seed", "rl_task_seed")

    def load(self, overrides: list[str], out_dir: str | Path) -> RecipeRun:
        cfg, tcfg, out, arm = load_configs(overrides, out_dir)
        run = RecipeRun(cfg, tcfg, out, *validate(tcfg))
        run.extra.update(arm=arm, prior=reused_cold_start(cfg, tcfg, arm) if cfg.sft_from else None)
        return run

    def init(self, run: RecipeRun) -> None:
        cfg, tcfg, out, arm, prior = run.cfg, run.tcfg, run.out, run.extra["arm"], run.extra["prior"]
        data = write_splits(cfg.task, out / "data", sft=(cfg.sft.num_tasks, cfg.sft.seed),
                            rl=(cfg.rl_tasks, cfg.rl_task_seed), heldout=(cfg.eval.num_tasks, cfg.eval.seed))
        run.extra["data"] = data
        if prior is not None:
            return take_cold_start(run, prior)
        spec = get_workflow(arm.workflow["name"])
        unbudgeted = _section(tcfg, spec.name, max_context_tokens=MAX_TOKENS)
        fold_cfg = _section(tcfg, "fold", max_context_tokens=MAX_TOKENS)
        react_cfg = _section(tcfg, "sliding_window", window_turns=0, max_context_tokens=MAX_TOKENS)
        # one tokenizer for every arm (the same seed gives the same tokenizer and budget whatever the method):
        # trained on every scripted agent's contexts without a budget
        plays = [("fold", fold_cfg, context_agent("fold")), ("sliding_window", react_cfg, context_agent("search")),
                 ("summarize", _section(tcfg, "summarize", max_context_tokens=MAX_TOKENS), context_agent("summary"))]
        run.tokenizer, run.model = init_context_model(out, cfg.task, plays, data.sft_tasks, cfg.model.preset(),
                                                      cfg.model.vocab_size, cfg.seed)
        budget = cfg.context_budget or calibrate_fold_budget(data.sft_tasks[:200], run.tokenizer, fold_cfg, react_cfg)
        if budget + unbudgeted.max_turn_tokens > cfg.model.max_positions:
            raise ConfigError(f"model.max_positions {cfg.model.max_positions} < the budget {budget} + "
                              f"workflow.max_turn_tokens {unbudgeted.max_turn_tokens}")
        tcfg.workflow["max_context_tokens"] = budget
        run.spec, run.wf_cfg = validate(tcfg)
        n_params = sum(p.numel() for p in run.model.parameters())
        print(f"method {cfg.method}: workflow {run.spec.name}, {tcfg.algorithm.name}; budget {budget} tokens; "
              f"model {n_params / 1e6:.2f}M parameters, vocabulary {len(run.tokenizer)}")
        run.extra.update(budget=budget, n_params=n_params, react_cfg=react_cfg)

    def scripted(self, run: RecipeRun) -> None:
        # the reference of the trained table's "vs unbounded ReAct" column: the scripted search agent without
        # a budget on the same held-out tasks, in this run's tokens
        run.extra["unbounded"] = context_summary_of(context_demonstrations(
            run.extra["data"].eval_tasks, run.tokenizer, "sliding_window", run.extra["react_cfg"],
            context_agent("search")))

    def warmup(self, run: RecipeRun) -> list[float]:
        return reused_warmup(run.cfg, run.out, run.model) if run.cfg.warmup_from else super().warmup(run)

    def demonstrations(self, run: RecipeRun) -> tuple[list[Segment], dict[str, Any]]:
        """The arm's scripted agent through its workflow, every row as the workflow cuts it (fold: one per
        branch + the main thread; summarize: one per part; sliding_window: one per window shift + the last);
        `sft.max_rows` > 0 keeps the first max_rows rows (task order)."""
        s, workflow = run.cfg.sft, run.spec.name
        agent = context_agent(run.extra["arm"].agent, s.late_prob, s.seed)
        groups = context_demonstrations(run.extra["data"].sft_tasks, run.tokenizer, workflow, run.wf_cfg, agent,
                                        seed=s.seed)
        trajs = [g.trajectories[0] for g in groups]
        rows = [r for t in trajs for r in t.segments]
        summary = context_summary_of(groups)
        print(f"cold start: {len(rows)} rows from {len(groups)} scripted {workflow} trajectories (its accuracy "
              f"{summary['accuracy']:.1f}%, peak context {summary['peak_context_tokens']:.0f}, stopped by the "
              f"budget {summary['stopped_by_budget']:.1f}%)" + (f"; the first {s.max_rows} trained (sft.max_rows)"
                                                                if 0 < s.max_rows < len(rows) else ""))
        trained = rows[:s.max_rows] if s.max_rows else rows
        return trained, {"summary": summary, "rows": len(rows), "rows_trained": len(trained),
                         "rows_per_task": [len(t.segments) for t in trajs],
                         "branches_per_task": [int(t.metrics.get("branches", 0)) for t in trajs],
                         "summaries_per_task": [int(t.metrics.get("summaries", 0)) for t in trajs]}

    def evaluate(self, run: RecipeRun, policy: str, model: Any, model_dir: str | Path) -> Any:
        return evaluate(model, run.tokenizer, run.spec, run.wf_cfg, run.extra["data"].eval_tasks,
                        run.cfg.eval.temperature, run.cfg.eval.seed, run.tcfg.engine, model_dir)

    def results(self, run: RecipeRun) -> dict[str, Any]:
        cfg, tcfg, demo = run.cfg, run.tcfg, run.demo
        return {
            "method": cfg.method, "workflow": dict(tcfg.workflow), "algorithm": tcfg.algorithm.name,
            "process_rewards": list(tcfg.algorithm.foldgrpo.process_rewards) if tcfg.algorithm.name == "foldgrpo"
            else [],
            "scripted": {"greedy": demo["summary"]}, "sft": run.evals["sft"], "rl": run.evals["rl"],
            "reference": {"react_unbounded": run.extra["unbounded"]},
            "demonstrator": {k: v for k, v in demo.items() if k != "summary"},
            "timings": run.timings, "num_parameters": run.extra["n_params"], "vocab_size": len(run.tokenizer),
            "sft_losses": run.sft_losses, "copy_warmup_losses": run.warmup_losses,
            "rl_history": {k: [h.get(k, 0.0) for h in run.history] for k in ("reward/mean", "train/rows")},
            "budget": {"max_context_tokens": run.extra["budget"], "eval_tasks": len(run.extra["data"].eval_tasks)},
            "sft_from": cfg.sft_from,
        }

    def markdown(self, results: dict[str, Any]) -> str:
        return results_markdown(results)

    summary_fields = ("accuracy", "peak_context_tokens", "mean_context_tokens", "tokens_discarded", "branches",
                      "summaries", "stopped_by_budget")

    def evals(self, results: dict[str, Any]) -> dict[str, Any]:
        return {p: {mode: {"all": s} for mode, s in results[p].items()} for p in ("sft", "rl")}

    def sweep_extra(self, done: list[tuple[Path, dict[str, Any]]]) -> dict[str, Any]:
        return budget_extra(done)

    def sweep_table(self, e: dict[str, Any]) -> list[str]:
        labels = (("cold start (SFT)", "sft"), ("SFT + RL", "rl"), ("RL - SFT", "gain"))
        return ["| policy | decoding | accuracy (%) | peak context | mean context | tokens discarded | branches "
                "| summaries | stopped by budget (%) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|",
                *table_rows(e, labels, self.summary_fields, lambda f: 2 if f in ("branches", "summaries") else 1),
                *budget_line(e)]


RECIPE = ContextRecipe()


def run_context_demo(out_dir: str | Path, overrides: list[str]) -> dict[str, Any]:
    """Run the whole demo for one arm (module docstring); returns what results.json holds."""
    return run_recipe(RECIPE, out_dir, overrides)
