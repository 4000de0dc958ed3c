"""`serve` and `import` on a database they cannot write stop at start with one line,
before they accept anything.

(Operator review: on a directory it could not write, `serve` of a database that needed
no migration started "ready", answered 200 to the first exports, then could not create
`<db>.wal` and threw them away, said only at shutdown: "2 batches (80 rows) could not
be written".  The OpenTelemetry Collector's file_storage and Jaeger's Badger refuse to
start instead.)  Real processes; `unwritable` makes the directory immutable as root."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from otlp_traces import request_trace, to_json
from tt_testkit import serve_port_args, unwritable

from tokentrace.store.connection import open_db

pytestmark = pytest.mark.slow


def _up_to_date(tmp_path: Path) -> Path:
    """Gives a database in a folder of its own, made and migrated: serving it needs no migration."""
    db = tmp_path / "ro" / "t.duckdb"
    db.parent.mkdir()
    open_db(db).close()
    return db


def _until_ready_or_exit(cmd: list[str]) -> tuple[int | None, str]:
    """Runs `serve` until it exits or says it is ready; gives its status (None: it was
    ready, and is stopped) and its output."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops serve" in line:  # ready: it takes exports now
                return None, "".join(lines)
        return proc.wait(timeout=60), "".join(lines)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.communicate(timeout=60)


def test_serve_on_a_directory_it_cannot_write_stops_at_start(tmp_path: Path) -> None:
    db = _up_to_date(tmp_path)
    ports = serve_port_args()
    cmd = [
        sys.executable,
        "-m",
        "tokentrace",
        "serve",
        "--db",
        str(db),
        "--decode-processes",
        "0",
        *ports,
    ]
    with unwritable(db.parent):
        status, out = _until_ready_or_exit(cmd)
    assert status == 1, out
    assert out.startswith(
        f"tokentrace serve: cannot write beside {db} (DuckDB needs {db}.wal there): {db.parent}: "
    ), out
    assert out.count("\n") == 1, out  # one line: no traceback, no start-up banner
    assert sorted(p.name for p in db.parent.iterdir()) == ["t.duckdb"]


def test_import_into_a_directory_it_cannot_write_stops_before_reading(tmp_path: Path) -> None:
    db = _up_to_date(tmp_path)
    export = tmp_path / "one.json"
    export.write_text(json.dumps(to_json(request_trace())))
    with unwritable(db.parent):
        done = subprocess.run(
            [sys.executable, "-m", "tokentrace", "import", str(export), "--db", str(db)],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""  # no "imported …"
    assert done.stderr.startswith(
        f"tokentrace import: cannot write beside {db} (DuckDB needs {db}.wal there): {db.parent}: "
    ), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
