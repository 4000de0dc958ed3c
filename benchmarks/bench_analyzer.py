"""Benchmark: a full `build_report` over 1,000,000 request summaries (or 10 M: `--requests`),
against a naive baseline, in one local DuckDB file and (`--lake`) in a DuckLake lake.

Builds a DuckDB file with bulk SQL (generate_series): 1M requests over an hour
with a busy stretch, their ITL histograms and the writer's per-minute rollup of
them, the kept spans of ~2 % of traces at the default sampling, engine steps
and GPU samples.  Then times
`build_report` (the whole diagnosis) and a naive baseline that fetches the
rows into Python and computes the core of the same report (latency and bucket
percentiles, shares, pooled ITL percentiles, busiest-slice and per-tenant
comparisons) in plain Python, and prints both and their ratio.

With `--lake` it also starts a PostgreSQL server of its own (tests/tt_postgres.py: Debian's
`postgresql`), copies the same rows into a new lake (catalog in that server, Parquet files
on local disk beside the database file) and times the same report over the lake, printed as
a ratio to the local file's, in the same run.  10 M requests take a few GB of disk (the file
and the Parquet files): both are deleted at the end unless `--db` names the file.

    python benchmarks/bench_analyzer.py [--requests N] [--db PATH] [--lake] [--runs N]
"""

from __future__ import annotations

import argparse
import bisect
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import duckdb

from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import open_db
from tokentrace.store.schema import DATA_TABLES, ITL_BUCKET_BOUNDS_MS
from tokentrace.store.snapshot import one_snapshot

TESTS = Path(__file__).resolve().parent.parent / "tests"

T0_NS = 1_750_000_000 * 10**9
HOUR_NS = 3600 * 10**9
N_BUCKETS = len(ITL_BUCKET_BOUNDS_MS) + 1

REQUESTS_SQL = """
INSERT INTO requests
WITH base AS (
    SELECT i,
        -- arrivals: uniform over an hour, with minutes 20-26 five times as busy
        CASE WHEN i % 3 = 0 THEN {t0} + 1200000000000 + hash(i, 1) % 360000000000
             ELSE {t0} + hash(i, 2) % {hour} END AS start_ns,
        10 + (hash(i, 3) % 2000) / 100.0 AS network_ms,
        10 + (hash(i, 4) % 4000)::INTEGER AS prompt_tokens,
        4 + (hash(i, 5) % 400)::INTEGER AS output_tokens,
        18 + (hash(i, 6) % 400) / 100.0 AS tpot,
        -ln(greatest((hash(i, 7) % 100000) / 100000.0, 1e-6)) * 40 AS q,
        ['acme', 'globex', 'initech', 'umbrella', 'megacorp'][1 + (hash(i, 8) % 5)::INTEGER] AS tenant,
        CASE WHEN hash(i, 9) % 10 = 0 THEN 'batch' ELSE 'interactive' END AS traffic_class,
        hash(i, 10) % 100 < 2 AS kept
    FROM range({n}) t(i)
),
r AS (
    SELECT *,
        q * CASE WHEN start_ns BETWEEN {t0} + 1200000000000 AND {t0} + 1560000000000 THEN 150 ELSE 1 END AS queue,
        15 + prompt_tokens * 0.08 AS prefill,
        (output_tokens - 1) * tpot AS decode
    FROM base
)
SELECT
    lpad(printf('%x', i), 32, '0'), 'req-' || i, start_ns::BIGINT,
    network_ms + queue + 1 + prefill + decode, queue + 1, prefill, decode, network_ms,
    queue + 1 + prefill + decode, queue, 1.0, 0.0,
    queue + 1 + prefill, queue + 1 + prefill + network_ms, tpot,
    tpot * 0.98, tpot * 1.1, tpot * 1.3, tpot * 1.5, 0,
    prompt_tokens, output_tokens, 'llama-3-8b', tenant, traffic_class, 'vllm', 'pod-' || (i % 4),
    '', '/v1/chat/completions', false, false, NULL, NULL, 'vllm', []::VARCHAR[],
    kept, CASE WHEN kept THEN 'baseline' ELSE 'dropped' END, 1.0,
    'server', NULL,  -- token_times_source, instance_id (schema 4)
    1  -- commit_seq (schema 5)
FROM r
"""

ITL_SQL = """
INSERT INTO itl_hist
SELECT trace_id, request_id, start_ns,
       list_transform(range({nb}), lambda b: CASE WHEN b = 45 THEN output_tokens - 3
                                            WHEN b IN (44, 46) THEN 1 ELSE 0 END)::INTEGER[],
       1
FROM requests
"""

