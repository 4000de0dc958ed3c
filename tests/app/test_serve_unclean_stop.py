"""A serve that was killed (`kill -9`, the OOM killer) lost its tail buffer: the next one says so."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from tt_testkit import ServeProcess, start_serve

from tokentrace.store.serve_note import note_path, read_note


def _started(serve: ServeProcess) -> ServeProcess:
    """Waits until `serve` has finished starting (its note names its pid)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        note = read_note(serve.db)
        if note is not None and note["pid"] == serve.proc.pid:
            return serve
        time.sleep(0.05)
    raise TimeoutError("serve did not finish starting")


@pytest.mark.slow
def test_the_serve_after_a_killed_one_says_what_was_lost(tmp_path: Path) -> None:
    killed = _started(start_serve(tmp_path))
    killed.proc.kill()
    killed.proc.wait()
    killed.stop()
    assert note_path(killed.db).exists()  # nobody removed it: that is the sign
    after = _started(start_serve(tmp_path, db=killed.db))
    out = after.stop()
    assert f"(pid {killed.proc.pid}) did not stop cleanly" in out, out
    assert "tail buffer" in out
    # a clean stop removes the note: the next start has nothing to report
    clean = _started(start_serve(tmp_path, db=killed.db))
    assert "did not stop cleanly" not in clean.stop()
