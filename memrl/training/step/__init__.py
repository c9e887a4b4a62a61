"""The RL step's stages on the driver: rollout, the update schedule, step extras and metrics, validation."""
