"""The look-back synthetic task and its scripted reference policies (MemAgent vs ReMemR1)."""

from __future__ import annotations

import re

import pytest
from doubles import ScriptedEngine

from memrl.data.synthetic import KEYS, find_facts
from memrl.data.synthetic_lookback import (
    LookbackConfig,
    make_lookback_task,
    make_lookback_tasks,
)
from memrl.demonstrators import LookbackDemonstrator
from memrl.runtime import rollout_once
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig
from memrl.workflows.rememr1 import ReMemR1Config


class WordTokenizer:
    """One token per word with its leading space (as the demo tokenizer gives for this task's words)."""

    pad_token_id, eos_token_id = 0, 1

    def __init__(self) -> None:
        self.vocab = {"<pad>": 0, "<eos>": 1}
        self.inv = ["<pad>", "<eos>"]

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        out = []
        for piece in re.findall(r" ?\w+|\s+|[^\s\w]", text):
            if piece not in self.vocab:
                self.vocab[piece] = len(self.inv)
                self.inv.append(piece)
            out.append(self.vocab[piece])
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(self.inv[i] for i in ids if not (skip_special_tokens and i < 2))

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True, **_):
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        text += "<assistant>" if add_generation_prompt else ""
        return self.encode(text) if tokenize else text


def test_tasks_are_seeded_and_plant_the_answer_before_the_link():
    cfg = LookbackConfig(num_chunks=6, chunk_words=24, facts_per_chunk=2)
    a = make_lookback_tasks(cfg, 20, seed=3)
    assert [t.context for t in a] == [t.context for t in make_lookback_tasks(cfg, 20, seed=3)]
    assert a[0].context != make_lookback_task(cfg, 4, 0).context
    for t in a:
        words = t.context.split(" ")[1:]
        assert len(words) == 6 * 24  # pieces of exactly chunk_words words
        pieces = [" ".join(words[i * 24 : (i + 1) * 24]) for i in range(6)]
        m = t.meta
        qkey = re.fullmatch(r"what is what (\w+) is", t.question).group(1)
        assert (qkey, m["bridge"]) in find_facts(pieces[m["link_chunk"]])
        assert (m["bridge"], t.answers[0]) in find_facts(pieces[m["answer_chunk"]])
        assert m["gap"] == m["link_chunk"] - m["answer_chunk"] > 0
        assert all(len(find_facts(p)) == 2 for p in pieces)
        keys = [k for k, _ in find_facts(t.context)]
        assert keys.count(qkey) == 1 and keys.count(m["bridge"]) == 1  # no distractor reuses them


def test_lookback_fraction_zero_puts_the_answer_at_or_after_the_link():
    cfg = LookbackConfig(num_chunks=5, lookback_fraction=0.0)
    assert all(t.meta["gap"] <= 0 for t in make_lookback_tasks(cfg, 30, seed=0))


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="num_chunks=1 is not allowed: must be in \\[2, 1000000\\]"):
        LookbackConfig(num_chunks=1)
    with pytest.raises(ValueError, match="facts_per_chunk"):
        LookbackConfig(facts_per_chunk=7, chunk_words=24)
    with pytest.raises(ValueError, match=f"num_keys=2 is not allowed: must be in \\[8, {len(KEYS)}\\]"):
        LookbackConfig(num_keys=2)


def _accuracy(name: str, tasks, **kw):
    wcfg = {"chunk_tokens": 24, "max_memory_tokens": 64, "max_final_tokens": 16, "temperature": 0.0, **kw}
    cfg = MemAgentConfig(**wcfg) if name == "memagent" else ReMemR1Config(**wcfg)
    engine = ScriptedEngine(LookbackDemonstrator.for_config(name, cfg), tokenizer=WordTokenizer())
    groups = rollout_once(tasks, get_workflow(name), engine, cfg, n=1)
    return [g.trajectories[0] for g in groups]


def test_overwriting_memory_drops_the_fact_and_a_callback_recovers_it():
    tasks = make_lookback_tasks(LookbackConfig(num_chunks=8), 60, seed=1)
    mem = _accuracy("memagent", tasks)
    rem = _accuracy("rememr1", tasks)
    # The reference MemAgent keeps the current piece's facts: right exactly when the link follows the
    # answer fact immediately (gap 1), else it guesses a remembered value (rarely right by chance);
    # ReMemR1 recalls the bridge and is always right.
    assert all(t.reward == 1.0 for task, t in zip(tasks, mem, strict=True) if task.meta["gap"] == 1)
    far_mem = [t.reward for task, t in zip(tasks, mem, strict=True) if task.meta["gap"] > 1]
    assert len(far_mem) > 30 and sum(far_mem) / len(far_mem) < 0.2
    assert all(t.reward == 1.0 for t in rem)
    far = [(task, t) for task, t in zip(tasks, rem, strict=True) if task.meta["gap"] > 1]
    assert far and all(t.metrics["recalls"] >= 1 and t.metrics["callback_hits"] >= 1 for _, t in far)
    assert all(t.metrics["format_errors"] == 0 for t in rem)


def test_oracle_follows_short_templates_and_writes_document_tokens():
    short = dict(memory_template="Q: {problem}\nR: {recalled_memory}\nM: {memory}\nS:{chunk}",
                 final_template="Q: {problem}\nR: {recalled_memory}\nM: {memory}\nA:")
    cfg = LookbackConfig(num_chunks=4, chunk_words=4, num_keys=8, num_values=4, fact_position="start")
    tasks = make_lookback_tasks(cfg, 40, seed=2)
    for t in tasks:
        assert all(p.split()[1] == "is" for p in re.findall(r"(?: \w+){4}", t.context))  # facts open pieces
        assert t.answers[0] in ("red", "blue", "green", "black")
    rem = _accuracy("rememr1", tasks, chunk_tokens=4, **short)
    assert all(t.reward == 1.0 for t in rem)
    step = next(s for t in rem for s in t.segments if s.info.get("recall_query"))
    assert step.info["response_text"].endswith(f"</update><recall> {step.info['recall_query']}</recall>")
    assert step.info["memory"].startswith("- ")  # memory_text keeps " Key" tokens as in the document
    assert rem[0].segments[-1].info["answer_text"].startswith("\\boxed{ ")
    with pytest.raises(ValueError, match="matches neither template"):
        LookbackDemonstrator("rememr1", "X{problem}{recalled_memory}{memory}{chunk}", "Y{problem}{recalled_memory}{memory}")("zzz")
