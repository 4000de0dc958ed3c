"""A write-ahead log DuckDB cannot replay says what to do: move `<db>.wal` aside, and the
database opens as of its last checkpoint.

(Operator review: "Failure while replaying WAL file … Corrupt WAL file …" locked the
operator out of `serve`, `import` and `report` alike, with no advice.)"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tokentrace.cli import main
from tokentrace.store.connection import StoreError, open_db, open_read_only

ROW = "INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) VALUES (?, 'i', 0, 1)"


def _db_with_a_corrupt_log(db: Path) -> Path:
    """Gives a database with one row checkpointed and more only in its log, 5,000 bytes
    of whose middle are overwritten (a bad disk, a torn copy: what the review did by
    hand; a few bytes are not always in a checksummed entry)."""
    conn = open_db(db)
    conn.execute(ROW, ["checkpointed"])
    conn.execute("CHECKPOINT")
    conn.execute(
        "INSERT INTO gpu_samples (service, instance, gpu_index, ts_ns) "
        "SELECT 'only in the log', 'i', 0, range FROM range(20000)"
    )
    conn.execute(ROW, ["after it"])
    conn.execute("PRAGMA disable_checkpoint_on_shutdown")  # as a process killed here leaves it
    conn.close()
    wal = db.with_name(db.name + ".wal")
    size = wal.stat().st_size
    with wal.open("r+b") as f:
        f.seek(size // 2)
        f.write(b"\xff" * 5000)
    return db


def _said(db: Path, opener: object) -> str:
    with pytest.raises(StoreError) as caught:
        opener(db)  # type: ignore[operator]
    return str(caught.value)


@pytest.mark.parametrize("opener", [open_db, open_read_only], ids=["read-write", "read-only"])
def test_a_corrupt_log_says_to_move_it_aside(tmp_path: Path, opener: object) -> None:
    db = _db_with_a_corrupt_log(tmp_path / "t.duckdb")
    message = _said(db, opener)
    assert message.startswith(
        f"cannot open {db}: its write-ahead log {db}.wal cannot be replayed ("
    ), message
    assert "Corrupt WAL file" in message  # DuckDB's detail, without its "Failure while…" wrapping
    assert (
        "to open the database as of its last checkpoint; what only the log held is lost" in message
    )
    assert "\n" not in message


def test_doing_as_it_says_opens_the_last_checkpoint(tmp_path: Path) -> None:
    db = _db_with_a_corrupt_log(tmp_path / "t.duckdb")
    move = re.search(r"\(mv ([^)]*)\)", _said(db, open_db))
    assert move is not None
    subprocess.run(["mv", *shlex.split(move.group(1))], check=True)
    conn = open_read_only(db)
    try:
        assert conn.execute("SELECT service FROM gpu_samples").fetchall() == [("checkpointed",)]
    finally:
        conn.close()
    open_db(db).close()  # and writable again


def test_the_commands_say_it_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = _db_with_a_corrupt_log(tmp_path / "t.duckdb")
    export = tmp_path / "export.json"
    export.write_text("{}")
    for args in (["report"], ["requests"], ["import", str(export)]):
        assert main([*args, "--db", str(db)]) == 1
        err = capsys.readouterr().err
        assert err.startswith(f"tokentrace {args[0]}: cannot open {db}: its write-ahead log"), err
        assert err.count("\n") == 1 and "move it aside" in err, err
