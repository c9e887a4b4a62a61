"""MemAct DCPO is bit-reproducible: two identical runs end with equal weights (torch.equal on every tensor)
and identical trajectories (token ids and logprobs), and a resumed run ends equal to the uninterrupted one.

The policy must really search between its model calls (a rollout that awaits a search is what used to
reorder the hf engine's waves: BM25 ran in a thread and each trajectory came back at a time-dependent
point, so which calls shared a forward pass changed from run to run). Measured with these tests' runs
before the fix: the same token ids, rollout logprobs up to 1.5e-5 apart, and after two steps all 27 weight
tensors differed, by up to 3.4e-5. So the tiny model is first taught the scripted agent's search calls (SFT),
the test checks that its rollouts do search, and a reward for searching makes every step move the weights.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from memrl.config import load_config
from memrl.training.assemble import assemble
from memrl.training.config import TrainConfig
from memrl.training.trainer import Trainer
from memrl.workflows import WorkflowSpec, register_workflow

pytestmark = pytest.mark.slow

SEARCHER_VERSION = 1  # bump when _build_searcher changes
ROOT = Path(__file__).resolve().parents[2]

WF = {"retriever_scope": "task", "max_turn_tokens": 64, "max_assistant_turns": 4,
      "system_template": "Search, prune, answer.", "answer_instruction": "Answer in JSON after FINAL_ANSWER."}


def _build_searcher(out: Path) -> None:
    """A small Qwen2 on the tiny tokenizer (compact tool template) taught the scripted agent's search calls:
    40 SFT epochs on the first turn of 16 tasks (42 rows: the task prompt -> one search call per
    sub-question). At the runs' temperature 0.4 about a third of its trajectories make a well-formed search
    call (the others a malformed one), so some rollouts await a search between two model calls."""
    from transformers import AutoTokenizer, Qwen2ForCausalLM

    from memrl.data.synthetic_memact import MemActTaskConfig, make_tasks
    from memrl.data.tasks_jsonl import write_tasks
    from memrl.demonstrators.memact import search_reply
    from memrl.demonstrators.stages import memact_demonstrations as demonstrations
    from memrl.models.tiny import CHAT_TEMPLATE_COMPACT_TOOLS, ModelPreset, cached_tiny_model, qwen2_config
    from memrl.training.sft import SFTConfig, sft_train
    from memrl.types import Segment
    from memrl.workflows.memact import MemActConfig

    tok = AutoTokenizer.from_pretrained(cached_tiny_model("tiny"))
    tok.chat_template = CHAT_TEMPLATE_COMPACT_TOOLS
    tasks = make_tasks(MemActTaskConfig(sub_questions=[2, 3]), 16, seed=12)
    groups = demonstrations(tasks, tok, MemActConfig(max_context_tokens=4000, **WF), late_prob=0.0, seed=0)
    rows = []
    for g, task in zip(groups, tasks, strict=True):
        prompt = g.trajectories[0].segments[0].prompt_ids  # the task prompt up to the first assistant header
        for attr, name in zip(task.meta["attributes"], task.meta["entities"], strict=True):
            reply = tok.encode(search_reply(attr, name), add_special_tokens=False) + [tok.eos_token_id]
            rows.append(Segment(prompt, reply, [0.0] * len(reply), [1] * len(reply)))
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(qwen2_config(ModelPreset(4096, 64, 128, 2, 2, 1), len(tok), tok.eos_token_id,
                                          tok.pad_token_id))
    sft_train(model, rows, SFTConfig(epochs=40, batch_rows=40, lr=1e-2, warmup_steps=2, seed=0))
    model.save_pretrained(out)
    tok.save_pretrained(out)
    write_tasks(out / "tasks.jsonl", tasks[:4])


@pytest.fixture(scope="session")
def searching_model() -> tuple[Path, Path]:
    """(model dir, tasks file of 4 tasks, each with its own fact sheet), built once per machine into memrl's
    model cache (a few minutes on a busy 2-core machine); safe against concurrent builders."""
    from memrl.models.tiny import default_cache_dir

    target = default_cache_dir() / f"memact-searcher-v{SEARCHER_VERSION}"
    if not (target / "tasks.jsonl").is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            _build_searcher(tmp)
            try:
                os.replace(tmp, target)
            except OSError:  # another builder won the race
                if not (target / "tasks.jsonl").is_file():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target, target / "tasks.jsonl"


def _searched(task, traj) -> float:
    """Reward 1 for a trajectory that searched: the tiny policy never answers right, so the rule reward would
    be 0 everywhere, every DCPO advantage 0 and the weights would never move; this one splits each group."""
    return float(traj.metrics["searches"] > 0)


def _searched_spec() -> WorkflowSpec:
    from memrl.workflows import memact

    return WorkflowSpec("memact_searched", memact.run, memact.MemActConfig, _searched)


register_workflow("memact_searched", _searched_spec)


class _Recording(Trainer):
    """Keeps every rolled-out trajectory: (id, reward, [(prompt ids, response ids, logprobs) per segment])."""

    def select(self, groups):
        self.trajectories = getattr(self, "trajectories", [])
        self.trajectories += [(t.trajectory_id, t.reward, t.metrics.get("searches", 0.0),
                               [(s.prompt_ids, s.response_ids, s.response_logprobs) for s in t.segments])
                              for g in groups for t in g.trajectories]
        return super().select(groups)


def _overrides(searching_model, out, steps: int, save_every: int = 0) -> list[str]:
    """DCPO on memact_searched: 2 tasks x 4 trajectories per step, sampled at temperature 0.4."""
    model, tasks = searching_model
    return [f"model.path={model}", f"out_dir={out}", f"trainer.steps={steps}", "workflow=memact_searched",
          *[f"workflow.{k}={v}" for k, v in WF.items()], "workflow.max_context_tokens=4000",
          "workflow.no_prune_prob=0.0", "data.name=file", f"data.path={tasks}", "algorithm.name=dcpo",
          "algorithm.selection=spread_unused", "algorithm.n=4", "algorithm.segments_per_task=5",
          "trainer.batch_size=2", "algorithm.temperature=0.4", "algorithm.kl_coef=0.0", "optim.lr=1e-3", "optim.warmup_steps=0",
          f"trainer.save_every={save_every}", "trainer.progress=false", "trainer.tensorboard=false",
          "trainer.dump_every=0"]


def _run(searching_model, out, steps: int, resume: bool = False, save_every: int = 0) -> _Recording:
    trainer = _Recording(assemble(load_config(TrainConfig, _overrides(searching_model, out, steps, save_every)), resume=resume))
    trainer.fit()
    return trainer


def _assert_equal_weights(a: _Recording, b: _Recording) -> None:
    sa, sb = a.model.state_dict(), b.model.state_dict()
    assert sa.keys() == sb.keys()
    diff = max((sa[k] - sb[k]).abs().max().item() for k in sa)
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{k} differs (max abs difference over all weights: {diff:.3g})"


def test_two_memact_dcpo_runs_are_bit_identical(searching_model, tmp_path):
    a = _run(searching_model, tmp_path / "a", 2)
    b = _run(searching_model, tmp_path / "b", 2)
    assert sum(t[2] for t in a.trajectories) > 0, "the policy never searched: the test would prove nothing"
    before = _initial(searching_model[0])
    assert any(not torch.equal(before[k], v) for k, v in a.model.state_dict().items()), "no weight moved"
    assert len(a.trajectories) == len(b.trajectories) == 2 * 2 * 4  # steps x tasks x n
    for x, y in zip(a.trajectories, b.trajectories, strict=True):
        assert x == y, f"trajectory {x[0]} differs between two identical runs"
    _assert_equal_weights(a, b)
    sa, sb = a.parts.workers.opt.state_dict()["state"], b.parts.workers.opt.state_dict()["state"]
    for i in sa:
        assert torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) and torch.equal(sa[i]["exp_avg_sq"], sb[i]["exp_avg_sq"])


def test_memact_dcpo_resume_is_exact(searching_model, tmp_path):
    straight = _run(searching_model, tmp_path / "a", 2)
    first = _run(searching_model, tmp_path / "b", 1, save_every=1)
    resumed = _run(searching_model, tmp_path / "b", 2, resume=True)
    assert resumed.state.position == straight.state.position
    assert sum(t[2] for t in first.trajectories + resumed.trajectories) > 0, "the policy never searched"
    assert first.trajectories + resumed.trajectories == straight.trajectories
    _assert_equal_weights(straight, resumed)


# `memrl train` in a child process with memact_searched registered (this module imported by path), on the
# same number of torch threads as this process: bit-exactness holds for one thread count (docs/CONTRACTS.md),
# and an earlier in-process test (`memrl demo ... threads=1`) may have changed this process's
CHILD = ("import sys; sys.path.insert(0, {here!r}); import torch; torch.set_num_threads({threads}); "
         "import test_memact_repro; from memrl.cli import main; sys.exit(main(['train', *sys.argv[1:]]))")


def test_memact_dcpo_killed_mid_rollout_resumes_exactly(searching_model, tmp_path):
    """kill -9 in the middle of step 2's rollout (its 4th trajectory: MEMRL_FAULT_AT=trajectory@12), then
    --resume from step 1's checkpoint: the run ends bit-identical to an uninterrupted one."""
    straight = _run(searching_model, tmp_path / "a", 2)
    out = tmp_path / "b"
    env = {k: v for k, v in os.environ.items() if k != "MEMRL_FAULT_AT"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["MEMRL_FAULT_AT"] = "trajectory@12"
    proc = subprocess.run([sys.executable, "-c", CHILD.format(here=str(Path(__file__).parent),
                                                          threads=torch.get_num_threads()),
                           *_overrides(searching_model, out, 2, save_every=1),
                           f"threads.intra_op={torch.get_num_threads()}"],  # memrl train sets it: this process's
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_000001"
    resumed = _run(searching_model, out, 2, resume=True)
    assert resumed.trajectories == straight.trajectories[8:]  # step 2's, redone whole
    _assert_equal_weights(straight, resumed)


def _initial(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()
