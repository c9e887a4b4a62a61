"""Agent tools: the Hermes tool-call parser, search and prune_context (MemAct)."""
