"""The training ranks: the worker group, the FSDP2 policy workers, process groups and Ray placement."""
