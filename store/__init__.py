"""The DuckDB store shared by the collector (writes), analyzer and web (read).

Its modules import DuckDB; `tokentrace.store.location` (where the file is)
does not, so the command line starts, and says what to install, without it.
"""
