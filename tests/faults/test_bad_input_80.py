"""Issue 80 (round five of hostile and careless input), items 5, 7, 8, 10, 11, 12 and 14: a resumed eval onto
other weights, demo settings the RL stage refuses, an odd head dimension, absurd thread counts, `memrl ask`'s
silence, invalid UTF-8 in --question and overrides that contradict --model / --workflow. Each is refused in one
line before any work, or said. Item 4 (control tokens in user text) is tests/faults/test_prompt_injection.py."""

from __future__ import annotations

import json
import logging
import re
import shutil

import pytest
from conftest import one_line

from memrl.cli import main
from memrl.recipes.pipeline import load_recipe


def _fails(argv: list[str], capsys, code: int = 2) -> str:
    """Run the command; it must exit `code` having printed exactly one line on stderr; that line."""
    assert main(argv) == code, argv
    return one_line(capsys.readouterr().err)


@pytest.fixture()
def doc(tmp_path):
    p = tmp_path / "doc.txt"
    p.write_text("Alice signed the report in Paris. " * 12, encoding="utf-8")
    return str(p)


ASK_SMALL = ["workflow.chunk_tokens=32", "workflow.max_memory_tokens=4", "workflow.max_final_tokens=4"]


# ----------------------------------------------------------- item 5: an eval resumed onto other weights


def _other_weights(src: str, dst) -> None:
    """A copy of the model directory `src` at `dst` whose weights differ (one tensor shifted)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    w = load_file(str(dst / "model.safetensors"))
    name = sorted(w)[0]
    w[name] = w[name] + 0.5
    save_file(w, str(dst / "model.safetensors"), metadata={"format": "pt"})


def test_an_eval_resumed_onto_other_weights_is_refused_not_mixed(tiny_model, tmp_path, capsys):
    """Before: "2 rows already done", then 2 more rows from the other model and one summary over both."""
    from memrl.data.io import write_records
    from memrl.eval.runner import read_results

    data = tmp_path / "eval_1.json"
    write_records(data, [{"input": f"what is key{i}?", "answers": [f"v{i}"], "context": f"key{i} is v{i}. " * 3,
                          "index": i, "num_docs": 1} for i in range(4)])
    model = tmp_path / "latest"
    shutil.copytree(tiny_model, model)
    out = tmp_path / "eval"
    argv = ["eval", "--out", str(out), str(data), "--model", str(model), "--no-progress", "concurrency=1",
            "workflow.chunk_tokens=16", "workflow.max_memory_tokens=2", "workflow.max_final_tokens=2"]
    assert main([*argv, "limit=2"]) == 0
    record = json.loads((out / "eval_config.json").read_text())
    from memrl.model_files import weights_digest

    assert record["weights_sha256"] == weights_digest(tiny_model)  # the content's digest, not the path's
    capsys.readouterr()
    shutil.rmtree(model)
    _other_weights(tiny_model, model)  # training moved checkpoints/latest meanwhile
    line = _fails(argv, capsys, code=1)
    assert "now holds other weights" in line and "resuming would mix two models" in line, line
    assert len(read_results(out / "results.jsonl")) == 2  # nothing was added
    shutil.rmtree(model)
    shutil.copytree(tiny_model, model)  # the same weights again: it resumes
    assert main(argv) == 0
    assert len(read_results(out / "results.jsonl")) == 4


# ------------------------------------------------ items 7, 8: demo settings refused before the first stage


# (the thinking switch's refusal exits 1, as `memrl train`'s does: a TemplateError, tests/faults/test_bad_input_63a.py)
DEMO_REFUSALS = [
    ([], ["train.algorithm.routing_replay=r2", "train.algorithm.old_logprobs=trainer"], "routing_replay=r2 needs", 2),
    ([], ["train.workflow.enable_thinking=true"], "no thinking switch", 1),
    (["--agent", "memact"], ["train.algorithm.routing_replay=r2", "train.algorithm.old_logprobs=trainer"],
     "routing_replay=r2 needs", 2),
    (["--agent", "context"], ["train.trainer.router_aux_loss_coef=0.01"], "router_aux_loss_coef=0.01 needs", 2),
    (["--agent", "infmem"], ["train.workflow.enable_thinking=true"], "no thinking switch", 1),
    (["--agent", "lookback"], ["train.algorithm.routing_replay=r2", "train.algorithm.old_logprobs=trainer"],
     "routing_replay=r2 needs", 2),
    ([], ["hidden_size=6", "num_heads=2", "num_kv_heads=1"], "odd head dimension (3)", 2),
]


@pytest.fixture()
def no_stage(monkeypatch):
    """The demo's stages, replaced by a failure: a refusal must come before any of them starts."""
    import memrl.recipes.pipeline as pipeline

    def execute(recipe, run):
        raise AssertionError(f"a stage started ({recipe.name}) before the setting was refused")

    monkeypatch.setattr(pipeline, "execute", execute)


