"""Server time of the explorer's pages on a DuckDB of 1,000,000 request summaries, and on a lake.

Prints the p50/p95 server time (the app's own `Server-Timing` header, so the
HTTP client's cost is not counted) of the overview, search and trace pages,
each as a ratio against a bare `SELECT count(*) FROM requests` measured in the
same run on the same file.  Trace pages are opened by random ids, each once:
kept traces (every 50th request: its spans are stored) and others (the summary
only).  Goal: p95 <= 300 ms.

`--lake` also builds a DuckLake of `--lake-requests` (10 M) requests, catalog in a
PostgreSQL it starts, written as shards write it (bench_web_lake.py), prints the
Parquet files each of the trace views' statements reads, and opens random traces
through the web app over it: p50/p95 as ratios to the local file's, same run.

    python benchmarks/bench_web.py [--requests 1000000] [--db PATH] [--runs 15]
    python benchmarks/bench_web.py --lake [--lake-requests 10000000] [--shards 4]
        [--move-rows 10000] [--buckets N] [--sorted] [--row-group-rows N]
"""

from __future__ import annotations

import argparse
import random
import re
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
STEP_NS = 2_500_000  # one engine step every 2.5 ms, on 8 instances in turn (20 ms each)
#: Every 50th request is kept (baseline): its spans are stored, as the collector's sampler would.
KEPT_EVERY = 50

# One batch of requests (row numbers $lo..$hi-1, those of shard $shard of $shards, by a hash): one row per
# request, columns by name; every value derived from the row number with hash() so the
# distribution is realistic (skewed latencies, mixed tenants) and the same in every store.
BATCH_REQUESTS = """
CREATE OR REPLACE TEMP TABLE batch AS
SELECT
    printf('%016x%016x', hash(i), hash(-1 - i)) AS trace_id,
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
    NULL::DOUBLE AS gpu_util_mean, NULL::BIGINT AS gpu_mem_max_bytes, 'tokentrace' AS source,
    []::VARCHAR[] AS flags, i % $kept = 0 AS kept,
    CASE WHEN i % $kept = 0 THEN 'baseline' ELSE '' END AS sample_reason,
    CASE WHEN i % $kept = 0 THEN $kept ELSE 1 END::DOUBLE AS sample_weight,
    'server' AS token_times_source, $seq AS commit_seq
FROM (
    SELECT i,
        5 + (hash(i * 11) % 400) * (1 + (i % 100 = 0)::INT * 10) AS q,
        40 + hash(i * 13) % 300 AS p,
        200 + hash(i * 17) % 2500 AS d,
        CASE WHEN i % 3 = 0 THEN NULL ELSE 5 + hash(i * 19) % 60 END AS net,
        CAST(8 + hash(i * 23) % 400 AS INTEGER) AS toks
    FROM generate_series($lo, $hi - 1) t(i)
    WHERE hash(i, 'shard') % $shards = $shard  -- split by trace id, as the loadbalancing exporter does
)
"""