# The writer's per-minute rollup of the same histograms (collector/itl_rollup.py), as ~1
# commit a second writes it: one row per second of starts and slice.
ROLLUP_SQL = """
INSERT INTO itl_rollup
SELECT any_value(r.start_ns - r.start_ns % 60000000000), r.service, r.model, r.tenant, r.traffic_class,
       count(*), [{sums}]::BIGINT[], 1
FROM requests r JOIN itl_hist h USING (trace_id, request_id)
GROUP BY r.start_ns // 1000000000, r.service, r.model, r.tenant, r.traffic_class
"""

SPANS_SQL = """
INSERT INTO spans
SELECT r.trace_id, lpad(printf('%x', r.start_ns % 100000 * 10 + k), 16, '0'),
       CASE WHEN k = 0 THEN '' ELSE lpad(printf('%x', r.start_ns % 100000 * 10), 16, '0') END,
       ['llm_request', 'tokentrace.queue', 'tokentrace.prefill', 'tokentrace.decode'][k + 1],
       CASE WHEN k = 0 THEN 2 ELSE 1 END, r.start_ns, r.start_ns + CAST(r.e2e_ms * 1e6 AS BIGINT),
       0, '', 'vllm', 'bench', '{{"gen_ai.request.model": "llama-3-8b"}}', '[]', '[]',
       '{{"service.name": "vllm"}}', 1
FROM requests r, range(4) t(k)
WHERE r.kept
"""

STEPS_SQL = """
INSERT INTO engine_steps
SELECT 'vllm', 'pod-0', {t0} + i * 20000000, 18000, CASE WHEN i % 50 = 0 THEN 3000 ELSE 0 END,
       32, 32, (i % 7)::INTEGER, 0.5 + (i % 40) / 100.0, NULL, []::VARCHAR[], NULL, 1
FROM range(180000) t(i)
"""

GPU_SQL = """
INSERT INTO gpu_samples
SELECT 'vllm', 'pod-0', 0, {t0} + i * 1000000000, 60 + i % 35, 60000000000, 80000000000, 1980, 650, 1
FROM range(3600) t(i)
"""


def build_db(path: Path, n: int) -> None:
    conn = open_db(path)
    # the collector's memory limit is for a long-running process beside others; a bulk build
    # of 10 M rows (the rollup's join and 120 sums) needs more
    conn.execute("SET memory_limit = '8GB'")
    try:
        sums = ", ".join(f"sum(h.counts[{i}])" for i in range(1, N_BUCKETS + 1))
        fmt = {"t0": T0_NS, "hour": HOUR_NS, "n": n, "nb": N_BUCKETS, "sums": sums}
        for sql in (REQUESTS_SQL, ITL_SQL, ROLLUP_SQL, SPANS_SQL, STEPS_SQL, GPU_SQL):
            conn.execute(sql.format(**fmt))
        conn.execute(
            "INSERT INTO kept_traces SELECT trace_id, 'baseline', 50.0, start_ns, 4, 1 FROM requests WHERE kept"
        )
        conn.execute("CHECKPOINT")
    finally:
        conn.close()


def _pcts(values: list[float]) -> list[float]:
    values.sort()
    return [values[min(len(values) - 1, int(q * len(values)))] for q in (0.5, 0.9, 0.95, 0.99)]


