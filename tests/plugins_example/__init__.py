"""Example plugin modules a config names by import path (tests only; on the tests' path as
`plugins_example`, through pyproject's pytest `pythonpath`)."""

import sys

import pytest

from memrl.algorithms import base

ESTIMATORS = "plugins_example.estimators"


@pytest.fixture
def registry_restored():
    """The example estimators module registers its estimator and loss in memrl's tables when imported; leave
    the tables (and the import) as they were, so later tests see the built-ins only."""
    saved = [(t, dict(t)) for t in (base.ADVANTAGES, base.LOSSES, base.OPTIONS)]
    yield
    for table, old in saved:
        table.clear()
        table.update(old)
    sys.modules.pop(ESTIMATORS, None)