# What the batch stores, table by table ({t}: the target's prefix, '' or 'lake.').
BATCH_ROWS = {
    "requests": "INSERT INTO {t}requests BY NAME SELECT * FROM batch",
    "itl_hist": """
INSERT INTO {t}itl_hist BY NAME
SELECT trace_id, request_id, start_ns, commit_seq,
       list_transform(range(119), lambda b: CASE WHEN b BETWEEN 40 AND 52
                                                 THEN (hash(start_ns + b) % 20)::INT ELSE 0 END) AS counts
FROM batch
""",
    # a kept trace: the client span, the request span (its token offsets), queue, prefill, decode
    "spans": """
INSERT INTO {t}spans BY NAME
WITH kept AS (
    SELECT trace_id, request_id, start_ns, commit_seq,
           start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS end_ns,
           CAST(coalesce(network_ms, 0) * 5e5 AS BIGINT) AS half_net,
           CAST(queue_ms * 1e6 AS BIGINT) AS q, CAST(prefill_ms * 1e6 AS BIGINT) AS p,
           output_tokens, decode_ms
    FROM batch WHERE kept
)
SELECT trace_id, span_id, parent_span_id, name, kind, s0 AS start_ns, s1 AS end_ns, 0 AS status_code,
       '' AS status_message, 'llm-server' AS service_name, 'bench' AS scope, attributes,
       '[]' AS events, '[]' AS links, '{"service.name": "llm-server"}' AS resource, commit_seq
FROM kept, LATERAL (VALUES
    ('c' || substr(trace_id, 18), '', 'tokentrace.client', 3, start_ns, end_ns, '{}'),
    ('a' || substr(trace_id, 18), 'c' || substr(trace_id, 18), 'tokentrace.request', 2,
     start_ns + half_net, end_ns - half_net,
     '{"tokentrace.request.id": "' || request_id || '", "tokentrace.token.offsets_us": '
     || to_json(list_transform(range(output_tokens),
                               lambda k: (q + p) // 1000 + CAST(k * decode_ms * 1000 / output_tokens AS BIGINT)))
     || '}'),
    ('b' || substr(trace_id, 18), 'a' || substr(trace_id, 18), 'tokentrace.queue', 1,
     start_ns + half_net, start_ns + half_net + q, '{}'),
    ('d' || substr(trace_id, 18), 'a' || substr(trace_id, 18), 'tokentrace.prefill', 1,
     start_ns + half_net + q, start_ns + half_net + q + p, '{}'),
    ('e' || substr(trace_id, 18), 'a' || substr(trace_id, 18), 'tokentrace.decode', 1,
     start_ns + half_net + q + p, end_ns - half_net, '{}')
) v(span_id, parent_span_id, name, kind, s0, s1, attributes)
""",
    "kept_traces": """
INSERT INTO {t}kept_traces BY NAME
SELECT trace_id, 'baseline' AS reason, CAST($kept AS DOUBLE) AS weight,
       start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS decided_ns, 5 AS span_count, commit_seq
FROM batch WHERE kept
""",
    # this batch's time on the engines: a step every STEP_NS, each naming the 16 requests
    # started last (shard 0 writes them: the engines' steps reach one shard, by their trace)
    "engine_steps": """
INSERT INTO {t}engine_steps BY NAME
SELECT 'llm-server' AS service, 'pod-' || (s % 8) AS instance, $base + s * $step AS start_ns,
       19000 AS duration_us, 0 AS prefill_tokens, 16 AS decode_seqs, 16 AS batch_size,
       3 AS queue_depth, 0.5 AS kv_usage, 18000 AS gpu_us, 17000 AS forward_host_us,
       ['req-' || (s * $step // ($span // $n) - k) for k in range(16)] AS request_ids,
       $seq AS commit_seq
FROM generate_series(CAST($lo * ($span // $n) // $step AS BIGINT),
                     CAST($hi * ($span // $n) // $step AS BIGINT) - 1) t(s)
WHERE $shard = 0
""",
}


def batch_sql(
    sql: str, *, lo: int, hi: int, n: int, seq: int, shard: int = 0, shards: int = 1
) -> str:
    """Gives `sql` with the batch's integers in (they are computed here; nothing comes from outside)."""
    values = {
        "$lo": lo, "$hi": hi, "$n": n, "$seq": seq, "$shards": shards, "$shard": shard,
        "$base": BASE_NS, "$span": SPAN_NS, "$step": STEP_NS, "$kept": KEPT_EVERY,
    }  # fmt: skip
    for name, number in values.items():
        sql = sql.replace(name, str(int(number)))
    return sql


def write_batch(
    conn: duckdb.DuckDBPyConnection,
    target: str,
    *,
    lo: int,
    hi: int,
    n: int,
    seq: int,
    shard: int = 0,
    shards: int = 1,
) -> None:
    """Computes one batch of requests and writes it with its ITL histograms, kept spans and engine
    steps into the tables of `target` ('' the file's own, 'lake.' the lake's), in the caller's
    transaction."""
    conn.execute(batch_sql(BATCH_REQUESTS, lo=lo, hi=hi, n=n, seq=seq, shard=shard, shards=shards))
    for sql in BATCH_ROWS.values():
        conn.execute(
            batch_sql(
                sql.replace("{t}", target), lo=lo, hi=hi, n=n, seq=seq, shard=shard, shards=shards
            )
        )


def _one(conn: duckdb.DuckDBPyConnection, sql: str) -> tuple[Any, ...]:
    row = conn.execute(sql).fetchone()
    if row is None:
        raise RuntimeError(f"no row from {sql}")
    return row


