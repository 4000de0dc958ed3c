"""The report over recordings of real vLLM and real instrumented clients: what it finds,
and what it must not assert (issue 22).  The client's own measurements say what happened
in each run; the xfails are what today's diagnosis misses.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from recordings import VLLM_CLIENT_RUNS, import_into, load, report

HEALTHY = ("chat_openllmetry", "chat_openinference", "chat_openai_v2")


def _report(tmp_path: Path, *names: str) -> dict[str, Any]:
    db = tmp_path / "engines.duckdb"
    import_into(db, *names)
    return report(db)


def _complaints(rep: dict[str, Any]) -> list[str]:
    return [f["complaint"] for f in rep["findings"]]


def test_healthy_streams_have_no_finding(tmp_path: Path) -> None:
    rep = _report(tmp_path, *HEALTHY)
    assert rep["requests"]["count"] == 36  # past the diagnosis' minimum of 30: it ran
    assert _complaints(rep) == []


def test_the_runs_are_what_their_names_say() -> None:
    """The recordings' own ground truth, which the xfails below rest on."""
    streams = [m for m in load("stutter").client if m["key"].startswith("stream")]
    longest = [max(b - a for a, b in itertools.pairwise(m["chunk_ms"])) for m in streams]
    # most streams froze for a long prefill at least once: typical gaps are a few ms
    assert sum(gap > 100 for gap in longest) > len(streams) / 2
    tenants = load("tenants").client
    small = [m["ttft_ms"] for m in tenants if m["tenant"] != "bigcorp"]
    alone, beside = small[:8], small[8:]
    assert len(beside) >= 10 and len([m for m in tenants if m["tenant"] == "bigcorp"]) >= 10
    assert statistics.median(beside) > 4 * statistics.median(alone)


def test_stutter_is_found(tmp_path: Path) -> None:
    assert _complaints(_report(tmp_path, "stutter"))[:1] == ["stutter"]


def test_big_tenants_slower_is_found(tmp_path: Path) -> None:
    assert _complaints(_report(tmp_path, "tenants"))[:1] == ["big_tenants_slower"]


def test_no_environment_no_bad_in_production(tmp_path: Path) -> None:
    rep = _report(tmp_path, *VLLM_CLIENT_RUNS)
    assert rep["requests"]["count"] >= 100
    assert "bad_in_production" not in _complaints(rep)


def test_errors_count_what_only_the_client_saw(tmp_path: Path) -> None:
    rec = load("client_errors")
    served = {s.trace_id for s in rec.llm_requests()}
    failed = [m for m in rec.client if m["status"] != "ok" and m["trace_id"] not in served]
    assert len(failed) >= 3  # the 400, the 404 and at least one abort vLLM saw
    assert _report(tmp_path, "client_errors")["requests"]["errors"] == len(failed)


def test_startup_trace_is_kept(tmp_path: Path) -> None:
    from tokentrace.store.connection import open_read_only

    db = tmp_path / "startup.duckdb"
    import_into(db, "vllm_startup")
    names = {s.name for s in load("vllm_startup").spans}
    assert {"Overall Loading", "Load weights", "Allocate KV cache"} <= names
    conn = open_read_only(db)
    try:
        stored = {n for (n,) in conn.execute("SELECT DISTINCT name FROM spans").fetchall()}
    finally:
        conn.close()
    assert stored == names
