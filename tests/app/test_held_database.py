"""A database another tokentrace process holds: each command says who holds it and what
to do instead, never DuckDB's lock message.

`import` into a file a running `serve` holds is told the server's OTLP/HTTP URL to send
the file to (recorded in the serve's note), a second `serve` that the file is already
served and where; `serve --web-port 0` notes the port it bound, so `report --db` names
it; and while an import writes the file, `report` says to wait for it rather than
suggest a server.  (Operator review: `import` printed DuckDB's raw lock error, and
`report` suggested http://127.0.0.1:8600 for a serve on an OS-chosen port.)  Real
`serve` and `import` processes, on 127.0.0.1."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from otlp_traces import request_trace, to_protobuf
from tt_testkit import ServeProcess, free_port, serve_port_args, wait_started

from tokentrace.store.serve_note import note_path, read_note


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokentrace", *args], capture_output=True, text=True, timeout=120
    )


def _one_line(done: subprocess.CompletedProcess[str], command: str) -> str:
    """Gives the error a command that failed said: one line, no DuckDB wording."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(f"tokentrace {command}: ") and done.stderr.count("\n") == 1, (
        done.stderr
    )
    for raw in ("IO Error", "Could not set lock", "Conflicting lock", "duckdb.org", "Traceback"):
        assert raw not in done.stderr, done.stderr
    return done.stderr


def _export(path: Path, traces: int = 1) -> Path:
    path.write_bytes(
        to_protobuf([s for _ in range(traces) for s in request_trace()]).SerializeToString()
    )
    return path


def test_import_into_a_database_serve_holds_says_where_to_send_the_file(
    tmp_path: Path, serve: ServeProcess
) -> None:
    export = _export(tmp_path / "one.pb")
    said = _one_line(_cli("import", str(export), "--db", str(serve.db)), "import")
    assert f"{serve.db} is held by a running `tokentrace serve` (pid {serve.proc.pid})" in said
    curl = re.search(r"`(curl [^`]*)`", said)
    assert curl is not None, said
    assert curl.group(1) == (
        "curl -H 'Content-Type: application/x-protobuf' --data-binary @FILE "
        f"{serve.otlp_http}/v1/traces"
    )
    # doing as it says: the server takes the file, and stores its request
    answer = httpx.post(
        f"{serve.otlp_http}/v1/traces", content=export.read_bytes(),
        headers={"Content-Type": "application/x-protobuf"}, timeout=30,
    )  # fmt: skip
    assert answer.status_code == 200, answer.text
    serve.stop()
    assert serve.rows("SELECT count(*) FROM requests") == [(1,)]


def test_a_second_serve_of_the_file_names_the_first(tmp_path: Path, serve: ServeProcess) -> None:
    first_note = note_path(serve.db).read_bytes()
    own_ports = serve_port_args()
    its_ports = serve_port_args((serve.http_port, serve.grpc_port, serve.web_port))
    for ports in (own_ports, its_ports):  # on its own ports, or (by default) the same ones
        said = _one_line(_cli("serve", "--db", str(serve.db), *ports), "serve")
        assert said == (
            f"tokentrace serve: {serve.db} is already served by `tokentrace serve` "
            f"(pid {serve.proc.pid}) at {serve.web}: send traces to its OTLP/HTTP endpoint "
            f"{serve.otlp_http}, or give this serve another --db\n"
        )
        assert note_path(serve.db).read_bytes() == first_note  # the first serve's, untouched
    assert serve.proc.poll() is None


