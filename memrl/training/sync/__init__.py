"""The policy's weights to the rollout engines: the sync stage, Ray replicas, LoRA adapters, sync check."""
