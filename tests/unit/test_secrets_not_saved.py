"""API keys never reach a run directory: `engine.openai.api_key` is redacted in eval_config.json and in
training's config.yaml (both through memrl.config.redact_secrets / to_yaml); the judge's key is only ever
read from the variable `workflow.judge.api_key_env` names."""

from __future__ import annotations

import json

from memrl.cli import main
from memrl.config import REDACTED, load_config, redact_secrets, to_yaml
from memrl.data.tasks_jsonl import write_tasks
from memrl.training.config import TrainConfig
from memrl.types import Task

KEY = "sk-memrl-test-0123456789"


def test_redact_secrets_tree():
    tree = {"engine": {"openai": {"api_key": KEY, "api_key_env": "OPENAI_API_KEY"}, "judge_api_key": KEY},
            "list": [{"api_key": KEY}, {"api_key": None}], "api_key": ""}
    assert redact_secrets(tree) == {
        "engine": {"openai": {"api_key": REDACTED, "api_key_env": "OPENAI_API_KEY"}, "judge_api_key": REDACTED},
        "list": [{"api_key": REDACTED}, {"api_key": None}], "api_key": ""}


def test_training_config_yaml_has_no_key():
    cfg = load_config(TrainConfig, [f"engine.openai.api_key={KEY}", "workflow=memact",
                                    "workflow.judge.api_key_env=JUDGE_KEY"])
    text = to_yaml(cfg)
    assert KEY not in text and f"api_key: {REDACTED}" in text and "api_key_env: JUDGE_KEY" in text
    assert cfg.engine.openai.api_key == KEY  # the running config keeps it; only the saved text is redacted


def test_eval_config_json_has_no_key(tmp_path, capsys):
    from memrl.models.tiny import cached_tiny_model

    write_tasks(tmp_path / "t.jsonl", [Task("t1", "q", "", ["a"])])
    out = tmp_path / "out"
    # no server at port 9: the run fails (one line), after the config was written
    rc = main(["eval", "--model", str(cached_tiny_model("tiny")), "--out", str(out), "--no-progress",
               str(tmp_path / "t.jsonl"), "engine=openai", f"engine.openai.api_key={KEY}",
               "engine.openai.base_url=http://127.0.0.1:9", "engine.openai.max_retries=0"])
    assert rc == 1 and "memrl eval: error:" in capsys.readouterr().err
    saved = (out / "eval_config.json").read_text()
    assert KEY not in saved and json.loads(saved)["engine"]["openai"]["api_key"] == REDACTED
