"""Example plugin modules a config names by import path (tests only; on the tests' path as
`plugins_example`, through pyproject's pytest `pythonpath`)."""
