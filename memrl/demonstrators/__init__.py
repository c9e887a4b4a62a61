"""Demonstrators: scripted policies (prompt text in, reply text out) and the engine that plays them.

- engine.ScriptedEngine: the Engine protocol over a script (records demonstrations; scripts tests).
- synthetic.RecentFactsRule / QuestionAwareRule / MixtureRule: the synthetic task's question-blind rule, optimal
  policy, and the mixture of the two (the demo's cold start: optimal with probability p_aware per memory step).
- lookback.LookbackOracle: the look-back task's reference policy (MemAgent and ReMemR1 formats).
- infmem.ReadingOracle: the synthetic one-fact task's oracle under MemAgent and InfMem (retrieve the asked key,
  STOP once the memory holds its fact; the InfMem demo's cold start, benchmarks/infmem_mem1_effects.py).
"""

from memrl.demonstrators.engine import ScriptedEngine
from memrl.demonstrators.infmem import ReadingOracle
from memrl.demonstrators.lookback import LookbackOracle
from memrl.demonstrators.synthetic import MixtureRule, QuestionAwareRule, RecentFactsRule

__all__ = ["LookbackOracle", "MixtureRule", "QuestionAwareRule", "ReadingOracle", "RecentFactsRule", "ScriptedEngine"]
