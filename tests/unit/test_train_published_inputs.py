"""What a published-recipe training run needs from the user: the published prompts (an official preset
without template files stops before any work, one line naming workflow.memory_template_file) and, for
MemAgent's index-only files, the dev file their contexts index (`data.docs_from`)."""

from __future__ import annotations

import json

import pytest

from memrl.cli import main
from memrl.config import load_config
from memrl.data.io import DataError
from memrl.training.config import TrainConfig
from memrl.training.trainer import task_stream


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
