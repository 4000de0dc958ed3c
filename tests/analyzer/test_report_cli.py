"""`tokentrace report` / `requests` at the edge: a database `serve` holds gives the command to
run instead, not DuckDB's lock message; `--since` / `--until` take a time or a duration ago."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pytest

from tokentrace.analyzer.report_cli import open_local, window_bounds
from tokentrace.store.connection import StoreError

NOW_NS = int(datetime(2026, 11, 21, 12, 0, tzinfo=timezone.utc).timestamp()) * 10**9
MIN_NS = 60 * 10**9

#: a process that holds `db` open for writing, as `serve` does; with a note when asked
_HOLDER = """
import sys, time
from tokentrace.store.connection import open_db
from tokentrace.store.serve_note import write_note
conn = open_db(sys.argv[1])
if sys.argv[2] == "note":
    write_note(__import__("pathlib").Path(sys.argv[1]), "http://127.0.0.1:18600", token_required=True)
print("holding", flush=True)
sys.stdin.read()
"""


@contextmanager
def _held(db: Path, note: bool) -> Iterator[int]:
    with subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(db), "note" if note else "-"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    ) as holder:  # fmt: skip
        assert holder.stdin is not None and holder.stdout is not None
        try:
            assert holder.stdout.readline().strip() == "holding"
            yield holder.pid
        finally:
            holder.stdin.close()  # its read ends: it exits
            holder.wait(timeout=30)


def _no_duckdb_text(message: str) -> None:
    for raw in ("IO Error", "Could not set lock", "Conflicting lock", "duckdb.org", "python"):
        assert raw not in message, message


def test_a_database_serve_holds_names_the_url_and_the_pid(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    with _held(db, note=True) as pid, pytest.raises(StoreError) as caught:
        open_local(db, "report")
    message = str(caught.value)
    _no_duckdb_text(message)
    assert message.startswith(f"{db} is held by a running `tokentrace serve` (pid {pid})"), message
    assert "`tokentrace report --url http://127.0.0.1:18600 --token TOKEN`" in message


def test_a_database_held_without_a_note_still_gives_the_pid_and_a_hint(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    with _held(db, note=False) as pid, pytest.raises(StoreError) as caught:
        open_local(db, "requests")
    message = str(caught.value)
    _no_duckdb_text(message)
    assert f"{db} is held by another process (pid {pid})" in message, message
    assert "e.g. `tokentrace requests --url http://127.0.0.1:8600`" in message


def test_the_default_database_held_says_the_same_through_the_cli(tmp_path: Path) -> None:
    # no --db: $TOKENTRACE_DB (or ./tokentrace.duckdb) is the file; its note is read all the same
    db = tmp_path / "env.duckdb"
    with _held(db, note=True) as pid:
        proc = subprocess.run(
            [sys.executable, "-m", "tokentrace", "report"], capture_output=True, text=True,
            env={**os.environ, "TOKENTRACE_DB": str(db)}, timeout=120, check=False,
        )  # fmt: skip
    assert proc.returncode == 1
    _no_duckdb_text(proc.stderr)
    assert proc.stderr.startswith(f"tokentrace report: {db} is held by a running `tokentrace serve` (pid {pid})")
    assert "Error" not in proc.stderr, proc.stderr


def test_a_path_that_says_lock_is_not_taken_for_a_held_database(tmp_path: Path) -> None:
    db = tmp_path / "locked" / "missing.duckdb"
    with pytest.raises(StoreError, match="no tokentrace database at") as caught:
        open_local(db, "report")
    assert "holds" not in str(caught.value) and "held" not in str(caught.value)


@pytest.mark.parametrize(
    ("text", "ago_ns"),
    [("10m", 10 * MIN_NS), ("2h", 120 * MIN_NS), ("1d", 1440 * MIN_NS), ("90s", 90 * 10**9),
     ("1d12h", 2160 * MIN_NS), ("1.5h", 90 * MIN_NS), (" 5M ", 5 * MIN_NS)],
)  # fmt: skip
def test_since_takes_a_duration_ago(text: str, ago_ns: int) -> None:
    assert window_bounds(text, None, now_ns=NOW_NS) == (NOW_NS - ago_ns, None)
    assert window_bounds(None, text, now_ns=NOW_NS) == (None, NOW_NS - ago_ns)


def test_iso_times_still_read_as_before() -> None:
    start, end = window_bounds("2026-11-21T10:00:00Z", "2026-11-21T11:00:00", now_ns=NOW_NS)
    assert start == NOW_NS - 120 * MIN_NS and end == NOW_NS - 60 * MIN_NS  # no zone: UTC
    # a duration and a time together; one "now" for both
    assert window_bounds("2h", "2026-11-21T11:00:00+00:00", now_ns=NOW_NS) == (
        NOW_NS - 120 * MIN_NS, NOW_NS - 60 * MIN_NS,
    )  # fmt: skip
    assert window_bounds(None, None, now_ns=NOW_NS) == (None, None)
    # further back than 1970: everything
    assert window_bounds("9999999d", None, now_ns=NOW_NS) == (0, None)


@pytest.mark.parametrize("text", ["yesterday", "10", "-5m", "10x", "m", "nan", "10m5"])
def test_what_is_neither_says_both_forms(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        window_bounds(text, None, now_ns=NOW_NS)
    message = str(caught.value)
    assert message.startswith(f"--since {text!r}") and "ISO 8601" in message and "10m" in message


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match=r"--until 1h is not after --since 30m"):
        window_bounds("30m", "1h", now_ns=NOW_NS)


def test_report_and_requests_take_since_10m(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json
    import time

    from tokentrace.cli import main
    from tokentrace.store.connection import open_db

    db = tmp_path / "t.duckdb"
    open_db(db).close()
    before = time.time_ns()
    assert main(["report", "--db", str(db), "--since", "10m", "--until", "1m", "--format", "json"]) == 0
    window = json.loads(capsys.readouterr().out)["window"]["filters"]
    assert before - 10 * MIN_NS - 10**9 <= window["start_ns"] <= time.time_ns() - 10 * MIN_NS
    assert window["end_ns"] - window["start_ns"] == 9 * MIN_NS
    assert main(["requests", "--db", str(db), "--since", "2h"]) == 0
    with pytest.raises(SystemExit, match="use ISO 8601 .* or a duration ago"):
        main(["report", "--db", str(db), "--since", "yesterday"])
