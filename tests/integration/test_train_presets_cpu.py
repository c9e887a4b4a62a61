"""`memrl train --preset memagent_official | rememr1_official | memagent_vime` on the tiny model (CPU), 2 RL steps
each, with the published reward and update schedule and user-supplied template files.

Only size, device and logging keys are overridden (model, engine, device, dtype, batch size, n, chunk sizes and
generation budgets, steps, out_dir, data). The tiny model cannot write a `\\boxed{}` answer, so the rollouts come
from a scripted policy behind a real OpenAI-compatible server on 127.0.0.1 (CompletionServer in tests/doubles.py;
`engine=openai`): it answers half of the final calls `\\boxed{Beatles}` and half `\\boxed{The Beatles}`. The gold
is "Beatles": memrl's boxed_em scores both 1 (articles dropped), the published verl_hotpotqa only the first
(its strip_string keeps "the" and removes spaces: "thebeatles" != "beatles"), so reward/mean = 0.5 proves
the published reward ran (boxed_em would give 1.0). The policy still trains on the scripted rows.
"""

from __future__ import annotations

import itertools
import json
import threading

import pytest

from memrl.cli import main
from memrl.rewards.verifiers import get_verifier

pytestmark = pytest.mark.slow

GOLD = "Beatles"
ANSWERS = ("Final: \\boxed{Beatles}", "Final: \\boxed{The Beatles}")
CONTEXT = " ".join(f"Sentence {i} says the band from Liverpool was formed in 1960." for i in range(6))


def test_the_two_answers_separate_the_verifiers():
    """By hand (memrl.rewards.verifiers docstring): verl_hotpotqa 1 / 0, boxed_em 1 / 1."""
    assert [get_verifier("verl_hotpotqa")(a, [GOLD]) for a in ANSWERS] == [1.0, 0.0]
    assert [get_verifier("boxed_em")(a, [GOLD]) for a in ANSWERS] == [1.0, 1.0]


@pytest.fixture(scope="module")
def tiny_path():
    from memrl.models.tiny import cached_tiny_model

    return str(cached_tiny_model("tiny"))


def _files(tmp, style: str, recall: bool) -> list[str]:
    """The user's template files in the published placeholders ({prompt}, ReMemR1's {recalled_memory}),
    our own wording; str_format files escape their braces as the published strings do."""
    box = "\\boxed{{}}" if style == "str_format" else "\\boxed{}"
    rec = "Recalled: {recalled_memory}\n" if recall else ""
    mem = tmp / "memory.txt"
    mem.write_text(f"Problem: {{prompt}}\n{rec}Memory: {{memory}}\nSection: {{chunk}}\nUpdate the memory.\n")
    fin = tmp / "final.txt"
    fin.write_text(f"Problem: {{prompt}}\n{rec}Memory: {{memory}}\nFinal answer as {box}:\n")
    return [f"workflow.memory_template_file={mem}", f"workflow.final_template_file={fin}"]


def _tasks(tmp, k: int) -> str:
    p = tmp / "tasks.jsonl"
    p.write_text("".join(json.dumps({"task_id": f"q{i}", "question": "Which band is it?", "context": CONTEXT,
                                     "answers": [GOLD]}) + "\n" for i in range(k)))
    return str(p)


def _policy(tokenizer, update_tags: bool):
    from memrl.demonstrators.engine import ScriptedEngine

    counter, lock = itertools.count(), threading.Lock()

    def script(prompt: str, _: int) -> str:
        if "Final answer as" in prompt:
            with lock:
                return ANSWERS[next(counter) % 2]
        return "<update>The band is the Beatles.</update>" if update_tags else "The band is the Beatles."

    return ScriptedEngine(script, tokenizer)


def _train(tiny_path, tmp, preset: str, style: str, recall: bool, *sizes: str) -> tuple[list[dict], list[str]]:
    from doubles import CompletionServer
    from transformers import AutoTokenizer

    policy = _policy(AutoTokenizer.from_pretrained(tiny_path), update_tags=recall)
    with CompletionServer(policy) as server:
        rc = main(["train", "--preset", preset, f"model.path={tiny_path}", "model.device=cpu", "model.dtype=float32",
                   "engine=openai", f"engine.openai.base_url={server.url}", f"out_dir={tmp / 'run'}",
                   f"data.path={_tasks(tmp, 16)}", "trainer.steps=2", "trainer.progress=false",
                   "trainer.tensorboard=false", "workflow.chunk_tokens=8", "workflow.max_chunks=2",
                   "workflow.max_memory_tokens=48", "workflow.max_final_tokens=48", *_files(tmp, style, recall),
                   *sizes])
    assert rc == 0
    metrics = [json.loads(line) for line in (tmp / "run" / "metrics.jsonl").read_text().splitlines()]
    return metrics, [c.prompt_text for c in policy.calls]


@pytest.mark.parametrize("preset, recall", [("memagent_official", False), ("rememr1_official", True)])
def test_verl_presets_train_two_steps_with_the_published_reward_and_schedule(tiny_path, tmp_path, preset, recall):
    # Published: 128 tasks per batch in 16 mini-batches, cut per rank on 32 ranks (verl's row cut). Shrunk to 2
    # tasks x n=2 in 2 mini-batches on 2 ranks by the same row rule (16 steps need 16 tasks and take minutes on a
    # shared CPU; the parity test checks the 16 and the 32). CONTEXT is longer than 16 tokens, so max_chunks=2 x
    # chunk_tokens=8 (centre cut) gives exactly 2 memory calls + 1 final = 3 rows per trajectory: 2 * 2 * 3 = 12
    # rows, 2 rank shares of 6, each cut in 3 + 3: 2 steps of 6 rows each.
    metrics, prompts = _train(tiny_path, tmp_path, preset, "memrl", recall, "trainer.batch_size=2", "algorithm.n=2",
                              "trainer.mini_batches=2", "trainer.mini_batch_ranks=2")
    assert len(metrics) == 2
    for m in metrics:
        assert m["train/optimizer_steps"] == 2.0 and m["train/rows"] == 12.0 and m["rollout/segments"] == 12.0
        assert m["reward/mean"] == 0.5  # verl_hotpotqa; boxed_em would score every answer 1.0
    assert len(prompts) == 2 * 12 and sum("Section:" in p for p in prompts) == 2 * 8  # the user's templates
    assert all("\\boxed{}" in p for p in prompts if "Final answer as" in p)  # memrl style: text as written


def test_vime_preset_trains_two_steps_with_the_published_reward_and_schedule(tiny_path, tmp_path):
    # Published: a step every 64 rows (GLOBAL_BATCH_SIZE), the tail past the last multiple of 64 dropped. Shrunk
    # to 2 tasks x n=4 (8 trajectories x 3 rows = 24 rows; head cut to 2 chunks) with a step every 10 rows:
    # 24 // 10 = 2 steps of 10 rows, the last 4 rows dropped (vime's trim).
    metrics, prompts = _train(tiny_path, tmp_path, "memagent_vime", "str_format", False, "trainer.batch_size=2",
                              "algorithm.n=4", "trainer.mini_batch_rows=10")
    assert len(metrics) == 2
    for m in metrics:
        assert m["train/optimizer_steps"] == 2.0 and m["train/rows"] == 20.0 and m["rollout/segments"] == 24.0
        assert m["reward/mean"] == 0.5
    finals = [p for p in prompts if "Final answer as" in p]
    assert len(finals) == 16 and all("\\boxed{}:" in p and "{{" not in p for p in finals)  # str.format read
