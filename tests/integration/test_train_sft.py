"""Cold-start SFT on workflow traces lowers the loss, with the same Segment rows as RL."""

from __future__ import annotations

import pytest

from memrl.data.synthetic import SyntheticConfig, make_tasks
from memrl.demonstrators import RecentFactsDemonstrator, ScriptedEngine
from memrl.runtime import rollout_once
from memrl.training.sft import SFTConfig, sft_train
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig

pytestmark = pytest.mark.slow

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"


def test_sft_on_rule_traces_lowers_loss():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.models.tiny import cached_tiny_model

    path = cached_tiny_model("tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    wf = MemAgentConfig(chunk_tokens=24, max_memory_tokens=24, max_final_tokens=12, memory_template=MT,
                        final_template=FT)
    rule = RecentFactsDemonstrator(MT, FT, budget=1, skip_prob=0.0)
    tasks = make_tasks(SyntheticConfig(num_chunks=2, chunk_words=8, num_keys=4, num_values=4), 24, seed=0)
    groups = rollout_once(tasks, get_workflow("memagent"), ScriptedEngine(rule, tokenizer=tok), wf, n=1)
    segments = [s for g in groups for s in g.segments()]
    assert all(s.loss_mask and all(s.loss_mask) for s in segments)
    assert groups[0].trajectories[0].segments[0].info["memory"].startswith(("- ", "No previous"))
    losses = sft_train(model, segments, SFTConfig(epochs=4, batch_rows=18, lr=3e-3, warmup_steps=2,
                                                  token_budget=1024), pad_id=tok.pad_token_id)
    assert len(losses) >= 8
    assert sum(losses[-3:]) / 3 < 0.7 * sum(losses[:3]) / 3


def test_sft_moves_every_micro_batch_to_the_models_device(monkeypatch):
    """`memrl train-sft model.device=cuda` put the model on the GPU while batches stayed on the CPU (an
    "Expected all tensors to be on the same device" error at the first forward): every collated
    micro-batch must be sent to the device of the model's parameters."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memrl.models.tiny import cached_tiny_model
    from memrl.training import sft as sft_module
    from memrl.training.update import packing

    path = cached_tiny_model("tiny")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    wf = MemAgentConfig(chunk_tokens=24, max_memory_tokens=24, max_final_tokens=12, memory_template=MT,
                        final_template=FT)
    tasks = make_tasks(SyntheticConfig(num_chunks=2, chunk_words=8, num_keys=4, num_values=4), 4, seed=0)
    groups = rollout_once(tasks, get_workflow("memagent"),
                          ScriptedEngine(RecentFactsDemonstrator(MT, FT, budget=1, skip_prob=0.0), tokenizer=tok), wf, n=1)
    segments = [s for g in groups for s in g.segments()]
    moved: list[torch.device] = []
    collated: list[int] = []
    real_to, real_collate = packing.MicroBatch.to, sft_module.collate

    def spy_to(self, device):
        moved.append(torch.device(device))
        return real_to(self, device)

    def spy_collate(rows, weights, pad_id=0):
        collated.append(len(rows))
        return real_collate(rows, weights, pad_id)

    monkeypatch.setattr(packing.MicroBatch, "to", spy_to)
    monkeypatch.setattr(sft_module, "collate", spy_collate)
    sft_train(model, segments, SFTConfig(epochs=1, batch_rows=len(segments), token_budget=200),
              pad_id=tok.pad_token_id)
    assert len(collated) >= 2 and sum(collated) == len(segments)  # the budget split the batch
    assert moved == [torch.device("cpu")] * len(collated)
