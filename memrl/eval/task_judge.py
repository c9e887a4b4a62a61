"""An LLM judge for tasks whose official score is a judge's (LongMemEval), run by `memrl eval` in the score stage.

`memrl eval ... judge.url=http://HOST:PORT/v1 judge.model=NAME [judge.api_key_env=VAR] [judge.prompts_dir=DIR]`:
every task whose meta["judge"] is "longmemeval" gets one judge call per answer, through the run's judge client
(memrl.services.session.Services.judge -> memrl.rewards.judge.JudgeClient.chat: one user message, the
section's model, temperature and max_tokens; retries, timeouts and failure counting as for every memrl
judge). The prompt is chosen by the question's type (memrl.rewards.longmemeval: memrl's wording unless
`prompts_dir` holds the user's copies of the published prompts) and the verdict is read as published ("yes"
in the reply). The row gets `longmemeval_judge` (1.0 / 0.0); a failed call scores 0 and is counted in the
row's metrics as judge_error and judge_error_<kind>. Without judge.url nothing is judged (the rule score
`longmemeval_rule` is still there). Other tasks are never sent.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from memrl.config import MAX_TOKENS, ConfigError, valid
from memrl.data.longmemeval import JUDGE
from memrl.rewards import longmemeval
from memrl.rewards.extract import extract_prediction
from memrl.rewards.judge import JudgeSettings
from memrl.types import Score, Task, Trajectory
from memrl.workflows.rollouts import score_trajectory

log = logging.getLogger(__name__)

JUDGE_COLUMN = "longmemeval_judge"
"""The row column (and trajectory metric) of the judge's verdict."""


@dataclass
class TaskJudge(JudgeSettings):
    """`memrl eval`'s judge section (`judge.<field>`): memrl's judge settings (memrl.rewards.judge.JudgeSettings;
    its rubric and verdict tags are not used here: the prompt is per question type and the verdict is "yes"),
    with LongMemEval's published call: at most 10 tokens, temperature 0."""

    max_tokens: int = valid(10, ge=1, le=MAX_TOKENS)
    """Generation budget of one verdict (published: 10)."""
    prompts_dir: str = ""
    """A directory with the user's judge prompts, one text file per kind (answer.txt, temporal.txt,
    update.txt, preference.txt, abstention.txt; slots {question}, {gold}, {prediction}, or three {} in that
    order); "" = memrl's own prompts (not the published text)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.url:
            longmemeval.load_prompts(self.prompts_dir or None)  # a missing or bad file fails now, named

    def api_key(self) -> str | None:
        """The key the variable `api_key_env` names (None without one); a one-line ConfigError naming
        judge.api_key_env when that variable is not set (memrl eval checks it before any model loads)."""
        key = os.environ.get(self.api_key_env) if self.api_key_env else None
        if self.api_key_env and not key:
            raise ConfigError(f"judge.api_key_env={self.api_key_env}: that environment variable is not set")
        return key

    def client_settings(self) -> dict[str, Any]:
        """The fields the run's judge client is built from (memrl.services.session.Services.judge)."""
        fields = dataclasses.asdict(self)
        fields.pop("prompts_dir")
        return fields

    def record(self) -> dict[str, Any]:
        """What eval_config.json records of this judge (no key: only the variable's name)."""
        keep = ("url", "model", "max_tokens", "temperature", "top_p", "prompts_dir")
        return {k: getattr(self, k) for k in keep}


def judged(task: Task) -> bool:
    """Whether `task`'s official score is a judge's this module runs."""
    return task.meta.get("judge") == JUDGE


def prediction_of(traj: Trajectory, extract: str) -> str:
    """The prediction the row is scored on (as memrl.eval.runner.score_prediction reads it)."""
    if extract == "boxed" or "answer_text" not in traj.info:
        return traj.final_answer or ""
    return extract_prediction(traj.info["answer_text"], extract)


async def judge_task(task: Task, prediction: str, settings: TaskJudge, prompts: dict[str, str],
                     services: Any) -> dict[str, float]:
    """The judge's metrics for one answer: {JUDGE_COLUMN: 1.0 | 0.0} (+ judge_error, judge_error_<kind>)."""
    if not prediction.strip():  # nothing to judge: scores 0 without a call
        return {JUDGE_COLUMN: 0.0, "judge_empty": 1.0}
    question = str(task.meta.get("question", task.question))
    prompt = longmemeval.judge_prompt(task.meta, question, task.answers[0], prediction, prompts)
    client = services.judge(settings.client_settings())
    kind, text = await client.chat(prompt)
    client.counters["judge_calls"] += 1
    if kind is not None:
        client.counters["judge_error"] += 1
        n = client.counters["judge_error"]
        if n == 1 or str(n).strip("0") == "1":  # the first failure, then at 10, 100, ... (the run goes on)
            log.warning("judge %s: %d judgement(s) failed so far, each scored 0 (this one: %s: %s)", settings.url, n,
                        kind, text[:300])
        return {JUDGE_COLUMN: 0.0, "judge_error": 1.0, f"judge_error_{kind}": 1.0}
    return {JUDGE_COLUMN: float(longmemeval.verdict_yes(text))}


def with_task_judge(spec: Any, settings: TaskJudge, extract: str) -> Any:
    """`spec` whose score stage also judges the tasks `judged` picks (its own reward unchanged)."""
    prompts = longmemeval.load_prompts(settings.prompts_dir or None)

    async def reward(task: Task, traj: Trajectory, services: Any = None) -> Score:
        score = await score_trajectory(spec, task, traj, services)
        if judged(task):
            try:
                verdict = await judge_task(task, prediction_of(traj, extract), settings, prompts, services)
            except Exception as e:  # noqa: BLE001 - the workflow's own score stays; the judgement scores 0
                log.warning("judging task %s failed: %s: %s", task.task_id, type(e).__name__, e)
                verdict = {JUDGE_COLUMN: 0.0, "judge_error": 1.0, "judge_error_exception": 1.0}
            score.metrics.update(verdict)
        return score

    return dataclasses.replace(spec, reward=reward, step_rewards=None)
