"""The shared lake (`--lake`): DuckLake, a catalog in PostgreSQL and Parquet files on shared
storage, that many shards write and any number of query nodes read (docs/scale-out.md).

Nothing here is imported unless `--lake` is given: the embedded DuckDB file stays the default.
"""