@pytest.mark.parametrize("agent,overrides,said,code", DEMO_REFUSALS,
                         ids=["r2", "thinking", "memact-r2", "context-router", "infmem-thinking", "lookback-r2",
                              "odd-head-dim"])
def test_a_demo_setting_the_rl_stage_refuses_is_refused_before_the_first_stage(agent, overrides, said, code,
                                                                              tmp_path, capsys, no_stage):
    """Before: hours of SFT (or 47 s of setup for the odd head dimension), then the refusal (or a traceback)."""
    out = tmp_path / "demo"
    line = _fails(["demo", *agent, "--out", str(out), *overrides], capsys, code)
    assert said in line, line
    assert not out.exists() or not any(out.iterdir())  # nothing written: no stage output, not even its config


def test_the_early_checks_pass_a_demo_model_that_has_what_the_rl_stage_needs(tmp_path):
    """The MoE preset takes routing replay and the router loss, the Qwen3 preset the thinking switch."""
    from memrl.recipes.pipeline import get_recipe

    recipe = get_recipe("memagent")
    run = load_recipe(recipe, ["model_preset=tiny-qwen3-moe", "train.algorithm.routing_replay=r2",
                       "train.algorithm.old_logprobs=trainer", "train.trainer.router_aux_loss_coef=0.01",
                       "train.workflow.enable_thinking=true"], tmp_path / "moe")
    assert run.tcfg.algorithm.routing_replay == "r2" and run.wf_cfg.enable_thinking is True
    run = load_recipe(recipe, ["model_preset=tiny-qwen3", "train.workflow.enable_thinking=true"], tmp_path / "qwen3")
    assert run.wf_cfg.enable_thinking is True


def test_memrl_train_refuses_routing_replay_on_a_dense_model_before_its_weights_load(tiny_model, tmp_path, capsys,
                                                                                    monkeypatch):
    """The RL stage's own check (check_policy_model) runs on model.path's config before the workers are built."""
    import memrl.training.assemble as assemble

    def build_workers(*a, **k):
        raise AssertionError("the workers were built before the setting was refused")

    monkeypatch.setattr(assemble, "build_workers", build_workers)
    line = _fails(["train", f"model.path={tiny_model}", f"out_dir={tmp_path / 'rl'}",
                   "algorithm.routing_replay=r2", "algorithm.old_logprobs=trainer", "data.synthetic.num_chunks=2",
                   "trainer.steps=1", "trainer.progress=false", "trainer.tensorboard=false"], capsys)
    assert "routing_replay=r2 needs a mixture-of-experts model" in line and "is qwen2" in line, line


# ------------------------------------------------------------------------ item 10: thread counts