@pytest.mark.slow
def test_serve_on_any_web_port_notes_the_port_it_bound(tmp_path: Path) -> None:
    db = tmp_path / "any.duckdb"
    http, grpc = free_port(), free_port()
    cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(db), "--http-port", str(http),
           "--grpc-port", str(grpc), "--web-port", "0"]  # fmt: skip
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    server = ServeProcess(proc, db, http, grpc, 0)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        bound = re.search(r"web UI on http://127\.0\.0\.1:(\d+)", first)
        assert bound is not None and bound.group(1) != "0", first
        server.web_port = int(bound.group(1))
        wait_started(server)  # its note names its pid: the start is done
        note = read_note(db)
        assert note is not None and note["web"] == server.web and note["otlp"] == server.otlp_http
        said = _one_line(_cli("report", "--db", str(db)), "report")
        assert f"`tokentrace report --url {server.web}`" in said, said
    finally:
        server.stop()
    assert not note_path(db).exists()


def _holds_a_lock(pid: int, path: Path) -> bool:
    """Whether process `pid` holds a POSIX lock on `path` (/proc/locks: what DuckDB takes)."""
    inode = f":{path.stat().st_ino}"
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if (
            len(parts) > 5
            and parts[1] != "->"
            and parts[4] == str(pid)
            and parts[5].endswith(inode)
        ):
            return True
    return False


def _state(pid: int) -> str:
    """Gives the state /proc says process `pid` is in: R, S, D, T (stopped), Z (exited)…"""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _pause_while_holding(proc: subprocess.Popen[bytes], db: Path) -> bool:
    """Stops `proc` (SIGSTOP) at a moment it holds `db` open; False when it ended first.
    Between `poll()`s the pid stays `proc`'s (an exited child is not reaped before)."""
    while proc.poll() is None:
        os.kill(proc.pid, signal.SIGSTOP)
        while (state := _state(proc.pid)) not in ("T", "t", "Z"):
            time.sleep(0.001)
        if state == "Z":
            continue  # it ended: poll() reaps it
        if db.exists() and _holds_a_lock(proc.pid, db):
            return True
        os.kill(proc.pid, signal.SIGCONT)
        time.sleep(0.005)
    return False


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="needs /proc (Linux)")
def test_while_an_import_writes_the_file_report_says_to_wait(tmp_path: Path) -> None:
    export = _export(tmp_path / "many.pb", traces=3000)  # an import of a second or more
    db = tmp_path / "imported.duckdb"
    for _ in range(3):  # a fast machine may finish the import before it is caught holding the file
        proc = subprocess.Popen(
            [sys.executable, "-m", "tokentrace", "import", str(export), "--db", str(db)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            if not _pause_while_holding(proc, db):
                continue
            for command in ("report", "requests", "import"):
                args = [command, "--db", str(db)] + ([str(export)] if command == "import" else [])
                said = _one_line(_cli(*args), command)
                assert said == (
                    f"tokentrace {command}: {db} is held by `tokentrace import` (pid {proc.pid}), "
                    "and DuckDB lets one process open it: an import is writing it; retry when it ends\n"
                )
            break
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
            out, _ = proc.communicate(timeout=120)
            assert proc.returncode == 0, out
    else:
        pytest.fail("the import ended each time before it was seen holding the file")
    assert _cli("report", "--db", str(db)).returncode == 0  # once it ended


@pytest.mark.slow
def test_an_empty_file_another_process_holds_is_held_not_empty(tmp_path: Path) -> None:
    """A writer that has just created the file holds its lock before it writes a byte: `report`
    then says the file is held (as it does a moment later), not that it is empty."""
    db = tmp_path / "new.duckdb"
    db.touch()
    # the POSIX lock DuckDB takes, held by another process over the still-empty file
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import fcntl, sys, time; f = open(sys.argv[1], 'r+'); fcntl.lockf(f, fcntl.LOCK_EX);"
         " print('locked', flush=True); time.sleep(60)", str(db)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        said = _one_line(_cli("report", "--db", str(db)), "report")
        assert "is held by another process" in said and "is empty" not in said, said
    finally:
        holder.kill()
        holder.communicate()
    said = _one_line(_cli("report", "--db", str(db)), "report")  # no holder: empty it is
    assert said == f"tokentrace report: {db} is empty: not a tokentrace database\n", said
