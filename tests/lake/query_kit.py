"""Helpers of the query-node tests: a realistic store copied into a lake, and `tokentrace`
processes over it.

The lake is filled table by table from a file the collector's real import path wrote
(tests/tracegen.py: client and server spans, token times, engine steps, GPU samples),
with `INSERT INTO lake.t SELECT * FROM f.t`: what a shard's mover does, without the mover.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
from tracegen import GeneratedRequest, generate
from tt_testkit import free_port

from tokentrace.store.lake.catalog import ALIAS, attach
from tokentrace.store.schema import DATA_TABLES


@dataclass
class FilledLake:
    """A file and a lake holding the same rows."""

    db: Path
    uri: str
    data: str
    requests: list[GeneratedRequest]


def fill_lake(tmp: Path, uri: str, data: str, count: int = 120) -> FilledLake:
    """Writes `count` generated requests to a file, then copies every data table into the lake."""
    db, requests = generate(tmp, count=count)
    copy_into_lake(db, uri, data)
    return FilledLake(db, uri, data, requests)


def copy_into_lake(db: Path, uri: str, data: str, where: str = "true") -> None:
    """Copies the rows of every data table of the file `db` that match `where` into the lake,
    one transaction per table (a writer attach makes the lake's tables where missing)."""
    conn = duckdb.connect()
    try:
        attach(conn, uri, data)
        conn.execute(f"ATTACH '{db}' AS f (READ_ONLY)")
        for table in DATA_TABLES:
            cols = {c for (c,) in conn.execute(
                "SELECT column_name FROM duckdb_columns() WHERE database_name = 'f' AND table_name = ?",
                [table],
            ).fetchall()}  # fmt: skip
            condition = where if "trace_id" in cols else "true"
            conn.execute(f"INSERT INTO {ALIAS}.{table} SELECT * FROM f.{table} WHERE {condition}")  # noqa: S608 - test's own names
    finally:
        conn.close()


def tokentrace(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs `tokentrace ARGS` as a real process; gives its result (text)."""
    return subprocess.run(
        [sys.executable, "-m", "tokentrace", *args],
        capture_output=True, text=True, timeout=180, env=env or clean_env(), cwd=cwd,
    )  # fmt: skip


def clean_env() -> dict[str, str]:
    """This environment without any TOKENTRACE_ store setting a developer's shell may hold."""
    return {
        k: v
        for k, v in os.environ.items()
        if k not in ("TOKENTRACE_DB", "TOKENTRACE_LAKE", "TOKENTRACE_LAKE_DATA")
    }


@dataclass
class QueryNode:
    proc: subprocess.Popen[bytes]
    web_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def stop(self) -> str:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        assert self.proc.stdout is not None
        out = self.proc.stdout.read().decode()
        self.proc.stdout.close()
        return out


def start_query_node(uri: str, data: str | None, cwd: Path, *extra: str) -> QueryNode:
    """Starts `tokentrace serve --lake URI --no-receivers` in `cwd`; returns once `/readyz`
    answers (200 or 503)."""
    port = free_port()
    lake_data = ["--lake-data", data] if data else []
    proc = subprocess.Popen(
        [sys.executable, "-m", "tokentrace", "serve", "--lake", uri, *lake_data, "--no-receivers",
         "--web-port", str(port), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
        env={**clean_env(), "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    node = QueryNode(proc, port)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the query node exited ({proc.returncode}): {node.stop()}")
        try:
            httpx.get(node.url + "/readyz", timeout=10)
            return node
        except httpx.TransportError:
            time.sleep(0.1)
    node.stop()
    raise TimeoutError("the query node did not answer in 90 s")