def test_an_absurd_omp_num_threads_is_refused_in_one_line_before_torch_threads_start(monkeypatch, capsys, doc):
    """Before: "transformers cannot load its weights ...: can't start new thread", then a segfault (exit 139)."""
    monkeypatch.setenv("OMP_NUM_THREADS", "100000")
    line = _fails(["ask", "--model", "unused", "--file", doc, "--question", "Q"], capsys)
    assert line == ("memrl: error: OMP_NUM_THREADS=100000 is more threads than memrl runs (4096 at most, as "
                    f"threads.intra_op; this process may use {__import__('memrl.threads').threads.usable_cpus()} "
                    "CPUs): set it to at most the CPUs, or unset it")


def test_omp_num_threads_is_bounded_as_the_setting_is(monkeypatch):
    """Before: OMP_NUM_THREADS=5000 ran, one tiny step taking 154 s, without a word."""
    from memrl.config import ConfigError
    from memrl.threads import ThreadsSection, intra_op_threads

    monkeypatch.setenv("OMP_NUM_THREADS", "5000")
    with pytest.raises(ConfigError, match="OMP_NUM_THREADS=5000 is more threads than memrl runs"):
        intra_op_threads(ThreadsSection())
    monkeypatch.setenv("OMP_NUM_THREADS", "4096")  # the bound itself: run, with the warning below
    assert intra_op_threads(ThreadsSection()) == (4096, "OMP_NUM_THREADS")


@pytest.mark.parametrize("env,section,source", [(None, 4096, "threads.intra_op"), ("8", 0, "OMP_NUM_THREADS")])
def test_more_threads_than_usable_cpus_are_warned_about(env, section, source, monkeypatch, caplog):
    """Before: threads.intra_op=4096 on 2 CPUs ran 13x slower (12,293 threads, load 1,700) without a word."""
    import memrl.threads as threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    if env is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", env)
    with caplog.at_level(logging.WARNING, logger="memrl.threads"):
        n, where = threads.intra_op_threads(threads.ThreadsSection(intra_op=section))
    assert (n, where) == ((4096, source) if env is None else (8, source))
    assert [r.getMessage() for r in caplog.records] == [
        f"threads: {source}={n} is more than the 2 CPU(s) this process may use; every op's threads take turns on "
        f"them and run slower ({source}=2, or leave it unset: the default picks the CPUs)"]
    caplog.clear()
    monkeypatch.setattr(threads, "usable_cpus", lambda: 8192)
    with caplog.at_level(logging.WARNING, logger="memrl.threads"):
        threads.intra_op_threads(threads.ThreadsSection(intra_op=section))
    assert caplog.records == []  # within the CPUs: not a word


