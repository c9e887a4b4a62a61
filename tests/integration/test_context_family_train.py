"""End to end on CPU: a FoldGRPO step of the scripted folding agent through the trainer (the rows reaching the
loss are the workflow's thread rows, with their token-level advantages), and `memrl train` / `memrl eval`
with workflow=fold|summarize|sliding_window and the real tiny model."""

from __future__ import annotations

import math

import pytest

from memrl.cli import main
from memrl.config import load_config
from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks
from memrl.data.tasks_jsonl import write_tasks
from memrl.demonstrators import ScriptedEngine
from memrl.demonstrators.context import FoldDemonstrator
from memrl.eval.runner import RESULTS_FILE, read_results
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


@pytest.fixture(scope="module")
def task_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("fold_task")
    write_tasks(d / "tasks.jsonl", make_tasks(MemActTaskConfig(sub_questions=[2], padding_words=20), 2, seed=5))
    return d / "tasks.jsonl"


class _Seen(Trainer):
    def select(self, groups):
        self.seen = (groups, [])
        return super().select(groups)

    def train_rows(self, batch, **kw):
        self.seen[1].extend(batch.segments)
        return super().train_rows(batch, **kw)


def test_foldgrpo_step_trains_the_thread_rows_with_token_advantages(tiny_path, task_file, tmp_path):
    from transformers import AutoTokenizer

    ov = [f"model.path={tiny_path}", f"out_dir={tmp_path}", "trainer.steps=1", "workflow=fold",
          "workflow.retriever_scope=task", "workflow.max_turn_tokens=96", "workflow.max_assistant_turns=12",
          "workflow.max_context_tokens=100000", "data.name=file", f"data.path={task_file}",
          "algorithm.name=foldgrpo", "algorithm.n=4", "trainer.batch_size=2", "algorithm.kl_coef=0.0",
          "optim.lr=1e-4", "trainer.progress=false", "trainer.tensorboard=false", "trainer.dump_every=0",
          "trainer.seed=3", "algorithm.foldgrpo.unfolded_fraction=0.002"]
    cfg = load_config(TrainConfig, ov)
    # a coin per main-thread decision: some samples branch for every fact (1 + 2 rows), some search in the
    # main thread (fewer rows, unfolded tokens); all answer right, so only the process rewards differ
    engine = ScriptedEngine(lambda p, i: FoldDemonstrator(late_prob=0.5, seed=i)(p),
                            tokenizer=AutoTokenizer.from_pretrained(tiny_path))
    trainer = _Seen(assemble(cfg, engine=engine))
    (h,) = trainer.fit()
    groups, rows = trainer.seen
    segs = [s for g in groups for t in g.trajectories for s in t.segments]
    assert len(rows) == len(segs) == h["train/rows"]
    assert {s.info["kind"] for s in segs} == {"main", "branch"}
    assert any(-1.0 in s.token_advantages for s in segs)  # some main thread was penalised
    for g in groups:
        assert g.rewards == [1.0] * 4  # every sample answers right: R - mean = 0, std 0 (no division)
        for t in g.trajectories:
            branches = sum(s.info["kind"] == "branch" for s in t.segments)
            assert len(t.segments) == branches + 1 == t.metrics["branches"] + 1
            unfolded = t.metrics["final_context_tokens"] - t.info["main_head_tokens"]
            for s in t.segments:
                assert s.token_advantages is not None and len(s.token_advantages) == len(s.response_ids)
                if s.info["kind"] == "main" and unfolded > 0.002 * 100000:
                    # hand rule: -1 on the main turns that neither opened a branch nor answered, 0 elsewhere
                    bad = set(s.info["turns"]) - set(s.info["branch_turns"]) - {s.info["turns"][-1]}
                    want = [0.0] * len(s.response_ids)
                    for turn, a, b in s.info["turn_spans"]:
                        for k in range(a, b):
                            want[k] = -1.0 if turn in bad else 0.0
                    assert s.token_advantages == want
                else:
                    assert set(s.token_advantages) == {0.0}
    assert math.isfinite(h["loss/total"])


