"""A database this process cannot write is refused when it is opened for writing, before
`serve` or `import` accept anything.

(Operator review: `serve` on a database whose directory it could not write started
"ready" when the file needed no migration, answered 200 to the first exports, then
could not create `<db>.wal` and dropped them, said only at shutdown.)  Real files;
`unwritable` makes a directory or file immutable (as root) or read-only."""

from __future__ import annotations

from pathlib import Path

import pytest
from tt_testkit import unwritable

from tokentrace.store.connection import StoreError, open_db, open_read_only

WRITE = "INSERT INTO kept_traces (trace_id, reason, weight, decided_ns, span_count) VALUES ('t', 'baseline', 50.0, 1, 0)"


def _up_to_date(db: Path) -> Path:
    """Gives `db` made and migrated: opening it again writes nothing until a row comes."""
    db.parent.mkdir(exist_ok=True)
    open_db(db).close()
    return db


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_directory_that_takes_no_new_file_is_refused_at_open(tmp_path: Path) -> None:
    db = _up_to_date(tmp_path / "ro" / "t.duckdb")
    with unwritable(db.parent):
        with pytest.raises(StoreError) as caught:
            open_db(db)
        # reading needs no new file: reports still open it
        open_read_only(db).close()
    message = str(caught.value)
    assert message.startswith(
        f"cannot write beside {db} (DuckDB needs {db}.wal there): {db.parent}: "
    )
    assert "\n" not in message
    assert _names(db.parent) == ["t.duckdb"]  # no probe file left behind, no log


def test_a_file_it_cannot_write_is_refused_at_open(tmp_path: Path) -> None:
    db = _up_to_date(tmp_path / "t.duckdb")
    with unwritable(db), pytest.raises(StoreError) as caught:
        open_db(db)
    assert str(caught.value).startswith(f"cannot write {db}: ")


def test_a_new_database_where_no_file_can_be_made_is_refused_and_not_made(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    db = folder / "new.duckdb"
    with unwritable(folder), pytest.raises(StoreError, match=r"^cannot write beside .*new\.duckdb"):
        open_db(db)
    assert _names(folder) == []


def test_a_directory_that_is_not_there_is_named(tmp_path: Path) -> None:
    db = tmp_path / "missing" / "t.duckdb"
    with pytest.raises(StoreError, match=f"^cannot create {db}: no directory {db.parent}$"):
        open_db(db)


def test_a_writable_database_still_opens_and_takes_rows(tmp_path: Path) -> None:
    db = _up_to_date(tmp_path / "t.duckdb")
    conn = open_db(db)
    try:
        conn.execute(WRITE)
    finally:
        conn.close()
    assert _names(tmp_path) == ["t.duckdb"]  # the probe is gone; the log checkpointed away
