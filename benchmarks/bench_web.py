"""Server time of the explorer's pages on a DuckDB of 1,000,000 request summaries.

Prints the p50/p95 server time (the app's own `Server-Timing` header, so the
HTTP client's cost is not counted) of the overview, search and trace pages,
each as a ratio against a bare `SELECT count(*) FROM requests` measured in the
same run on the same file.  Goal: p95 <= 300 ms.

    python benchmarks/bench_web.py [--requests 1000000] [--db PATH] [--runs 15]
"""

from __future__ import annotations

import argparse
import re
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import duckdb
import httpx
import uvicorn

from tokentrace.collector.settings import CollectorSettings
from tokentrace.store.connection import open_db
from tokentrace.web.app import create_web_app

BASE_NS = 1_767_225_600 * 10**9
SPAN_NS = 6 * 3600 * 10**9  # the requests spread over six hours

# One row per request, columns by name; every value derived from the row number
# with hash() so the distribution is realistic (skewed latencies, mixed tenants).
POPULATE_REQUESTS = """
INSERT INTO requests BY NAME
SELECT
    printf('%032x', hash(i)) AS trace_id,
    'req-' || i AS request_id,
    $base + i * ($span // $n) AS start_ns,
    q + p + d + coalesce(net, 0) AS e2e_ms,
    q AS queue_ms, p AS prefill_ms, d AS decode_ms, net AS network_ms,
    q + p + d AS server_ms, q * 0.8 AS queue_wait_ms, q * 0.1 AS tokenize_ms, q * 0.1 AS other_ms,
    q + p AS ttft_ms, q + p + coalesce(net, 0) AS ttft_client_ms, d / (toks - 1) AS tpot_ms,
    d / (toks - 1) AS itl_p50_ms, d / (toks - 1) * 2 AS itl_p95_ms, d / (toks - 1) * 3 AS itl_p99_ms,
    d / (toks - 1) * 4 AS itl_max_ms, (hash(i) % 13 = 0)::INT AS stall_count,
    100 + hash(i * 3) % 3000 AS prompt_tokens, toks AS output_tokens,
    ['llama-8b', 'qwen-7b', 'mistral-7b'][1 + i % 3] AS model,
    'tenant-' || (hash(i * 7) % 40) AS tenant,
    CASE WHEN i % 5 = 4 THEN 'batch' ELSE 'interactive' END AS traffic_class,
    'llm-server' AS service, 'pod-' || (i % 8) AS instance, 'prod' AS environment,
    '/v1/chat/completions' AS route, i % 5000 = 0 AS cold_start, i % 997 = 0 AS error,
    NULL AS gpu_util_mean, NULL AS gpu_mem_max_bytes, 'tokentrace' AS source, []::VARCHAR[] AS flags,
    i % 50 = 0 AS kept, CASE WHEN i % 50 = 0 THEN 'baseline' ELSE '' END AS sample_reason, 1.0 AS sample_weight
FROM (
    SELECT i,
        5 + (hash(i * 11) % 400) * (1 + (i % 100 = 0)::INT * 10) AS q,
        40 + hash(i * 13) % 300 AS p,
        200 + hash(i * 17) % 2500 AS d,
        CASE WHEN i % 3 = 0 THEN NULL ELSE 5 + hash(i * 19) % 60 END AS net,
        8 + hash(i * 23) % 400 AS toks
    FROM generate_series(0, $n - 1) t(i)
)
"""

POPULATE_ITL_HIST = """
INSERT INTO itl_hist
SELECT trace_id, request_id, start_ns,
       list_transform(range(119), lambda b: CASE WHEN b BETWEEN 40 AND 52 THEN (hash(start_ns + b) % 20)::INT ELSE 0 END)
FROM requests
"""


