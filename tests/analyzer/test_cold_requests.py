"""`cold_requests`: an instance's first request in the window is cold (where the window shows
at least two instances), exactly one per instance even where several arrive at its first
instant, and the SDK's mark makes any request cold."""

from __future__ import annotations

from pathlib import Path

from tokentrace.analyzer.diagnosis._base import Context
from tokentrace.analyzer.diagnosis.cold_start import AFTER_START_NS, MIN_INSTANCES
from tokentrace.analyzer.filters import Filters
from tokentrace.store.connection import open_db

T0 = 1_750_000_000 * 10**9

#: instance `a`: three requests at its first instant, then 20 more; instance `b`: 20, the
#: 8th marked cold by the SDK; one request with no instance (never a first one)
ROWS = """
INSERT INTO requests (trace_id, request_id, start_ns, e2e_ms, queue_ms, prefill_ms, decode_ms,
    network_ms, server_ms, queue_wait_ms, tokenize_ms, other_ms, ttft_ms, ttft_client_ms, tpot_ms,
    model, tenant, traffic_class, service, instance, environment, route, cold_start, error,
    source, flags, kept, sample_reason, sample_weight)
SELECT printf('%032x', i), 'r' || i, start_ns, 100.0 + i, 1, 1, 1, NULL, 100.0, 0, 0, 0,
    50.0 + i, NULL, 20.0, 'm', 't', 'interactive', 's', instance, '', '/', i = 108, false,
    'test', []::VARCHAR[], false, 'dropped', 1.0
FROM (
    SELECT i, CASE WHEN i < 3 THEN 0 ELSE i END * 1000000 + ? AS start_ns, 'a' AS instance
    FROM range(23) t(i)
    UNION ALL
    SELECT 100 + i, (i + 1) * 1000000 + ?, 'b' FROM range(20) t(i)
    UNION ALL
    SELECT 200, 1, ''
)
"""


def test_one_first_request_per_instance_is_cold(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "cold.duckdb")
    try:
        conn.execute(ROWS, [T0, T0])
        rows = Context(conn, Filters()).query("diag_cold_start", [AFTER_START_NS, MIN_INSTANCES])
        cold = {r["cold"]: r for r in rows}
        # a's first instant holds three requests: one of them is its first; b's first, and
        # b's SDK-marked request; the instance-less request at t=1 is no instance's first
        assert cold[True]["n"] == 3
        assert cold[True]["marked"] == 1
        assert cold[False]["n"] == 23 + 20 + 1 - 3
        assert cold[True]["instances"] == 2
    finally:
        conn.close()