def populate(db: Path, n: int) -> None:
    """Fills the file `db` with n request summaries, their ITL histograms, the spans of every
    KEPT_EVERY-th request (kept) and the engine steps of their six hours, in one go."""
    conn = open_db(db)
    try:
        if _one(conn, "SELECT count(*) FROM requests")[0] >= n:
            return
        write_batch(conn, "", lo=0, hi=n, n=n, seq=1)
        conn.execute("DROP TABLE batch")
        conn.execute("CHECKPOINT")
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


def trace_ids(rows: list[int]) -> list[str]:
    """Gives the trace ids of request rows `rows`, as BATCH_REQUESTS makes them (no store read)."""
    conn = duckdb.connect()
    try:
        got = conn.execute(
            "SELECT printf('%016x%016x', hash(i), hash(-1 - i)) FROM unnest(?::BIGINT[]) t(i)",
            [rows],
        ).fetchall()
        return [str(r[0]) for r in got]
    finally:
        conn.close()


def random_traces(n: int, count: int, seed: int) -> dict[str, list[str]]:
    """Gives `count` random kept traces (their spans are stored) and `count` random others."""
    rnd = random.Random(seed)
    kept = [rnd.randrange(n // KEPT_EVERY) * KEPT_EVERY for _ in range(count)]
    other = [
        i + 1 + rnd.randrange(KEPT_EVERY - 1)
        for i in (rnd.randrange(n - KEPT_EVERY) for _ in range(count))
    ]
    return {
        "trace (kept, random ids)": trace_ids(kept),
        "trace (summary only, random)": trace_ids(other),
    }


@contextmanager
def served(app: Any) -> Iterator[httpx.Client]:
    """Serves `app` on a free loopback port for the block; gives a client of it."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{server.config.port}", timeout=600) as client:
            yield client
    finally:
        server.should_exit = True
        thread.join(10)
        app.state.reports.close()
        app.state.db.close()


def server_ms(client: httpx.Client, path: str) -> float:
    """Gets `path`; gives the app's own time for it (its `Server-Timing`), failing on a non-200."""
    r = client.get(path)
    if r.status_code != 200:
        raise SystemExit(f"{path}: HTTP {r.status_code}: {r.text[:300]}")
    m = re.search(r"dur=([0-9.]+)", r.headers["server-timing"])
    return float(m.group(1)) if m else float("nan")


def time_traces(client: httpx.Client, traces: dict[str, list[str]]) -> dict[str, list[float]]:
    """Opens each trace page once (each a random id: no page is measured warm), per kind."""
    server_ms(client, "/trace/" + next(iter(traces.values()))[-1])  # warm-up: plans, the catalog
    return {
        kind: [server_ms(client, f"/trace/{tid}") for tid in ids[:-1]]
        for kind, ids in traces.items()
    }


def local_pages(
    db: Path, n: int, runs: int, traces: dict[str, list[str]]
) -> dict[str, list[float]]:
    """Times the explorer's pages over the file `db`: overview, search, trace pages."""
    pages = {
        "overview (all, 6 h)": "/",
        "overview (1h, model)": "/?window=1h&model=qwen-7b",
        "search (newest)": "/search",
        "search (slowest e2e)": "/search?sort=e2e_ms&order=desc&min_ttft=100",
    }
    results: dict[str, list[float]] = {}
    with served(create_web_app(CollectorSettings(db=db))) as client:
        # the pending path first: the report of this view is computed in the background meanwhile
        pending = [server_ms(client, "/api/overview?window=7d") for _ in range(5)]
        print(
            f"overview while its report is computed in the background: p50 {statistics.median(pending):.1f} ms"
        )
        # the diagnosis fills the report cache the overview reads (stale-while-revalidate)
        for q in ("", "?window=1h&model=qwen-7b"):
            d = client.get("/api/diagnosis" + q).json()
            print(
                f"diagnosis report{q or ' (all)'}: computed in {d['report_compute_s'] * 1000:.0f} ms (cold)"
            )
        nxt = client.get("/api/search?sort=e2e_ms&order=desc").json()["next"]
        pages["search (page 2 keyset)"] = "/search?" + str(httpx.QueryParams(nxt))
        for name, path in pages.items():
            server_ms(client, path)  # warm-up: first query plans, caches
            results[name] = [server_ms(client, path) for _ in range(runs)]
        results.update(time_traces(client, traces))
    return results


def print_pages(results: dict[str, list[float]], baseline: list[float] | None = None) -> None:
    b95 = _p(baseline, 0.95) if baseline else None
    if baseline and b95:
        print(
            f"baseline SELECT count(*): p50 {statistics.median(baseline):.2f} ms, p95 {b95:.2f} ms"
        )
    print(f"{'page':30} {'p50 ms':>9} {'p95 ms':>9} {'p95/baseline':>13}  goal p95 <= 300 ms")
    for name, times in results.items():
        p95 = _p(times, 0.95)
        ratio = f"{p95 / b95:12.1f}x" if b95 else f"{'':13}"
        print(
            f"{name:30} {statistics.median(times):9.1f} {p95:9.1f} {ratio}  {'ok' if p95 <= 300 else 'OVER'}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1_000_000, help="requests in the local file")
    ap.add_argument(
        "--db", type=Path, default=None, help="reuse (or create) this file instead of a temp one"
    )
    ap.add_argument("--runs", type=int, default=15, help="times each page is opened")
    ap.add_argument("--traces", type=int, default=30, help="random trace ids opened, of each kind")
    ap.add_argument("--lake", action="store_true", help="also build a lake and open its traces")
    ap.add_argument("--lake-requests", type=int, default=10_000_000)
    ap.add_argument("--shards", type=int, default=4, help="shards writing the lake")
    ap.add_argument(
        "--move-rows", type=int, default=10_000, help="requests a shard moves into the lake at once"
    )
    ap.add_argument(
        "--buckets",
        type=int,
        default=None,
        help="trace-id buckets of the lake (default: the lake's own)",
    )
    ap.add_argument(
        "--sorted",
        action="store_true",
        help="sort requests, spans and kept_traces by trace id in each file, instead of the"
        " lake's own order (store/lake/catalog.py SORTED_BY)",
    )
    ap.add_argument(
        "--row-group-rows",
        type=int,
        default=0,
        help="Parquet row groups of the lake's requests, spans and engine steps (0: the lake's own, 16,384)",
    )
    args = ap.parse_args()
    print("(figures are of this machine as it was: shared with other work, so compare ratios)")
    with tempfile.TemporaryDirectory(prefix="bench-web-") as tmp:
        db = args.db or Path(tmp) / "bench.duckdb"
        t = time.perf_counter()
        populate(db, args.requests)
        print(
            f"database: {db} ({args.requests:,} requests) ready in {time.perf_counter() - t:.1f} s"
        )
        local_traces = random_traces(args.requests, args.traces + 1, seed=1)
        if not args.lake:
            results = local_pages(db, args.requests, args.runs, local_traces)
            print_pages(results, baseline_ms(db, args.runs))
            return
        from bench_web_lake import lake_traces  # noqa: PLC0415 - the lake's parts only with --lake

        if args.buckets:
            from tokentrace.store.lake import catalog  # noqa: PLC0415

            catalog.TRACE_BUCKETS = args.buckets

        with served(create_web_app(CollectorSettings(db=db))) as client:
            local = time_traces(client, local_traces)
        lake = lake_traces(
            Path(tmp),
            n=args.lake_requests,
            shards=args.shards,
            move_rows=args.move_rows,
            sorted_ids=args.sorted,
            row_group_rows=args.row_group_rows,
            traces=random_traces(args.lake_requests, args.traces + 1, seed=2),
            local_db=db,
        )
        print(f"\ntrace pages, local file ({args.requests:,} requests):")
        print_pages(local)
        print(f"\ntrace pages, lake ({args.lake_requests:,} requests, {args.shards} shards):")
        print_pages(lake)
        print(f"\n{'lake / local file':30} {'p50':>9} {'p95':>9}")
        for kind in lake:
            print(
                f"{kind:30} {statistics.median(lake[kind]) / statistics.median(local[kind]):8.2f}x"
                f" {_p(lake[kind], 0.95) / _p(local[kind], 0.95):8.2f}x"
            )


if __name__ == "__main__":
    main()
