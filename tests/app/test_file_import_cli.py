"""`tokentrace import` says what it stored, and why a trace's spans were not kept."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from otlp_traces import request_trace, to_json

#: a trace id whose 56 random bits are 0: the baseline (kept from the top of the
#: randomness down) never keeps it, so "0 traces kept whole" holds every run, not 98 %
UNREMARKABLE = "1" * 18 + "0" * 14


def _import(tmp_path: Path, *extra: str, **env: str) -> str:
    path = tmp_path / "one.json"
    path.write_text(json.dumps(to_json(request_trace(UNREMARKABLE))))
    out = subprocess.run(
        [sys.executable, "-m", "tokentrace", "import", str(path), "--db", str(tmp_path / "t.duckdb"), *extra],
        capture_output=True, text=True, timeout=120,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")}, **env},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.slow
def test_import_says_when_sampling_left_a_traces_spans_out(tmp_path: Path) -> None:
    # an unremarkable trace, re-imported as a user would (an explorer's otlp.json export),
    # with no warm-up (which keeps the first requests of a model/route whole)
    out = _import(tmp_path, TOKENTRACE_P99_WARMUP="0")
    assert "from 1 file: 1 request, 0 traces kept whole" in out
    assert "the spans of 1 trace were not kept (tail sampling: unremarkable, baseline 0.02)" in out
    assert "--baseline 1 keeps every trace whole" in out


@pytest.mark.slow
def test_import_with_baseline_one_keeps_it_whole_and_says_nothing_more(tmp_path: Path) -> None:
    out = _import(tmp_path, "--baseline", "1")
    assert "1 request, 1 trace kept whole" in out and "not kept" not in out


@pytest.mark.slow
def test_a_second_import_says_what_was_new(tmp_path: Path) -> None:
    first = _import(tmp_path, "--baseline", "1")
    assert "1 request, 1 trace kept whole" in first
    again = _import(tmp_path, "--baseline", "1")
    # the trace was kept whole the first time: not again, and nothing new was stored
    assert "nothing new was stored (1 request, in the database already" in again, again
    assert "kept whole" not in again
    more = tmp_path / "more.json"
    more.write_text(json.dumps(to_json(request_trace())))
    out = subprocess.run(
        [sys.executable, "-m", "tokentrace", "import", str(tmp_path / "one.json"), str(more),
         "--db", str(tmp_path / "t.duckdb"), "--baseline", "1"],
        capture_output=True, text=True, timeout=120, check=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("TOKENTRACE_")},
    ).stdout  # fmt: skip
    assert "2 files: 1 new request, 1 trace kept whole" in out, out
    assert "1 more was in the database already" in out


@pytest.mark.slow
def test_requests_cut_short_by_head_stops_quietly(tmp_path: Path) -> None:
    """`tokentrace requests | head -1` printed `[Errno 32] Broken pipe` and failed."""
    path = tmp_path / "many.json"
    path.write_text(json.dumps(to_json([s for _ in range(600) for s in request_trace()])))
    db = tmp_path / "many.duckdb"
    run = [sys.executable, "-m", "tokentrace"]
    subprocess.run([*run, "import", str(path), "--db", str(db)], check=True, capture_output=True, timeout=300)
    proc = subprocess.Popen(
        [*run, "requests", "--db", str(db), "--format", "jsonl"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    assert json.loads(proc.stdout.readline())["request_id"]  # `head -1`: one line, then gone
    proc.stdout.close()
    assert proc.wait(timeout=120) == 141  # 128 + SIGPIPE, as `cat` in the same place
    with proc.stderr:
        assert proc.stderr.read() == b""
