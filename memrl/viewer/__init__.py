"""`memrl view`: a local web page over eval and training runs (trajectories, memory diffs, curves)."""
