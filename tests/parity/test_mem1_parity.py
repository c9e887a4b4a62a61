"""MEM1 as its public code runs it (MIT-MI/MEM1 Mem1/train/rollout/llm_agent/generation_think.py
`run_llm_loop` / `_update_rolling_state`, tensor_helper.py `mask_using_kept_lengths`), against memrl's
mem1 workflow under the mem1_official preset; expected contexts derived by hand in the comments."""

from __future__ import annotations

import asyncio
import random

from doubles import ScriptedEngine

from memrl.config import load_config
from memrl.training.config import TrainConfig
from memrl.types import Task
from memrl.workflows.mem1 import Mem1Config, run

H = "<user>Q:Where?</user><assistant>"  # the prompt as the character tokenizer's template renders it
R0, K0 = "ok <think>s0</think><search>Rome</search>", "<think>s0</think><search>Rome</search>"
R1, K1 = "hm <think>s1</think><search>Rome</search>", "<think>s1</think><search>Rome</search>"
R2 = "<think>s2</think><answer>Italy</answer>"


def obs(hint: str) -> str:
    return f"\n\n<information>{hint}\n\n(1) Rome is in Italy</information>\n\n"


O0, O1 = obs("3 left"), obs("2 left")


def play(**kw):
    c = Mem1Config(max_turns=4, max_turn_tokens=200, temperature=0.0, prompt_template="Q:{question}",
                   retriever_scope="task", hint_turns_left="{n} left", hint_last_turn="last", state_tag="think", **kw)
    engine = ScriptedEngine([R0, R1, R2])
    asyncio.run(run(Task("t", "Where?", "", ["Italy"], meta={"documents": ["Rome is in Italy"]}), engine, c,
                    random.Random(0)))
    return [call.prompt_text for call in engine.calls]


def test_the_published_cap_cuts_the_rolling_history():
    wf = load_config(TrainConfig, ["model.path=x", "data.path=t.jsonl", "model.device=cpu"],
                     preset="mem1_official").workflow
    assert (wf["context_cap"], wf["max_context_tokens"]) == ("rolling", 4096)
    # _update_rolling_state appends each turn's reply (cut after its action, everything before <think>
    # included) and observation to the rolling ids and keeps the last max_prompt_length = N of them;
    # mask_using_kept_lengths then shows the window's first len(prompt) tokens (initial_token_lengths) and
    # its last kept_lengths tokens (the reply from <think> + the observation).
    n = len(H) + len(K1 + O1) + 10
    full1, full2 = H + R0 + O0, H + R0 + O0 + R1 + O1
    assert len(full1) <= n < len(full2)  # turn 1's history fits, turn 2's does not
    window = full2[-n:]
    published = [H, H + K0 + O0, window[: len(H)] + K1 + O1]
    assert "Q:Where?" not in published[2]  # the question fell out of the window
    assert play(max_context_tokens=n, context_cap="rolling") == published
    # memrl's cap cuts only what the call sees (prompt + latest state), which fits N here
    assert play(max_context_tokens=n) == [H, H + K0 + O0, H + K1 + O1]
