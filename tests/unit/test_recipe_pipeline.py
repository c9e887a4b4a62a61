"""The recipe pipeline (memrl.recipes.pipeline): methods resolved by name or import path like workflows,
eval/ knowing no recipe method, and the "add a recipe method" page followed once with its toy method."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from memrl.cli import main
from memrl.config import ConfigError
from memrl.recipes import seeds
from memrl.recipes.pipeline import BUILTIN, Recipe, get_recipe, recipe_names, register_recipe

ROOT = Path(__file__).parents[2]
METHOD_WORDS = ("memagent", "memact", "context", "mem1", "infmem", "reading", "fold", "lookback")


def test_every_builtin_method_resolves_to_its_module_recipe():
    """Each BUILTIN entry names the RECIPE of memrl/recipes/<name>.py, called by its name (whatever their
    number: a new method adds its line, no test counts them), and the built-ins come first."""
    import importlib

    assert recipe_names()[:len(BUILTIN)] == list(BUILTIN)
    for name, path in BUILTIN.items():
        assert path == f"memrl.recipes.{name}:RECIPE"
        module = importlib.import_module(f"memrl.recipes.{name}")
        assert get_recipe(name) is module.RECIPE and module.RECIPE.name == name and isinstance(module.RECIPE, Recipe)
        assert get_recipe(path) is module.RECIPE


def test_unknown_methods_and_non_recipes_are_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^--agent: unknown recipe method 'nope'; one of memagent, memact, "
                                          r"context, mem1, infmem, lookback or an import path"):
        get_recipe("nope")
    with pytest.raises(ConfigError, match=r"^--agent='memrl.recipes.mem1:METHODS' is not a memrl.recipes.pipeline.Recipe "
                                          r"\(got dict\)"):
        get_recipe("memrl.recipes.mem1:METHODS")
    with pytest.raises(ConfigError, match="a method name is a plain word"):
        register_recipe("a:b", Recipe())


def test_memrl_demo_refuses_an_unknown_agent_before_any_work(tmp_path, capsys):
    assert main(["demo", "--agent", "nope", "--out", str(tmp_path / "d")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("memrl demo: error: --agent: unknown recipe method 'nope'")
    assert not (tmp_path / "d").exists()


def test_eval_names_no_recipe_method():
    """The one evaluator and `memrl eval`'s runner know no recipe method: no module under memrl/eval imports
    the demos or the scripted policies, and evaluator.py, runner.py and results_file.py import no workflow
    module by name and define nothing named after a method (the per-method summaries are
    memrl.recipes.summaries'). report.py's MemAct table and ask.py's two workflows are `memrl eval report`'s and
    `memrl ask`'s own, not recipe code."""
    for path in sorted((ROOT / "memrl" / "eval").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith(("memrl.recipes", "memrl.demonstrators"))], path.name
        if path.name in ("report.py", "ask.py"):
            continue
        workflows = [m for m in imported if m.startswith("memrl.workflows.")]
        assert set(workflows) <= {"memrl.workflows.rollouts", "memrl.workflows.templates"}, (path.name, workflows)
        named = [n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)]
        assert not [n for n in named if any(w in n.lower() for w in METHOD_WORDS)], (path.name, named)


def test_the_recipe_class_holds_only_what_some_method_declares_or_overrides():
    """Recipe is the methods' declarations and hooks, not the pipeline's machinery (module functions of
    memrl.recipes.pipeline): every name its class body defines is set or overridden by a built-in method or the
    guide's toy method, and the loader, results.json, results.md and the writer are not on it."""
    import sys

    sys.path.insert(0, str(ROOT / "tests"))
    body = next(n for n in ast.parse((ROOT / "memrl" / "recipes" / "pipeline.py").read_text(encoding="utf-8")).body
                if isinstance(n, ast.ClassDef) and n.name == "Recipe").body
    names = {n.name if isinstance(n, ast.FunctionDef) else n.target.id for n in body
             if isinstance(n, ast.FunctionDef | ast.AnnAssign)}
    methods = [get_recipe(name) for name in [*BUILTIN, "plugins_example.toy_recipe:RECIPE"]]
    declared = {k for r in methods for c in type(r).__mro__ if c not in (Recipe, object) for k in vars(c)}
    assert names - declared == set()
    assert not names & {"load", "configs", "results", "markdown", "write", "heldout_seeds", "check_task_seeds"}


