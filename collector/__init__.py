"""tokentrace's collector: OTLP receivers, tail-based sampling, the DuckDB writer."""
