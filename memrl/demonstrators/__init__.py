"""Demonstrators: scripted policies (prompt text in, reply text out) and the engine that plays them. Every
scripted policy is a `*Demonstrator` class in this package:

- engine.ScriptedEngine: the Engine protocol over a script (records demonstrations; scripts tests), and
  engine.play_scripted: a scripted policy played through a workflow by it (the one way traces are recorded).
- synthetic.RecentFactsDemonstrator / QuestionAwareDemonstrator / MixtureDemonstrator: the synthetic task's
  question-blind rule, optimal policy, and the mixture of the two (the demo's cold start: optimal with
  probability p_aware per memory step).
- lookback.LookbackDemonstrator: the look-back task's reference policy (MemAgent and ReMemR1 formats).
- infmem.ReadingDemonstrator: the synthetic one-fact task's optimal reader under MemAgent and InfMem
  (retrieve the asked key, STOP once the memory holds its fact; the InfMem demo's cold start,
  benchmarks/infmem_mem1_effects.py).
- mem1.StateDemonstrator: MEM1's optimal agent on the multi-objective lookup task (the MEM1 demo's cold start).
- memact.MemActDemonstrator: the MemAct agent on the lookup task (search, prune, answer).
- context.SearchDemonstrator / FoldDemonstrator / SummaryDemonstrator: the context-management family's
  agents (stages.context_demonstrator builds one by kind).
- evidence.EvidenceDemonstrator: MemAgent's supporting-fact reader on HotpotQA / 2Wiki task files
  (`memrl train-sft ... demonstrator.name=evidence`), and on RULER task files the needle reader
  (`EvidenceDemonstrator.for_needles`, `demonstrator.name=needle`: the sentences that hold a gold value).
"""

from memrl.demonstrators.engine import ScriptedEngine, play_scripted
from memrl.demonstrators.infmem import ReadingDemonstrator
from memrl.demonstrators.lookback import LookbackDemonstrator
from memrl.demonstrators.synthetic import (
    MixtureDemonstrator,
    QuestionAwareDemonstrator,
    RecentFactsDemonstrator,
)

__all__ = ["LookbackDemonstrator", "MixtureDemonstrator", "QuestionAwareDemonstrator", "ReadingDemonstrator",
           "RecentFactsDemonstrator", "ScriptedEngine", "play_scripted"]
