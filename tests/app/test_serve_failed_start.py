"""A `serve` that cannot start (a busy port, a server that fails to bind) leaves no
new database file behind, and never touches one that was there before."""

from __future__ import annotations

import hashlib
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tt_testkit import free_port

import tokentrace.serve as serving
from tokentrace.collector.settings import CollectorSettings
from tokentrace.serve import CollectorServer
from tokentrace.store.connection import open_db

FLAGS = ("--http-port", "--grpc-port", "--web-port")


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port some other program listens on."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield int(taken.getsockname()[1])


def _serve(db: Path, busy_flag: str, busy_port: int) -> subprocess.CompletedProcess[str]:
    ports = {flag: str(busy_port if flag == busy_flag else free_port()) for flag in FLAGS}
    cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(db), "--decode-processes", "0",
           *(part for flag, port in ports.items() for part in (flag, port))]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def _store_files(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name))


def _fingerprint(db: Path) -> tuple[str, int]:
    return hashlib.sha256(db.read_bytes()).hexdigest(), db.stat().st_mtime_ns


@pytest.mark.slow
@pytest.mark.parametrize("busy_flag", FLAGS)
def test_a_busy_port_leaves_no_database_file(tmp_path: Path, busy_port: int, busy_flag: str) -> None:
    db = tmp_path / "tokentrace.duckdb"
    done = _serve(db, busy_flag, busy_port)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"127.0.0.1:{busy_port}: Address already in use" in done.stderr
    assert f"(choose another port with {busy_flag})" in done.stderr
    assert _store_files(db) == []  # no tokentrace.duckdb, no .wal


@pytest.mark.slow
def test_a_busy_port_leaves_an_existing_database_untouched(tmp_path: Path, busy_port: int) -> None:
    db = tmp_path / "tokentrace.duckdb"
    conn = open_db(db)
    conn.execute("INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) VALUES ('before', 'i', 0, 1)")
    conn.close()
    before = _fingerprint(db)
    done = _serve(db, "--grpc-port", busy_port)
    assert done.returncode == 1 and f"127.0.0.1:{busy_port}" in done.stderr, done.stderr
    assert _fingerprint(db) == before
    assert _store_files(db) == [db.name]


def _failing_grpc(*args: object, **kwargs: object) -> None:
    # a bind that fails after the port check said free (another program took it in between)
    raise OSError("cannot bind OTLP/gRPC on 127.0.0.1:4317: is the port in use?")


def _settings(db: Path) -> CollectorSettings:
    return CollectorSettings(db=db, http_port=free_port(), grpc_port=free_port(), web_port=free_port(),
                             decode_processes=0)  # fmt: skip


def test_a_start_that_fails_after_opening_removes_the_file_it_created(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "start_grpc_server", _failing_grpc)
    db = tmp_path / "new.duckdb"
    server = CollectorServer(_settings(db))
    assert db.exists()  # opened: the store is created before the servers start
    with pytest.raises(OSError, match="cannot bind OTLP/gRPC"):
        server.start()
    assert _store_files(db) == []


def test_a_start_that_fails_after_opening_keeps_a_file_that_was_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(serving, "start_grpc_server", _failing_grpc)
    db = tmp_path / "old.duckdb"
    conn = open_db(db)
    conn.execute("INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) VALUES ('before', 'i', 0, 1)")
    conn.close()
    with pytest.raises(OSError, match="cannot bind OTLP/gRPC"):
        CollectorServer(_settings(db)).start()
    conn = open_db(db)
    try:
        assert conn.execute("SELECT service FROM gpu_samples").fetchall() == [("before",)]
    finally:
        conn.close()
