"""Services memrl runs or talks to: retrieval (BM25 over a corpus) and an LLM judge."""