def test_the_recipe_method_page_shows_the_toy_method_verbatim():
    page = (ROOT / "docs" / "guides" / "recipe_method.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.S)
    module = (ROOT / "tests" / "plugins_example" / "toy_recipe.py").read_text(encoding="utf-8")
    assert blocks and blocks[0] == module


@pytest.mark.slow
def test_the_toy_method_runs_every_stage_through_memrl_demo(tmp_path, capsys):
    out = tmp_path / "toy"
    # 10 demonstration tasks of 2 chunks: the memagent workflow cuts 2 memory rows + the final per task
    rc = main(["demo", "--agent", "plugins_example.toy_recipe:RECIPE", "--out", str(out), "sft.num_tasks=10",
               "sft.epochs=1", "sft.batch_rows=8", "eval.num_tasks=4", "train.data.synthetic.num_chunks=2",
               "train.data.synthetic.min_chunks=0", "train.trainer.steps=2", "train.trainer.batch_size=2",
               "train.algorithm.n=2", "train.trainer.progress=false", "train.trainer.tensorboard=false"])
    assert rc == 0
    for name in ("demo_config.yaml", "init/config.json", "sft/model.safetensors", "rl/metrics.jsonl",
                 "rl/checkpoints/step_000002/model.safetensors", "results.json", "results.md"):
        assert (out / name).is_file(), name
    res = json.loads((out / "results.json").read_text())
    # the one results layout (memrl.recipes.pipeline.results)
    assert list(res) == ["recipe", "method", "config", "train", "facts", "timings", "losses", "history",
                         "num_parameters", "vocab_size", "heldout_sha256", "summary"]
    assert res["recipe"] == res["method"] == "toy" and res["config"]["hidden_size"] == 32
    assert res["train"] == {"workflow": res["train"]["workflow"], "algorithm": {"name": "rememr1"}}  # demo_cpu's
    assert res["train"]["workflow"]["name"] == "memagent"
    assert res["facts"] == {"lengths": [2], "cold_start": {"tasks": 10, "rows": 30}}
    assert len(res["losses"]["sft"]) == 4 and res["losses"]["copy_warmup"] == []  # 30 rows in batches of 8
    assert len(res["history"]) == 2 and all("reward/mean" in h for h in res["history"])  # 2 RL steps
    assert set(res["timings"]) == {"init_s", "eval_scripted_s", "copy_warmup_s", "sft_s", "eval_sft_s", "rl_s",
                                   "eval_rl_s", "total_s"}
    # tied embeddings of the trained vocabulary x hidden 32; 1 layer: q (32 x 32 + bias), k and v (one KV head of
    # 16: 32 x 16 + bias each), o (32 x 32), the MLP (3 x 32 x 64), two norms and the final one (3 x 32)
    v = res["vocab_size"]
    assert res["num_parameters"] == v * 32 + (32 * 32 + 32) + 2 * (32 * 16 + 16) + 32 * 32 + 3 * 32 * 64 + 3 * 32
    assert [(s["policy"], s["decoding"], s["bucket"]) for s in res["summary"]] == [("sft", "greedy", "2"),
                                                                                 ("rl", "greedy", "2")]
    digests = set()
    for s in res["summary"]:
        assert s["num_tasks"] == 4 and (s["accuracy"] / 25).is_integer()  # 4 tasks: steps of 25 points
        # its evaluation rows: one per held-out task, labelled, their rewards the accuracy
        rows = [json.loads(x) for x in (out / "eval_rows" / f"{s['policy']}.jsonl").read_text().splitlines()]
        assert [(x["policy"], x["decoding"], x["bucket"], x["sample"]) for x in rows] == [(s["policy"], "greedy", 2, 0)] * 4
        assert 100 * sum(x["reward"] for x in rows) / 4 == s["accuracy"]
        digests |= {x["heldout_sha256"] for x in rows}
    assert len(digests) == 1 and res["heldout_sha256"] == list(digests)  # the same held-out tasks for both
    assert (out / "results.md").read_text() in capsys.readouterr().out
    # the method's summary rows and sweep table feed the one seed aggregation (a sweep of this single run)
    run = seeds.Run(0, "native", out, ())
    agg = seeds.aggregate("plugins_example.toy_recipe:RECIPE", [run])
    cell = agg["capabilities"]["native"]["cells"]["greedy"]["2"]
    sft, rl = (s["accuracy"] for s in res["summary"])
    assert cell["gain_accuracy"]["values"] == [rl - sft]
    table = seeds.markdown(agg).splitlines()
    assert f"| cold start (SFT) | greedy | 2 | {sft:.1f} ± n/a |" in table
    assert f"| RL - SFT | greedy | 2 | {rl - sft:+.1f} ± n/a |" in table


@pytest.mark.parametrize(("timings", "shown"), [({"eval_scripted_s": 7.0}, "demonstrator eval 7s"),
                                                ({"eval_demonstrator_s": 5.0}, "demonstrator eval 5s")])
def test_the_memagent_table_times_the_demonstrator_under_the_pipeline_key_and_the_old_one(timings, shown):
    # the pipeline times the scripted policy's evaluation as eval_scripted_s; results written before it have
    # eval_demonstrator_s (before the fix the table showed 0s for a pipeline run)
    from memrl.recipes.report import memagent_markdown

    results = {"config": {"sft": {"p_aware": 0.9}, "eval": {"num_tasks": 4, "seed": 1, "samples": 1, "temperature": 1.0}},
               "train": {"data": {"synthetic": {"num_chunks": 8, "min_chunks": 0, "chunk_words": 16}},
                         "trainer": {"steps": 2}}, "facts": {"lengths": []}, "summary": [], "timings": timings}
    assert shown in memagent_markdown(results)
