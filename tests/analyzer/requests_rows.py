"""Requests written straight into a store's `requests` table, column by column, for tests
that need exact instants and values (ties at a nanosecond, NULLs where they matter) rather
than a workload's simulated requests.

`insert_requests(conn, given, derived)`: `given` maps a column to its values, one a row;
`derived` maps a column to SQL over the given columns and `i` (the row's number); every
other column the table requires gets a plain value (`PLAIN`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import duckdb

#: A plain value for each column the table requires, SQL over `i` (the row's number).
PLAIN = {
    "trace_id": "printf('%032x', i)",
    "request_id": "'r' || i",
    "e2e_ms": "100.0",
    "queue_ms": "0.0",
    "prefill_ms": "0.0",
    "decode_ms": "0.0",
    "server_ms": "e2e_ms",
    "queue_wait_ms": "0.0",
    "tokenize_ms": "0.0",
    "other_ms": "0.0",
    "model": "'m'",
    "tenant": "'t'",
    "traffic_class": "'interactive'",
    "service": "'svc'",
    "instance": "'i0'",
    "environment": "''",
    "route": "'/v1'",
    "cold_start": "false",
    "error": "false",
    "source": "'test'",
    "flags": "[]::VARCHAR[]",
    "kept": "false",
    "sample_reason": "'dropped'",
    "sample_weight": "1.0",
}


def insert_requests(
    conn: duckdb.DuckDBPyConnection,
    given: Mapping[str, Sequence[Any]],
    derived: Mapping[str, str] | None = None,
) -> None:
    """Writes one request a row of `given` (the columns' values, all of one length)."""
    types = dict(conn.execute("SELECT name, type FROM pragma_table_info('requests')").fetchall())
    unknown = set(given) - set(types)
    assert not unknown, f"requests has no column {sorted(unknown)}"
    derived = dict(derived or {})
    # a plain value may read a given column (server_ms = e2e_ms): computed over the given ones
    plain = {c: sql for c, sql in PLAIN.items() if c not in given and c not in derived}
    lengths = {len(v) for v in given.values()}
    assert len(lengths) == 1, f"given columns differ in length: {lengths}"
    names = list(given)
    unnested = ", ".join(f'unnest(?::{types[c]}[]) AS "{c}"' for c in names)
    outer = ", ".join(
        [f'"{c}"' for c in names]
        + [f'{sql} AS "{c}"' for c, sql in derived.items()]
        + [f'{sql} AS "{c}"' for c, sql in plain.items()]
    )
    conn.execute(
        f"INSERT INTO requests BY NAME SELECT {outer} "  # noqa: S608 - the schema's column names
        f"FROM (SELECT {unnested}, unnest(range(len(?))) AS i)",
        [list(given[c]) for c in names] + [list(given[names[0]])],
    )
