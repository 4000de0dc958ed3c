"""A new database file, and the write-ahead log DuckDB keeps beside it, are
readable by their owner only (they hold traces, prompts if recorded; the web
UI's --api-token protects nothing against a local user who can read the file);
an existing file's mode is left as it is.  (Security review: the file was
created -rw-r--r-- under umask 022.)"""

from __future__ import annotations

import logging
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tokentrace.store.connection import keep_store_private, open_db

WRITE = "INSERT INTO kept_traces (trace_id, reason, weight, decided_ns, span_count) VALUES ('t', 'baseline', 50.0, 1, 0)"


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """The common umask 022 (new files -rw-r--r--), restored after the test."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _wal(db: Path) -> Path:
    return db.with_name(db.name + ".wal")


def test_a_new_database_and_its_wal_are_private(tmp_path: Path) -> None:
    db = tmp_path / "new.duckdb"
    keep_store_private(db)  # as `serve`, `import` and `demo` do before they open it
    conn = open_db(db)
    try:
        assert _mode(db) == 0o600
        conn.execute(WRITE)
        assert _wal(db).exists()
        assert _mode(_wal(db)) == 0o600
        # DuckDB deletes the log at a checkpoint and makes a new one at the next write
        conn.execute("CHECKPOINT")
        conn.execute(WRITE)
        assert _mode(_wal(db)) == 0o600
    finally:
        conn.close()
    # opened again later (the next `serve`): its new log is private too
    conn = open_db(db)
    try:
        conn.execute(WRITE)
        assert _mode(db) == 0o600
        assert _mode(_wal(db)) == 0o600
    finally:
        conn.close()


def test_an_existing_file_keeps_its_mode(tmp_path: Path) -> None:
    db = tmp_path / "shared.duckdb"
    duckdb.connect(str(db)).close()
    os.chmod(db, 0o640)  # its owner shares it with a group on purpose
    keep_store_private(db)
    conn = open_db(db)
    try:
        conn.execute(WRITE)
        assert _mode(db) == 0o640
        # the log is no more readable than the database (its group's at most, not others')
        assert _mode(_wal(db)) & ~0o640 == 0
        conn.execute("CHECKPOINT")
        conn.execute(WRITE)  # a log DuckDB makes after open_db: the process's umask
        assert _mode(_wal(db)) == 0o640
    finally:
        conn.close()


def test_a_host_program_opening_the_store_keeps_its_umask(tmp_path: Path) -> None:
    # the library makes the file private, not the rest of the host's files
    db = tmp_path / "embedded.duckdb"
    open_db(db).close()
    assert _mode(db) == 0o600
    assert os.umask(0o022) == 0o022


@pytest.mark.slow
def test_serve_makes_its_database_private(tmp_path: Path) -> None:
    from tt_testkit import start_serve

    serve = start_serve(tmp_path)
    serve.stop()
    assert _mode(serve.db) == 0o600


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_database_others_can_read_gets_one_warning_saying_how_to_fix_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file an older tokentrace made stays -rw-r--r--: its mode is left as it is (it
    may be shared on purpose), but never silently (operator review)."""
    db = tmp_path / "old.duckdb"
    open_db(db).close()
    os.chmod(db, 0o644)
    with caplog.at_level(logging.WARNING, logger="tokentrace"):
        open_db(db).close()
    [warning] = _warnings(caplog)
    assert f"{db} is readable by its group and others (mode 0644)" in warning
    assert f"chmod 600 {db}" in warning
    assert _mode(db) == 0o644  # said, not changed

    os.chmod(db, 0o640)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokentrace"):
        open_db(db).close()
    [warning] = _warnings(caplog)
    assert "readable by its group (mode 0640)" in warning

    os.chmod(db, 0o600)  # as the warning says
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tokentrace"):
        open_db(db).close()
    assert _warnings(caplog) == []


@pytest.mark.slow
def test_import_into_a_database_others_can_read_warns_once(tmp_path: Path) -> None:
    db = tmp_path / "old.duckdb"
    open_db(db).close()
    os.chmod(db, 0o604)
    export = tmp_path / "export.json"
    export.write_text('{"resourceSpans": []}')
    done = subprocess.run(
        [sys.executable, "-m", "tokentrace", "import", str(export), "--db", str(db)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("chmod 600") == 1, done.stderr
    assert f"{db} is readable by others (mode 0604)" in done.stderr
