"""The DuckDB store shared by the collector (writes), analyzer and web (read)."""

from tokentrace.store.connection import (
    DB_ENV,
    DEFAULT_DB,
    open_db,
    open_read_only,
    resolve_db_path,
)
from tokentrace.store.schema import SCHEMA_VERSION, migrate

__all__ = [
    "DB_ENV",
    "DEFAULT_DB",
    "SCHEMA_VERSION",
    "migrate",
    "open_db",
    "open_read_only",
    "resolve_db_path",
]