def naive_report(conn: duckdb.DuckDBPyConnection) -> dict[str, object]:
    """The core of the report in plain Python over fetched rows: the baseline."""
    rows = conn.execute(
        "SELECT start_ns, e2e_ms, ttft_ms, tpot_ms, network_ms, queue_ms, prefill_ms, decode_ms, "
        "tenant, traffic_class, trace_id, request_id FROM requests"
    ).fetchall()
    cols = list(zip(*rows, strict=True))
    out: dict[str, object] = {}
    for name, i in (
        ("e2e", 1),
        ("ttft", 2),
        ("tpot", 3),
        ("network", 4),
        ("queue", 5),
        ("prefill", 6),
        ("decode", 7),
    ):
        out[name] = _pcts([v for v in cols[i] if v is not None])
    total = sum(cols[1])
    out["shares"] = {
        b: sum(v or 0 for v in cols[i]) / total
        for b, i in (("network", 4), ("queue", 5), ("prefill", 6), ("decode", 7))
    }
    hist = [0] * N_BUCKETS
    for (counts,) in conn.execute("SELECT counts FROM itl_hist").fetchall():
        for b, c in enumerate(counts):
            hist[b] += c
    n_gaps = sum(hist)
    cum = [0]
    for c in hist:
        cum.append(cum[-1] + c)
    out["itl"] = [bisect.bisect_left(cum, q * n_gaps) for q in (0.5, 0.9, 0.95, 0.99)]
    # busiest minutes against the rest
    per_slice: dict[int, list[int]] = defaultdict(list)
    for idx, start in enumerate(cols[0]):
        per_slice[start // 60_000_000_000].append(idx)
    ranked = sorted(per_slice, key=lambda s: len(per_slice[s]), reverse=True)
    busy = set(ranked[: max(1, len(ranked) // 10)])
    for flag in (True, False):
        idx = [i for s in per_slice if (s in busy) == flag for i in per_slice[s]]
        out[f"busy_{flag}"] = sum(cols[5][i] for i in idx) / sum(cols[1][i] for i in idx)
    by_tenant: dict[str, list[float]] = defaultdict(list)
    for t, e in zip(cols[8], cols[1], strict=True):
        by_tenant[t].append(e)
    out["tenants"] = {t: _pcts(v)[2] for t, v in by_tenant.items()}
    out["median_e2e"] = statistics.median(cols[1])
    return out


def best_report_s(conn: duckdb.DuckDBPyConnection, runs: int = 3) -> tuple[float, dict[str, Any]]:
    """Gives the best of `runs` full reports' wall time after one that warms the caches (as a
    second report in a session would be): the machine is shared, noise only ever adds time.
    Each report reads one snapshot, as `tokentrace report` and the explorer read it."""
    with one_snapshot(conn):
        report = build_report(conn)
    fast = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        with one_snapshot(conn):
            report = build_report(conn)
        fast = min(fast, time.perf_counter() - t)
    return fast, report


def lake_report_s(db: Path, work: Path, runs: int) -> tuple[float, float, dict[str, Any]]:
    """Copies every data table of `db` into a new lake (its own PostgreSQL catalog, Parquet
    under `work`); gives the copy's seconds and the best report time over the lake, and the
    report."""
    sys.path.insert(0, str(TESTS))
    from tt_postgres import PostgresServer  # the tests' real server: initdb, pg_ctl

    from tokentrace.store.lake.catalog import ALIAS, attach, open_lake

    server = PostgresServer()
    try:
        uri, data = server.new_lake(work / "lake-data")
        t = time.perf_counter()
        conn = duckdb.connect()
        try:
            attach(conn, uri, data)
            conn.execute(f"ATTACH '{db}' AS src (READ_ONLY)")
            for table in DATA_TABLES:
                conn.execute(f"INSERT INTO {ALIAS}.{table} BY NAME SELECT * FROM src.{table}")  # noqa: S608 - schema names
        finally:
            conn.close()
        copied = time.perf_counter() - t
        lake = open_lake(uri, data)
        try:
            fast, report = best_report_s(lake, runs)
        finally:
            lake.close()
        return copied, fast, report
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, help="reuse or create this database file")
    ap.add_argument(
        "--lake",
        action="store_true",
        help="also copy the data into a lake (own PostgreSQL, Parquet on local disk) and time it there",
    )
    ap.add_argument(
        "--runs",
        type=int,
        default=3,
        help="timed reports per store, best taken (default 3; 1 at 10 M)",
    )
    ap.add_argument("--build-only", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.build_only:
        build_db(args.db, args.requests)
        return
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "bench.duckdb"
    if not db.exists():
        t = time.perf_counter()
        # built in a child process, as the collector writes and `tokentrace report` reads:
        # the report's process starts clean, without the build's memory and caches
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--build-only",
                "--db",
                str(db),
                "--requests",
                str(args.requests),
            ],
            check=True,
        )
        print(
            f"built {args.requests:,} requests (+ ITL histograms, kept spans, steps, GPU samples) "
            f"in {time.perf_counter() - t:.1f} s"
        )
    conn = duckdb.connect(str(db), read_only=True)
    try:
        fast, report = best_report_s(conn, args.runs)
        t = time.perf_counter()
        naive_report(conn)
        naive = time.perf_counter() - t
    finally:
        conn.close()
    try:
        lake = lake_report_s(db, Path(tmp.name), args.runs) if args.lake else None
    finally:
        tmp.cleanup()
    print(
        f"requests: {report['requests']['count']:,}, kept traces: {report['requests']['kept_traces']:,}, "
        f"findings: {[f['complaint'] for f in report['findings']]}"
    )
    print(
        f"build_report (full diagnosis, best of {args.runs}): {fast:.2f} s   (goal ≤ 5 s at 10 M)"
    )
    print(f"naive Python baseline (core computation only): {naive:.2f} s")
    print(f"ratio naive / build_report: {naive / fast:.1f}×")
    if lake is not None:
        copied, lake_fast, lake_rep = lake
        same = _headline(lake_rep) == _headline(report)
        print(
            f"lake: copied in {copied:.1f} s; build_report over the lake (best of {args.runs}): {lake_fast:.2f} s, "
            f"{lake_fast / fast:.2f}× the local file's; same counts and findings: {same}"
        )


def _headline(report: dict[str, Any]) -> tuple[object, ...]:
    """The figures a lake must give as the file does: counts and the findings' order."""
    return (report["requests"], [f["complaint"] for f in report["findings"]])


if __name__ == "__main__":
    main()
