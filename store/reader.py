"""Read access to a store: one cursor per reader, over a shared connection.

DuckDB allows one writing process per file, so inside `tokentrace serve` the
collector's write connection is the only one and readers (the web pages) take
cursors of it; standalone (`create_web_app(settings)`, tests, benchmarks) the
file is opened read-only once, on the first read, and shared the same way.

A query node (`serve --lake … --no-receivers`, `report --lake`) reads the shared lake
instead: an in-memory DuckDB with the lake attached read-only (`open_lake_reader`).  Each
cursor is a connection of its own, so each says `USE lake` again; each statement reads the
lake's newest snapshot, so what the shards move in after start shows up on the next page.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb

from tokentrace.store.connection import open_read_only
from tokentrace.store.errors import StoreError

#: The query that says the lake's catalog answers (`/readyz` of a query node): it reads the
#: newest snapshot from the catalog, as every page's first statement does.
_CATALOG_PROBE = "SELECT max(version) FROM schema_version"


@dataclass(frozen=True, slots=True)
class LakeAddress:
    """A lake to read: `uri` as `--lake` takes it, `data_path` as `--lake-data` (None: the
    path the catalog recorded when the lake was made)."""

    uri: str
    data_path: str | None = None

    def describe(self) -> str:
        """The lake for a message, any password masked."""
        from tokentrace.store.lake.catalog import describe

        return f"the lake {describe(self.uri)}"


class NoLakeYet(StoreError):
    """The catalog answers but holds no lake, or no tokentrace tables, yet: no shard has
    started against it (a query node started first waits for one)."""


def open_lake_reader(lake: LakeAddress) -> duckdb.DuckDBPyConnection:
    """Gives a read-only connection to `lake` with its tables in use; raises StoreError, one
    line, when the catalog cannot be reached, holds no lake yet, or a newer tokentrace wrote it."""
    from tokentrace.store.lake.catalog import open_lake
    from tokentrace.store.schema import check_version

    try:
        conn = open_lake(lake.uri, lake.data_path, read_only=True)
    except StoreError as exc:
        # DuckLake's words for a catalog database nobody made a lake in: read-only may not make it
        if "creating a new DuckLake is explicitly disabled" in str(exc):
            raise NoLakeYet(f"{lake.describe()} holds no lake yet: {_MADE_BY_A_SHARD}") from exc
        raise
    try:
        if check_version(conn, lake.describe()) == 0:
            raise NoLakeYet(f"{lake.describe()} has no tokentrace tables yet: {_MADE_BY_A_SHARD}")
    except duckdb.Error as exc:
        conn.close()
        raise StoreError(f"cannot read {lake.describe()}: {first_line(exc)}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


#: What makes a lake's tables: the first shard's start.
_MADE_BY_A_SHARD = "the first `tokentrace serve --lake …` (a shard) makes its tables when it starts"


def first_line(exc: BaseException) -> str:
    """DuckDB's reason, one line, with any password it repeats masked."""
    from tokentrace.store.lake.catalog import describe

    text = str(exc).strip()
    return describe(text.splitlines()[0]) if text else type(exc).__name__


class StoreReader:
    """Hands out cursors over `conn` when given, else over the file (or `lake`) opened read-only."""

    def __init__(
        self,
        db_path: Path | None = None,
        conn: duckdb.DuckDBPyConnection | None = None,
        *,
        lake: LakeAddress | None = None,
    ) -> None:
        if (db_path is None) == (lake is None):
            raise ValueError("a store reader reads one store: a database file or a lake")
        self.db_path = db_path
        self.lake = lake
        self._shared = conn
        self._own: duckdb.DuckDBPyConnection | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        """The store for a message: the file's path, or the lake with any password masked."""
        return self.lake.describe() if self.lake is not None else str(self.db_path)

    def _base(self) -> duckdb.DuckDBPyConnection:
        if self._shared is not None:
            return self._shared
        with self._lock:
            if self._own is None:
                # lazily, so a reader can exist before the first import wrote the file
                if self.lake is not None:
                    self._own = open_lake_reader(self.lake)
                else:
                    assert self.db_path is not None
                    self._own = open_read_only(self.db_path)
            return self._own

    @contextmanager
    def cursor(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """Gives a cursor for one reader's queries, closed afterwards."""
        cur = self._base().cursor()
        try:
            if self.lake is not None:
                self._use_lake(cur)
            yield cur
        finally:
            cur.close()

    def _use_lake(self, cur: duckdb.DuckDBPyConnection) -> None:
        """Points a new cursor's unqualified names at the lake (`USE` is per connection); it
        reads the catalog's newest snapshot, so an unreachable catalog fails here, in words."""
        from tokentrace.store.lake.catalog import ALIAS

        try:
            cur.execute(f"USE {ALIAS}")
        except duckdb.Error as exc:
            raise StoreError(f"cannot read {self.describe()}: {first_line(exc)}") from exc

    def readiness(self) -> str | None:
        """Gives why the store cannot be read now (a query node's `/readyz`), None when it can."""
        try:
            with self.cursor() as cur:
                cur.execute(_CATALOG_PROBE).fetchall()
        except StoreError as exc:
            return str(exc)
        except duckdb.Error as exc:
            reason = first_line(exc) if self.lake is not None else str(exc).strip().splitlines()[0]
            return f"cannot read {self.describe()}: {reason}"
        return None

    def close(self) -> None:
        """Closes the read-only connection this reader opened; a shared one stays its owner's."""
        with self._lock:
            if self._own is not None:
                self._own.close()
                self._own = None
