"""What a published-recipe training run needs from the user: the published prompts (an official preset
without template files stops before any work, one line naming workflow.memory_template_file) and, for
MemAgent's index-only files, the dev file their contexts index (`data.docs_from`)."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.config import load_config
from memrl.data.io import DataError
from memrl.training.assemble import task_stream
from memrl.training.config import TrainConfig


@pytest.mark.parametrize("preset", ["memagent_official", "rememr1_official", "memagent_vime"])
def test_official_preset_without_templates_is_one_line_naming_the_field(preset, tmp_path, capsys):
    rc = main(["train", "--preset", preset, "model.path=x", "data.path=t.jsonl", "model.device=cpu",
               f"out_dir={tmp_path / 'run'}"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("memrl train: error: workflow: workflow.memory_template_file is required "
                             "(workflow.require_template_files=true")
    assert not (tmp_path / "run").exists()  # before any work


# A dev file in HotpotQA's original layout; its document list (memrl.data.index_only.document_list): every
# paragraph "{title}\n{sentences joined}", deduplicated, sorted by code point: "Beta\nb." (0x42) < "alpha\na."
# (0x61) -> indices 0, 1. An index-only row (MemAgent's eval_index layout) holds those indices; the context is
# rebuilt as "Document {i}:\n{doc}" (i from 1), blank lines between.
DEV = [{"_id": "x1", "question": "q", "answer": "a", "type": "bridge", "level": "easy",
        "supporting_facts": [["Beta", 0]], "context": [["Beta", ["b."]], ["alpha", ["a."]]]}]
ROW = {"context": [1, 0], "input": "Which one?", "answers": ["alpha"], "num_docs": 12800, "index": 3}


def test_train_reads_index_only_files_with_data_docs_from(tmp_path):
    dev = tmp_path / "hotpot_dev.json"
    dev.write_text(json.dumps(DEV))
    data = tmp_path / "eval_12800.json"
    data.write_text(json.dumps([ROW]))
    base = ["data.name=file", f"data.path={data}", "data.shuffle=false"]
    task = next(task_stream(load_config(TrainConfig, [*base, f"data.docs_from={dev}"]), 0))
    assert (task.task_id, task.question, task.answers) == ("3@e0", "Which one?", ["alpha"])
    assert task.context == "Document 1:\nalpha\na.\n\nDocument 2:\nBeta\nb."
    with pytest.raises(DataError, match=r"eval_12800\.json: row 0: field 'context' holds document indices.*"
                                         r"`data\.docs_from=FILE` \(memrl train\)"):
        task_stream(load_config(TrainConfig, base), 0)
    assert load_config(TrainConfig, []).data.docs_from == ""  # default: none


def test_weight_decay_scope_matrices_leaves_biases_and_norms_undecayed(tmp_path):
    """optim.weight_decay_scope=matrices (Megatron's rule, memagent_vime): the tiny Qwen2's q/k/v biases and
    RMSNorm weights (1-D) in a group with weight decay 0, every matrix in the decayed group; "all" (memrl,
    verl) keeps one group of every parameter."""
    from memrl.models.tiny import cached_tiny_model
    from memrl.training.ranks.workers import PolicyWorker

    model = str(cached_tiny_model("tiny"))
    base = [f"model.path={model}", "algorithm.kl_coef=0", "optim.weight_decay=0.1"]
    w = PolicyWorker(load_config(TrainConfig, [*base, "optim.weight_decay_scope=matrices"]))
    names = {id(p): n for n, p in w.model.named_parameters()}
    decayed, plain = w.opt.param_groups
    assert decayed["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decayed["params"])
    plain_names = sorted(names[id(p)] for p in plain["params"])
    assert plain_names and all(n.endswith(".bias") or n.endswith("norm.weight") for n in plain_names)
    assert any(n.endswith("q_proj.bias") for n in plain_names) and "model.norm.weight" in plain_names
    assert len(decayed["params"]) + len(plain["params"]) == len(names)
    (group,) = PolicyWorker(load_config(TrainConfig, base)).opt.param_groups
    assert group["weight_decay"] == 0.1 and len(group["params"]) == len(names)
