"""A start of `serve` that fails leaves the note of a killed serve alone, so the next
good start still says that the killed one lost its tail buffer.

`<db>.serve.json` is the only sign that the previous serve never stopped cleanly
(killed: `kill -9`, the OOM killer).  Real processes throughout; the second test
runs each start under the pid the killed serve had, as a restarted container's
serve does (it is often pid 1 every time): a pid alone cannot tell a note this
start wrote from its predecessor's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tt_testkit import ServeProcess, free_port, start_serve

from tokentrace.store.serve_note import note_path, read_note

pytestmark = pytest.mark.slow

#: Runs `tokentrace serve ARGS` as `python -c LAUNCH NOTE LATE ARGS...`, under the pid
#: that the killed serve's note names: the note is first made to read as the same
#: serve would have left it under this pid.  LATE non-empty: the web port is taken
#: between the start's port check and its bind (another program starting at the
#: same moment), so the start fails late, after the store and the servers are up.
LAUNCH = r"""
import json, os, socket, sys
from pathlib import Path

import tokentrace.serve as serving
from tokentrace.cli import main

note, late, args = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
if note.exists():
    note.write_text(json.dumps({**json.loads(note.read_text()), "pid": os.getpid()}))
if late:
    checked = serving.check_ports
    taken = []

    def check_then_lose_the_port(settings):
        checked(settings)
        sock = socket.socket()
        sock.bind((settings.host, settings.web_port))
        sock.listen()
        taken.append(sock)

    serving.check_ports = check_then_lose_the_port
sys.exit(main(["serve", *args]))
"""


def _killed_serve(tmp_path: Path) -> ServeProcess:
    """Gives a serve that was killed once it had started: its note outlives it."""
    serve = start_serve(tmp_path)
    deadline = time.monotonic() + 30
    while (note := read_note(serve.db)) is None or note["pid"] != serve.proc.pid:
        assert time.monotonic() < deadline, "serve did not finish starting"
        time.sleep(0.05)
    serve.proc.kill()
    serve.proc.wait()
    serve.stop()
    assert note_path(serve.db).exists()
    return serve


def _ports() -> dict[str, int]:
    return {"--http-port": free_port(), "--grpc-port": free_port(), "--web-port": free_port()}


def _args(db: Path, ports: dict[str, int]) -> list[str]:
    return ["--db", str(db), *(x for flag, port in ports.items() for x in (flag, str(port)))]


def _run_to_end(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def _good_start(cmd: list[str], db: Path, ports: dict[str, int]) -> tuple[str, int]:
    """Runs a serve that starts, waits until its own note is written, stops it; gives
    its output and its pid."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    serve = ServeProcess(proc, db, ports["--http-port"], ports["--grpc-port"], ports["--web-port"])
    try:
        deadline = time.monotonic() + 60
        while True:  # its note names its web URL (the killed one's named another port)
            assert proc.poll() is None, serve.stop()
            assert time.monotonic() < deadline, "serve did not finish starting"
            try:
                if json.loads(note_path(db).read_text())["web"] == serve.web:
                    break
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
    finally:
        out = serve.stop()
    assert proc.returncode == 0, out
    assert not note_path(db).exists(), out  # a clean stop removes its own note
    return out, proc.pid


def test_a_start_on_a_busy_port_leaves_the_killed_serves_note(tmp_path: Path) -> None:
    killed = _killed_serve(tmp_path)
    left = note_path(killed.db).read_bytes()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        for flag in ("--http-port", "--grpc-port", "--web-port"):
            ports = {**_ports(), flag: busy.getsockname()[1]}
            failed = _run_to_end(
                [sys.executable, "-m", "tokentrace", "serve", *_args(killed.db, ports)]
            )
            assert failed.returncode != 0 and "Address already in use" in failed.stderr, (
                failed.stderr
            )
            assert note_path(killed.db).read_bytes() == left, flag
    ports = _ports()
    out, _ = _good_start(
        [sys.executable, "-m", "tokentrace", "serve", *_args(killed.db, ports)], killed.db, ports
    )
    assert f"(pid {killed.proc.pid}) did not stop cleanly" in out, out


def test_under_the_killed_serves_pid_a_failed_start_leaves_its_note(tmp_path: Path) -> None:
    killed = _killed_serve(tmp_path)
    note = note_path(killed.db)

    ports = _ports()
    failed = _run_to_end(
        [sys.executable, "-c", LAUNCH, str(note), "late", *_args(killed.db, ports)]
    )
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert "address already in use" in failed.stderr.lower(), failed.stderr
    # the start got as far as its servers (the store held, the web app made) and
    # stopped them again: what it removes is its own, and it wrote no note
    assert note.exists(), failed.stderr
    assert json.loads(note.read_text())["web"] == killed.web

    ports = _ports()
    launched = [sys.executable, "-c", LAUNCH, str(note), "", *_args(killed.db, ports)]
    out, pid = _good_start(launched, killed.db, ports)
    assert f"(pid {pid}) did not stop cleanly" in out, out
    assert "tail buffer" in out
