"""Helpers of the lake's tests: OTLP over HTTP to a real `serve`, and comparing the lake's
rows with a local file's, table by table."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
from otlp_traces import request_trace, to_protobuf

from tokentrace.store.lake.catalog import ALIAS, attach
from tokentrace.store.schema import DATA_TABLES


def post_traces(otlp_http: str, count: int, start_ns: int | None = None) -> list[int]:
    """Posts `count` one-request traces, one export each (protobuf); gives the HTTP statuses."""
    start = start_ns or time.time_ns()
    statuses = []
    for i in range(count):
        body = to_protobuf(request_trace(start_ns=start + i * 1000)).SerializeToString()
        request = urllib.request.Request(
            otlp_http + "/v1/traces", data=body, headers={"Content-Type": "application/x-protobuf"}
        )
        try:
            with urllib.request.urlopen(request, timeout=15) as response:
                statuses.append(response.status)
        except urllib.error.HTTPError as exc:
            statuses.append(exc.code)
    return statuses


def get(url: str) -> tuple[int, str, dict[str, str]]:
    """Gives (status, body, headers) of a GET."""
    try:
        with urllib.request.urlopen(url, timeout=15) as response:
            return response.status, response.read().decode(), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(), dict(exc.headers)


def readyz(otlp_http: str) -> tuple[int, dict[str, Any]]:
    status, body, _ = get(otlp_http + "/readyz")
    return status, json.loads(body)


def metric(otlp_http: str, name: str) -> float | None:
    """Gives the value of the unlabelled series `name` on /metrics, None if absent."""
    _, body, _ = get(otlp_http + "/metrics")
    for line in body.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_until(
    check: Callable[[], bool], timeout: float = 60.0, what: str = "the condition"
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


def lake_connection(uri: str, data: str, *locals_: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory connection with the lake (read-only) and each file read-only as local0, ..."""
    conn = duckdb.connect()
    attach(conn, uri, data, read_only=True)
    for i, path in enumerate(locals_):
        conn.execute(f"ATTACH '{path}' AS local{i} (READ_ONLY)")
    return conn


def count(conn: duckdb.DuckDBPyConnection, sql: str) -> int:
    [(n,)] = conn.execute(sql).fetchall()
    return int(n)


def differences(
    conn: duckdb.DuckDBPyConnection, shards: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """Gives, per data table, (rows only in the lake, rows only in the shards' files) with
    every row counted as often as it occurs; `shards`: shard name -> index of its local file."""
    out = {}
    for table in DATA_TABLES:
        local = " UNION ALL ".join(f"SELECT * FROM local{i}.{table}" for i in shards.values())  # noqa: S608
        lake = f"SELECT * FROM {ALIAS}.{table}"  # noqa: S608
        only_lake = count(conn, f"SELECT count(*) FROM ({lake} EXCEPT ALL ({local}))")  # noqa: S608
        only_local = count(conn, f"SELECT count(*) FROM (({local}) EXCEPT ALL {lake})")  # noqa: S608
        out[table] = (only_lake, only_local)
    return out