def test_the_demos_threads_setting_is_warned_about_too(monkeypatch, caplog):
    import memrl.threads as threads
    from memrl.recipes.memagent import DemoConfig
    from memrl.recipes.pipeline import set_threads

    monkeypatch.setattr(threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr("memrl.recipes.pipeline.set_torch_threads", lambda n: None)  # torch's pool left as it is
    with caplog.at_level(logging.WARNING, logger="memrl.threads"):
        set_threads(DemoConfig(threads=64))
    assert [r.getMessage() for r in caplog.records] == [
        "threads: threads=64 is more than the 2 CPU(s) this process may use; every op's threads take turns on them "
        "and run slower (threads=2, or leave it unset: the default picks the CPUs)"]


# ---------------------------------------------------------- item 11: memrl ask's progress and memories


def test_memrl_ask_shows_a_progress_bar_over_the_chunks(tiny_model, doc, capsys):
    """Before: nothing at all until the answer (a 50 MB file: 180 s of silence)."""
    assert main(["ask", "--model", tiny_model, "--file", doc, "--question", "Who signed?", *ASK_SMALL]) == 0
    io = capsys.readouterr()
    n = int(io.out.strip().splitlines()[-1].split()[0].lstrip("("))  # "(N chunks, ...)"
    assert n > 2
    bars = [ln for ln in io.err.replace("\r", "\n").splitlines() if ln.startswith("reading:")]
    assert bars and f"{n}/{n} [" in bars[-1] and "chunk/s" in bars[-1], io.err[-500:]
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", bars[-1]), bars[-1]  # elapsed < time left: the estimate
    assert main(["ask", "--model", tiny_model, "--file", doc, "--question", "Who signed?", "--no-progress",
                 *ASK_SMALL]) == 0
    assert "reading:" not in capsys.readouterr().err


def test_show_memory_streams_each_memory_as_it_is_written(tiny_model, doc, capsys):
    """Before: the memories printed only at the end. Each is handed over during the run (the first one before the
    second chunk is read), and the command prints each once, in order, before the final reply."""
    from memrl.eval.ask import ask
    from memrl.workflows.rollouts import RolloutError

    seen: list[tuple[int, str]] = []

    class Stop(Exception):
        pass

    def first_only(i: int, memory: str, recall: str) -> None:
        seen.append((i, memory))
        raise Stop

    with pytest.raises(RolloutError) as e:  # raised from inside the run: streamed, not collected at the end
        ask(tiny_model, open(doc).read(), "Who signed?", overrides=ASK_SMALL, on_memory=first_only)
    assert isinstance(e.value.__cause__, Stop) and [i for i, _ in seen] == [1]

    streamed: list[tuple[int, str]] = []
    res = ask(tiny_model, open(doc).read(), "Who signed?", overrides=ASK_SMALL,
              on_memory=lambda i, m, r: streamed.append((i, m)))
    assert streamed == list(enumerate(res.memories, 1)) and len(streamed) > 2

    assert main(["ask", "--model", tiny_model, "--file", doc, "--question", "Who signed?", "--show-memory",
                 "--no-progress", *ASK_SMALL]) == 0
    out = capsys.readouterr().out.splitlines()
    heads = [ln for ln in out if ln.startswith("memory after chunk")]
    assert heads == [f"memory after chunk {i}:" for i in range(1, len(streamed) + 1)]
    assert out.index("final reply:") > out.index(heads[-1])


# ------------------------------------------------------------ item 12: invalid UTF-8 in --question


def test_invalid_utf8_in_the_question_is_one_line(tiny_model, doc, capsys):
    """Before: a RolloutError traceback ending in TextEncodeInput. The shell hands Python the byte 0xff as the
    lone surrogate \\udcff (surrogateescape), as it does in an override, which was refused already."""
    line = _fails(["ask", "--model", tiny_model, "--file", doc, "--question", "Who\udcff signed?", *ASK_SMALL],
                  capsys, code=1)
    assert line == ("memrl ask: error: --question is not valid UTF-8 text: it holds a byte that is not UTF-8 (0xff) "
                    "at character 3")


# ------------------------------------------------------ item 14: overrides that contradict --model / --workflow


@pytest.mark.parametrize("override,said", [
    ("engine.model={model}", "override engine.model=...: memrl ask takes the model from --model only"),
    ("model.path={model}", "override model.path=...: memrl ask takes the model from --model only"),
    ("workflow.name=full_context", "override workflow.name=...: memrl ask takes the workflow from --workflow only "
                                   "(memagent or rememr1)"),
    ("workflow=full_context", "override workflow=...: memrl ask takes the workflow from --workflow only"),
    ("workflow.name=memact", "override workflow.name=...: memrl ask takes the workflow from --workflow only"),
])
def test_an_ask_override_that_contradicts_model_or_workflow_is_refused(override, said, tiny_model, doc, tmp_path,
                                                                      capsys):
    """Before: `--model models/nosuch ... engine.model=models/tiny` answered with tiny and exited 0;
    workflow.name=full_context ran a workflow --workflow does not offer."""
    line = _fails(["ask", "--model", str(tmp_path / "nosuch"), "--file", doc, "--question", "Who signed?",
                   override.format(model=tiny_model)], capsys)
    assert said in line, line
