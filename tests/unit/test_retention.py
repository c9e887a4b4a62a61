"""memrl.recipes.retention: each memory call classified by hand-checked cases, and the counts over the real
MemAgent workflow with two scripted policies whose events follow from where each task's fact sits."""

from __future__ import annotations

import pytest

from memrl.data.synthetic import SyntheticConfig, corpus_text, make_tasks
from memrl.demonstrators import QuestionAwareDemonstrator, RecentFactsDemonstrator, ScriptedEngine
from memrl.eval.evaluator import EngineRollout, evaluate_rows
from memrl.models.tiny import train_tokenizer
from memrl.recipes.retention import RetentionCounter, classify_step
from memrl.workflows import get_workflow
from memrl.workflows.memagent import MemAgentConfig

MT = "Q: {problem}\nM: {memory}\nS:{chunk}"
FT = "Q: {problem}\nM: {memory}\nA:"


@pytest.mark.parametrize(("prev", "section", "new", "event"), [
    ("No previous memory", " Kalo is red the of", "- Kalo is red", "captured"),
    ("No previous memory", " Kalo is red the of", "- Kalo is blue", "missed"),
    ("- Kalo is blue", " Kalo is red the of", "- Kalo is blue", "missed"),  # a wrong value for the key blocks
    ("- Kalo is red", " Miran is blue the of", "- Kalo is red", "kept"),
    ("- Kalo is red", " Miran is blue the of", "- Miran is blue", "lost_replaced"),
    ("- Kalo is red", " Miran is blue the of", "- Kalo is blue", "lost_value_from_section"),
    ("- Kalo is red", " Miran is blue the of", "- Kalo is gold", "lost_value_other"),
    ("- Kalo is red", " Miran is blue the of", "- Miran is red", "lost_key_from_section"),
    ("- Kalo is red", " Miran is blue the of", "- Tor is red", "lost_key_other"),
    ("- Kalo is red", " Miran is blue the of", "- Kalo is", "lost_other"),
    ("- Kalo is red", " the of and", "No previous memory", "lost_other"),
    ("- Tor is gold", " Miran is blue the of", "- Miran is blue", "idle"),
    ("- Kalo is blue", " Miran is red the of", "- Kalo is red", "idle"),  # the value word alone is not the fact
])
def test_classify_step(prev, section, new, event):
    assert classify_step(prev, new, section, "Kalo", "red") == event


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    corpus = tmp_path_factory.mktemp("tok") / "corpus.txt"
    corpus.write_text(corpus_text(extra=(MT, FT, "No previous memory", "\\boxed{ red}") * 50), encoding="utf-8")
    return train_tokenizer([corpus], 2048)


def _count(tokenizer, rule, tasks) -> RetentionCounter:
    wf = MemAgentConfig(chunk_tokens=8, max_memory_tokens=10, max_final_tokens=6, memory_template=MT,
                        final_template=FT)
    counter = RetentionCounter()
    evaluate_rows(EngineRollout(ScriptedEngine(rule, tokenizer=tokenizer), get_workflow("memagent")), wf, tasks, samples=1,
                  temperature=0.0, on_trajectory=counter.add)
    return counter


def test_counts_through_the_workflow(tokenizer):
    syn = SyntheticConfig(num_chunks=6, chunk_words=8, fact_position="start")
    tasks = make_tasks(syn, 30, seed=4)
    at = [next(iter(t.meta["fact_chunks"].values())) for t in tasks]
    after = [6 - 1 - c for c in at]  # rewrites after the fact's own section
    # The optimal rule captures every fact and keeps it through every later rewrite.
    opt = _count(tokenizer, QuestionAwareDemonstrator(MT, FT), tasks)
    assert opt.events["captured"] == 30 and opt.events["kept"] == sum(after) and opt.lost == 0
    assert opt.events["idle"] == 30 * 6 - 30 - sum(after)
    assert (opt.loss_rate, opt.capture_rate) == (0.0, 1.0)
    # The blind rule (keep the newest fact) captures it too, and the next section's fact replaces it.
    blind = _count(tokenizer, RecentFactsDemonstrator(MT, FT, skip_prob=0.0), tasks)
    lost = sum(1 for a in after if a > 0)
    assert blind.events["captured"] == 30 and blind.events["lost_replaced"] == lost == blind.lost > 0
    assert blind.events["kept"] == 0 and blind.loss_rate == 1.0
    assert len(blind.examples["lost_replaced"]) == 5 and blind.skipped_tasks == 0