def _one(conn: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    row = conn.execute(sql).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {sql}")
    return row


def populate(db: Path, n: int) -> str:
    """Fills `db` with n request summaries, their ITL histograms, engine steps and one kept trace."""
    conn = open_db(db)
    try:
        if _one(conn, "SELECT count(*) FROM requests")[0] >= n:
            return str(_one(conn, "SELECT trace_id FROM requests WHERE kept ORDER BY e2e_ms DESC LIMIT 1")[0])
        # only integers computed here go into the text; nothing comes from outside
        sql = POPULATE_REQUESTS.replace("$n", str(int(n))).replace("$base", str(BASE_NS)).replace("$span", str(SPAN_NS))
        conn.execute(sql)
        conn.execute(POPULATE_ITL_HIST)
        # engine steps every 20 ms on 8 instances, each listing the requests it served
        conn.execute(
            f"""INSERT INTO engine_steps
            SELECT 'llm-server', 'pod-' || (s % 8), {BASE_NS} + s * 2500000, 19000, 0, 16, 16, 3, 0.5, 18000,
                   ['req-' || (s * 1000 // 9000 + k) for k in range(16)], NULL
            FROM generate_series(0, {SPAN_NS // 2_500_000} - 1) t(s)"""  # noqa: S608
        )
        trace_id, request_id, start_ns, e2e_ms = _one(
            conn, "SELECT trace_id, request_id, start_ns, e2e_ms FROM requests WHERE kept ORDER BY e2e_ms DESC LIMIT 1"
        )
        end_ns = start_ns + int(e2e_ms * 1e6)
        offsets = list(range(100_000, int(e2e_ms * 1000) - 1000, 20_000))
        attrs = (
            '{"tokentrace.request.id": "%s", "tokentrace.token.offsets_us": %s}' % (request_id, offsets)  # noqa: UP031
        )
        spans = [
            ("c" * 16, "", "tokentrace.client", 3, start_ns, end_ns, "{}"),
            ("a" * 16, "c" * 16, "tokentrace.request", 2, start_ns + 5_000_000, end_ns - 5_000_000, attrs),
        ] + [
            (f"{k:016x}", "a" * 16, "tokentrace.decode", 1, start_ns + k * 1_000_000, start_ns + k * 2_000_000, "{}")
            for k in range(1, 60)
        ]
        conn.executemany(
            "INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?, 0, '', 'llm-server', 'bench', ?, '[]', '[]', "
            "'{\"service.name\": \"llm-server\"}')",
            [(trace_id, *s) for s in spans],
        )
        conn.execute("INSERT INTO kept_traces VALUES (?, 'baseline', 50.0, ?, ?)", [trace_id, end_ns, len(spans)])
        conn.execute("CHECKPOINT")
        return str(trace_id)
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def baseline_ms(db: Path, runs: int) -> list[float]:
    conn = duckdb.connect(str(db), read_only=True)
    try:
        out = []
        for _ in range(runs):
            t = time.perf_counter()
            conn.execute("SELECT count(*) FROM requests").fetchone()
            out.append((time.perf_counter() - t) * 1000)
        return out
    finally:
        conn.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--db", type=Path, default=None, help="reuse (or create) this file instead of a temp one")
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    tmp = tempfile.TemporaryDirectory()
    db = args.db or Path(tmp.name) / "bench.duckdb"
    t = time.perf_counter()
    trace_id = populate(db, args.requests)
    print(f"database: {db} ({args.requests:,} requests) ready in {time.perf_counter() - t:.1f} s")

    port = free_port()
    if True:
        app = create_web_app(CollectorSettings(db=db))
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        while not server.started:
            time.sleep(0.02)
        base = f"http://127.0.0.1:{port}"
        pages = {
            "overview (all, 6 h)": "/",
            "overview (1h, model)": "/?window=1h&model=qwen-7b",
            "search (newest)": "/search",
            "search (slowest e2e)": "/search?sort=e2e_ms&order=desc&min_ttft=100",
            "search (page 2 keyset)": None,
            "trace": f"/trace/{trace_id}",
        }
        results: dict[str, list[float]] = {}
        with httpx.Client(base_url=base, timeout=600) as client:
            # the pending path first: the report of this view is computed in the background meanwhile
            pending = []
            for _ in range(5):
                r = client.get("/api/overview?window=7d")
                pending.append(float(r.headers["server-timing"].split("dur=")[1]))
            print(f"overview while its report is computed in the background: p50 {statistics.median(pending):.1f} ms "
                  f"(pending={r.json()['report_pending']})")
            # the diagnosis fills the report cache the overview reads (stale-while-revalidate)
            for q in ("", "?window=1h&model=qwen-7b"):
                d = client.get("/api/diagnosis" + q).json()
                print(f"diagnosis report{q or ' (all)'}: computed in {d['report_compute_s'] * 1000:.0f} ms (cold)")
            nxt = client.get("/api/search?sort=e2e_ms&order=desc").json()["next"]
            pages["search (page 2 keyset)"] = "/search?" + httpx.QueryParams(nxt).__str__()
            for name, path in pages.items():
                assert path is not None
                client.get(path)  # warm-up: first query plans, caches
                times = []
                for _ in range(args.runs):
                    r = client.get(path)
                    if r.status_code != 200:
                        raise SystemExit(f"{name}: HTTP {r.status_code}: {r.text[:300]}")
                    m = re.search(r"dur=([0-9.]+)", r.headers["server-timing"])
                    times.append(float(m.group(1)) if m else float("nan"))
                results[name] = times
        server.should_exit = True
        thread.join(10)
        app.state.reports.close()
        app.state.db.close()

    base_times = baseline_ms(db, args.runs)
    b95 = _p(base_times, 0.95)
    print(f"baseline SELECT count(*): p50 {statistics.median(base_times):.2f} ms, p95 {b95:.2f} ms")
    print(f"{'page':26} {'p50 ms':>9} {'p95 ms':>9} {'p95/baseline':>13}  goal p95 <= 300 ms")
    for name, times in results.items():
        p95 = _p(times, 0.95)
        verdict = "ok" if p95 <= 300 else "OVER"
        print(f"{name:26} {statistics.median(times):9.1f} {p95:9.1f} {p95 / b95:12.1f}x  {verdict}")
    tmp.cleanup()


if __name__ == "__main__":
    main()
