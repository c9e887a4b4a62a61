"""memrl: train and evaluate long-context memory agents with reinforcement learning."""

__version__ = "0.1.0"