@pytest.mark.parametrize("workflow, extra", [
    ("fold", ["workflow.max_branches=2"]),
    ("summarize", ["workflow.summary_fraction=0.5"]),
    ("sliding_window", ["workflow.window_turns=1"]),
])
def test_memrl_train_and_eval_run_each_workflow_with_the_tiny_model(tiny_path, task_file, tmp_path, workflow, extra):
    common = [f"workflow={workflow}", "workflow.retriever_scope=task", "workflow.max_turn_tokens=8",
              "workflow.max_assistant_turns=2", "workflow.max_context_tokens=4000", *extra]
    rc = main(["train", f"model.path={tiny_path}", f"out_dir={tmp_path / 'train'}", "trainer.steps=1",
               "data.name=file", f"data.path={task_file}", "algorithm.n=2", "trainer.batch_size=1",
               "trainer.progress=false", "trainer.tensorboard=false", "trainer.dump_every=0", *common])
    assert rc == 0
    rc = main(["eval", "--model", tiny_path, "--out", str(tmp_path / "eval"), "--no-progress", str(task_file),
               *common])
    assert rc == 0
    rows = read_results(tmp_path / "eval" / RESULTS_FILE)
    assert len(rows) == 2
    for r in rows:
        m = r["metrics"]
        assert 1 <= m["turns"] <= 2 and m["peak_context_tokens"] >= m["mean_context_tokens"] > 0
        assert "tokens_discarded" in m


def test_cold_start_rows_are_the_rl_rows_and_sft_trains_on_them(tiny_path, task_file, tmp_path):
    """The fold cold start: the scripted agent's SFT rows are the workflow's thread rows (the rows RL trains for
    the same trajectory), and a few SFT steps on them lower their loss."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.data.tasks_jsonl import load_task_file
    from memrl.demonstrators.stages import context_demonstrations
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.workflows import parse_workflow

    tok = AutoTokenizer.from_pretrained(tiny_path)
    tasks = load_task_file(task_file)
    section = {"name": "fold", "retriever_scope": "task", "max_turn_tokens": 96, "max_assistant_turns": 12,
               "max_context_tokens": 100000}
    _, wf = parse_workflow(section)
    groups = context_demonstrations(tasks, tok, "fold", wf, FoldDemonstrator())
    sft = [s for g in groups for s in g.trajectories[0].segments]
    # 2 tasks x (2 branches + the main thread), every trajectory right
    assert [s.info["kind"] for s in sft] == ["branch", "branch", "main"] * 2 and all(g.rewards == [1.0] for g in groups)
    cfg = load_config(TrainConfig, [f"model.path={tiny_path}", f"out_dir={tmp_path}", "trainer.steps=1",
                                    "data.name=file", f"data.path={task_file}", "algorithm.name=foldgrpo",
                                    "algorithm.n=1", "trainer.batch_size=2", "trainer.progress=false",
                                    "trainer.tensorboard=false", "trainer.dump_every=0",
                                    *[f"workflow.{k}={v}" for k, v in section.items() if k != "name"],
                                    "workflow=fold"])
    trainer = _Seen(assemble(cfg, engine=ScriptedEngine(FoldDemonstrator(), tokenizer=tok)))
    trainer.fit()
    key = lambda r: (tuple(r.prompt_ids), tuple(r.response_ids), tuple(r.loss_mask))  # noqa: E731
    assert sorted(key(r) for r in trainer.seen[1]) == sorted(key(r) for r in sft)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_path)
    losses = sft_train(model, sft, SFTConfig(epochs=6, batch_rows=6, lr=1e-3, warmup_steps=0, shuffle=False),
                       pad_id=tok.pad_token_id or 0)
    assert len(losses) == 6 and losses[-1] < losses[0]
