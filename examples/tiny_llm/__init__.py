"""A real, tiny LLM server for `tokentrace demo`: all latency comes from real work."""
