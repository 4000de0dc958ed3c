"""Scale-out ingest: N `tokentrace serve` shards on this machine against one, in the same
run, printed as a ratio (issue 23, docs/scale-out.md).

    python benchmarks/bench_scale_out.py [--seconds 20] [--shards 2] [--rounds 1] [-- serve flags]

Each round runs one shard, then `--shards` shards, each a real `tokentrace serve` on its own
file, fed by the same load generator as `bench_collector.py` (benchmarks/otlp_load.py:
~6-span request traces, 200 to an export, 503s retried).  A trace goes to one shard whole, as
the OpenTelemetry Collector's `loadbalancing` exporter sends it: each export goes to one
shard (its traces' shard).  The senders are shared out: the same number of sending threads
in both layouts.  A span counts once the summary row of its request is committed, on every
shard (`tokentrace_requests_written_total`); the rate is over the time until the last shard
has written all it accepted.

On a machine with fewer cores than shards x (collector + decode worker) this cannot scale;
what it shows there is that splitting does not cost ingest.  Extra serve flags (after `--`)
go to every shard: `-- --wal on` prices the write-ahead log, `-- --lake URI --lake-data DIR`
makes the shards write a lake (each its own `--shard` name).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from bench_collector import free_port, metric, start_serve  # noqa: E402
from otlp_load import SPANS_PER_TRACE, LoadResult, build_payloads, send  # noqa: E402


def ingest(shards: int, seconds: float, payloads: list[bytes], traces_per_export: int,
           senders: int, extra: list[str], tag: str) -> tuple[float, int, int]:  # fmt: skip
    """Runs `shards` shards under the load for `seconds`; gives (persisted spans/s, requests
    written, 503s retried)."""
    spans_per_export = traces_per_export * SPANS_PER_TRACE
    with tempfile.TemporaryDirectory() as tmp:
        ports = [free_port() for _ in range(shards)]
        procs = []
        try:
            for i, port in enumerate(ports):
                names = ["--shard", f"bench-{tag}-{i}"] if "--lake" in extra else []
                db = Path(tmp) / f"shard{i}.duckdb"
                procs.append(start_serve(db, port, ["--grace-s", "0.5", *names, *extra]))
            results: list[LoadResult] = [LoadResult() for _ in ports]

            def load(i: int) -> None:
                mine = payloads[i::shards]  # each export (and so each trace) to one shard
                results[i] = send(f"http://127.0.0.1:{ports[i]}", mine, spans_per_export,
                                  seconds=seconds, workers=max(1, senders // shards))  # fmt: skip

            t0 = time.perf_counter()
            threads = [threading.Thread(target=load, args=(i,)) for i in range(shards)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            written = 0
            deadline = time.monotonic() + 120
            for port, result in zip(ports, results, strict=True):
                want = result.spans_accepted // SPANS_PER_TRACE
                while True:
                    got = metric(httpx.get(f"http://127.0.0.1:{port}/metrics").text,
                                 "tokentrace_requests_written_total")  # fmt: skip
                    if got >= want or time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                written += int(got)
            elapsed = time.perf_counter() - t0
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(60)
    errors = [e for r in results for e in r.errors]
    if errors:
        raise SystemExit(f"{shards} shard(s): {len(errors)} send errors, first: {errors[0]}")
    return written * SPANS_PER_TRACE / elapsed, written, sum(r.retries for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long each layout is fed")
    ap.add_argument("--shards", type=int, default=2, help="shards of the layout against one")
    ap.add_argument("--rounds", type=int, default=1, help="times each layout runs, alternating")
    ap.add_argument("--traces-per-export", type=int, default=200)
    ap.add_argument("--senders", type=int, default=2, help="sending threads in all, shared out")
    ap.add_argument("serve_args", nargs="*", help="extra `tokentrace serve` flags (after --)")
    args = ap.parse_args()
    payloads = build_payloads(64, args.traces_per_export)
    rates: dict[int, list[float]] = {1: [], args.shards: []}
    for r in range(args.rounds):
        for n in (1, args.shards):
            rate, written, retried = ingest(n, args.seconds, payloads, args.traces_per_export,
                                            args.senders, args.serve_args, f"{r}-{n}")  # fmt: skip
            rates[n].append(rate)
            print(f"round {r + 1}, {n} shard(s): {rate:>9,.0f} spans/s persisted "
                  f"({written:,} requests written, {retried:,} 503s retried)", flush=True)  # fmt: skip
    one, many = sum(rates[1]) / args.rounds, sum(rates[args.shards]) / args.rounds
    print(
        f"cores: {os.cpu_count()}  {args.seconds:.0f} s a layout, {args.rounds} round(s), "
        f"{args.senders} senders, serve flags: {' '.join(args.serve_args) or 'defaults'}"
    )
    print(f"1 shard:  {one:>9,.0f} spans/s  ({one / SPANS_PER_TRACE:,.0f} requests/s)")
    print(
        f"{args.shards} shards: {many:>9,.0f} spans/s  ({many / SPANS_PER_TRACE:,.0f} requests/s)"
    )
    print(f"ratio {args.shards} shards / 1 shard: {many / one:.2f}")


if __name__ == "__main__":
    main()
