"""A run that reuses another finished run's copy warm-up (`warmup_from`) or cold start (`sft_from`): the
checks that the other run made what this one would have (the same initial model and tokenizer, the same
settings, the same scripted agent through the same workflow), each failing in one line that names the run
and the first thing that differs. The context demo's (memrl.recipes.context.ContextDemoConfig).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from safetensors.torch import load_file
from transformers import AutoTokenizer

from memrl.config import ConfigError, to_yaml
from memrl.recipes.parts import ROWS
from memrl.recipes.pipeline import RecipeRun
from memrl.training.assemble import validate

NOT_COLD_START = ("method", "threads", "sft_from", "warmup_from")
"""Demo config fields that may differ between a run and the run whose cold start it reuses."""
RESULT_KEYS = ("facts.budget.max_context_tokens", "facts.cold_start", "losses.copy_warmup", "losses.sft", "summary")
"""The results.json entries a run reusing another's cold start (sft_from) reads (the one results layout,
memrl.recipes.pipeline.results)."""
WARMUP_FIELDS = ("seed", "sft.copy_warmup_steps", "sft.copy_warmup_rows", "sft.lr", "sft.batch_rows")
"""Demo config fields the copy warm-up depends on (beside the initial model and tokenizer)."""


def run_file(src: Path, name: str, key: str) -> Any:
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


def their_config(src: Path, key: str, config: type) -> dict[str, Any]:
    """The demo config (dataclass `config`) of the finished demo `src`, fields it predates at their defaults (a
    run written before a field existed ran with its default); ConfigError naming demo_config.yaml when it does
    not fit the schema."""
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config), run_file(src, "demo_config.yaml", key))
        return OmegaConf.to_container(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as e:
        what = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ConfigError(f"{key}={src}: demo_config.yaml is damaged ({what}); rerun that demo or drop {key}") from None


def reused_warmup(cfg: Any, out: Path, model: Any) -> list[float]:
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
    theirs = OmegaConf.create(their_config(src, "warmup_from", type(cfg)))
    for key in WARMUP_FIELDS:
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


def reused_cold_start(cfg: Any, tcfg: Any, arm: Any, arms: dict[str, Any]) -> dict[str, Any]:
    """The results.json of `cfg.sft_from` once it is checked to hold this run's cold start (ContextDemoConfig.
    sft_from: `arm` is this run's of `arms`); fails in one line naming the run and the first field that
    differs."""
    src = Path(cfg.sft_from)
    res_path = src / "results.json"
    if not res_path.is_file() or not (src / "sft" / "model.safetensors").is_file():
        raise ConfigError(f"sft_from={src}: no finished context demo there (results.json and sft/ are needed)")
    results = run_file(src, "results.json", "sft_from")
    for dotted in RESULT_KEYS:
        node: Any = results
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is None:
            raise ConfigError(f"sft_from={src}: results.json is damaged (it has no {dotted}); rerun that demo or drop "
                              "sft_from")
    theirs = their_config(src, "sft_from", type(cfg))
    ours = OmegaConf.to_container(OmegaConf.create(to_yaml(cfg)))
    for key in sorted(set(theirs) | set(ours)):
        if key not in NOT_COLD_START and theirs.get(key) != ours.get(key):
            raise ConfigError(f"sft_from={src}: its {key} is {theirs.get(key)!r}, this run's is {ours.get(key)!r} "
                              "(the cold start must be the same)")
    src_arm = arms.get(str(theirs.get("method")))
    if src_arm is None or (src_arm.workflow, src_arm.agent) != (arm.workflow, arm.agent):
        raise ConfigError(f"sft_from={src}: its method {theirs.get('method')!r} has another cold start than "
                          f"method={cfg.method} (workflow and scripted agent must match)")
    their_rl = run_file(src, "rl/config.yaml", "sft_from")
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


def take_cold_start(run: RecipeRun, prior: dict[str, Any]) -> None:
    """Fill `run` with the cold start of run.cfg.sft_from (its results.json `prior`, checked by
    reused_cold_start): its SFT checkpoint and tokenizer, budget, losses, facts, and the evaluation rows of
    every policy but rl (its eval_rows/<policy>.jsonl, memrl.recipes.parts.ROWS: the scripted and SFT
    evaluations), copied into this run's folder."""
    cfg, tcfg, out, src = run.cfg, run.tcfg, run.out, Path(run.cfg.sft_from)
    shutil.copytree(src / "sft", out / "sft", dirs_exist_ok=True)
    run.tokenizer = AutoTokenizer.from_pretrained(out / "sft")
    budget = int(prior["facts"]["budget"]["max_context_tokens"])
    tcfg.workflow["max_context_tokens"] = budget
    run.spec, run.wf_cfg = validate(tcfg)
    print(f"method {cfg.method}: workflow {run.spec.name}, {tcfg.algorithm.name}; budget {budget} tokens; the cold "
          f"start of {cfg.sft_from}")
    run.reused = True
    run.warmup_losses, run.sft_losses = prior["losses"]["copy_warmup"], prior["losses"]["sft"]
    run.facts.update(prior["facts"])
    for policy in dict.fromkeys(s["policy"] for s in prior["summary"] if s["policy"] != "rl"):
        rows = src / ROWS.format(policy)
        try:
            text = rows.read_text(encoding="utf-8")
            run.rows += [json.loads(line) for line in text.splitlines() if line.strip()]
        except (OSError, ValueError) as e:
            raise ConfigError(f"sft_from={src}: {ROWS.format(policy)} is missing or damaged ({e}); rerun that demo "
                              "or drop sft_from") from None
        (out / ROWS.format(policy)).parent.mkdir(parents=True, exist_ok=True)
        (out / ROWS.format(policy)).write_text(text, encoding="utf-8")
