"""Soak test (not in the test suite): N minutes at 80 % of measured capacity, then
accepted vs. stored.  Zero accepted spans may be lost.

    python benchmarks/soak_collector.py --minutes 10 [--capacity SPANS_PER_S]

Without --capacity it first measures capacity with bench_collector's run.
Every accepted export's traces must end up as request summary rows once the
collector has been SIGTERMed (which decides and flushes everything buffered).
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import httpx  # noqa: E402
from bench_collector import children, free_port, metric, peak_rss_mb, run, start_serve  # noqa: E402
from otlp_load import SPANS_PER_TRACE, build_payloads, send  # noqa: E402

from tokentrace.store.connection import open_read_only  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--capacity", type=float, default=0.0, help="spans/s (measured when 0)")
    ap.add_argument("--load", type=float, default=0.8, help="share of capacity to send")
    ap.add_argument("--traces-per-export", type=int, default=200)
    args = ap.parse_args()
    capacity = args.capacity or run(15, args.traces_per_export, 0.5, [])["persisted_spans_per_s"]
    rate = capacity * args.load
    print(f"capacity {capacity:,.0f} spans/s; soaking {args.minutes} min at {rate:,.0f} spans/s")
    payloads = build_payloads(64, args.traces_per_export)
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "soak.duckdb"
        port = free_port()
        proc = start_serve(db, port, ["--grace-s", "2"])
        try:
            t0 = time.monotonic()
            load = send(f"http://127.0.0.1:{port}", payloads,
                        args.traces_per_export * SPANS_PER_TRACE,
                        seconds=args.minutes * 60, rate=rate, workers=2)  # fmt: skip
            text = httpx.get(f"http://127.0.0.1:{port}/metrics").text
            rss = peak_rss_mb(proc.pid)
            workers_rss = sum(peak_rss_mb(c) for c in children(proc.pid))
            elapsed = time.monotonic() - t0
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(120)
        conn = open_read_only(db)
        stored = conn.execute("SELECT count(*) FROM requests").fetchone()[0]  # type: ignore[index]
        conn.close()
    accepted_traces = load.spans_accepted // SPANS_PER_TRACE
    lost = accepted_traces - stored
    print(f"sent for {elapsed:.0f} s: accepted {load.spans_accepted} spans "
          f"({accepted_traces} requests), {load.retries} 503s retried, {len(load.errors)} errors")  # fmt: skip
    print(f"stored {stored} request summaries; lost {lost}; "
          f"evicted early {metric(text, 'tokentrace_traces_evicted_early_total'):.0f}; "
          f"peak RSS {rss:.0f} MiB + decode workers {workers_rss:.0f} MiB")  # fmt: skip
    print("OK: zero accepted spans lost" if lost == 0 else "FAIL: accepted spans were lost")
    return 0 if lost == 0 and not load.errors else 1


if __name__ == "__main__":
    raise SystemExit(main())
