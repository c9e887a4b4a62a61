"""Demonstrators: scripted policies (prompt text in, reply text out) and the engine that plays them.

- engine.ScriptedEngine: the Engine protocol over a script (records demonstrations; scripts tests).
- synthetic.RecentFactsRule / QuestionAwareRule: the synthetic task's cold-start rule and optimal policy.
- lookback.LookbackOracle: the look-back task's reference policy (MemAgent and ReMemR1 formats).
"""

from memrl.demonstrators.engine import ScriptedEngine
from memrl.demonstrators.lookback import LookbackOracle
from memrl.demonstrators.synthetic import QuestionAwareRule, RecentFactsRule

__all__ = ["LookbackOracle", "QuestionAwareRule", "RecentFactsRule", "ScriptedEngine"]
