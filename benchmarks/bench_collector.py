"""Collector throughput: end-to-end persisted spans/s with tail sampling on, peak RSS,
and beside it the raw protobuf parse rate of the same payloads (the ceiling).

    python benchmarks/bench_collector.py [--seconds 20] [--traces-per-export 200] [--wal-cost]

It starts a real `tokentrace serve` (default sampling: 2 % baseline, p99 per
service/model/route, errors), sends prebuilt OTLP/HTTP protobuf exports from two
threads as fast as the collector accepts them (503s are retried), and counts a
span as persisted once the summary row of its request is committed to DuckDB.

`--wal-cost` then runs the same load again against a serve with the OTLP write-ahead log
on (`--wal on`, every export synced before its 200) and one with it off, alternately, and
prints spans/s with it on against off as a ratio (the cost of the log on ingest).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

sys.path.insert(0, str(Path(__file__).parent))
from otlp_load import SPANS_PER_TRACE, build_payloads, send  # noqa: E402

_given_ports: set[int] = set()


def free_port() -> int:
    """A free loopback port, never one given before: the kernel may hand a just-closed port
    straight back, and serve refuses two of its servers on one port."""
    import socket

    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _given_ports:
            _given_ports.add(port)
            return port


def metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def parse_rate(payloads: list[bytes], spans: int) -> float:
    """Gives spans/s of bare `ParseFromString` over the payloads (best of 3)."""
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for body in payloads:
            ExportTraceServiceRequest().ParseFromString(body)
        best = max(best, spans * len(payloads) / (time.perf_counter() - t0))
    return best


def _status_mb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field):
            return int(line.split()[1]) / 1024
    return float("nan")


def peak_rss_mb(pid: int) -> float:
    return _status_mb(pid, "VmHWM:")


def children(pid: int) -> list[int]:
    """Gives the pids of the process's children (the collector's decode workers)."""
    try:
        tasks = Path(f"/proc/{pid}/task").iterdir()
        return [int(c) for t in tasks for c in (t / "children").read_text().split()]
    except OSError:
        return []


def cpu_s(pid: int) -> float:
    """Gives the user + system CPU seconds the process has used."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class RssWatch:
    """Samples the collector's RSS and buffer occupancy while the load runs, so
    the output shows whether memory levels off (bounded) or grows with the run."""

    def __init__(self, pid: int, endpoint: str, every_s: float = 0.5) -> None:
        # (s since start, RSS MiB of the collector and its decode workers, buffered spans)
        self.samples: list[tuple[float, float, float]] = []
        self.worker_cpu: dict[int, float] = {}  # CPU s of each worker, last seen
        self._pid, self._endpoint, self._every = pid, endpoint, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.perf_counter()
        self._thread.start()

    def _run(self) -> None:
        with httpx.Client(timeout=5) as client:
            while not self._stop.wait(self._every):
                try:
                    buffered = metric(client.get(f"{self._endpoint}/metrics").text, "tokentrace_buffer_spans")
                except httpx.HTTPError:
                    buffered = float("nan")
                rss = _status_mb(self._pid, "VmRSS:")
                for child in children(self._pid):
                    rss += _status_mb(child, "VmRSS:")
                    self.worker_cpu[child] = cpu_s(child)
                self.samples.append((time.perf_counter() - self._t0, rss, buffered))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at_fractions(self, fractions: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0)) -> list[tuple[float, float]]:
        """Gives (seconds, highest RSS so far) at those fractions of the sampled time."""
        out = []
        for f in fractions:
            upto = [rss for t, rss, _ in self.samples if t <= f * self.samples[-1][0]]
            out.append((f * self.samples[-1][0], max(upto, default=float("nan"))))
        return out

    def max_buffered(self) -> float:
        return max((b for _, _, b in self.samples), default=float("nan"))


def start_serve(db: Path, port: int, extra: list[str]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(db), "--http-port", str(port),
           "--grpc-port", str(free_port()), "--web-port", str(free_port()), *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{port}/metrics")
            return proc
        except httpx.TransportError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("tokentrace serve did not start")


def run(seconds: float, traces_per_export: int, grace_s: float, extra: list[str],
        senders: int = 2, packed: bool = True) -> dict[str, Any]:  # fmt: skip
    payloads = build_payloads(64, traces_per_export, packed=packed)
    spans_per_export = traces_per_export * SPANS_PER_TRACE
    ceiling = parse_rate(payloads, spans_per_export)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        proc = start_serve(Path(tmp) / "bench.duckdb", port, ["--grace-s", str(grace_s), *extra])
        endpoint = f"http://127.0.0.1:{port}"
        try:
            watch = RssWatch(proc.pid, endpoint)
            t0 = time.perf_counter()
            cpu0 = cpu_s(proc.pid)
            sender_cpu0 = time.process_time()
            load = send(endpoint, payloads, spans_per_export, seconds=seconds, workers=senders)
            sender_cpu = time.process_time() - sender_cpu0
            send_s = time.perf_counter() - t0
            sent_traces = load.spans_accepted // SPANS_PER_TRACE
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                text = httpx.get(f"{endpoint}/metrics").text
                if metric(text, "tokentrace_requests_written_total") >= sent_traces:
                    break
                time.sleep(0.05)
            elapsed = time.perf_counter() - t0
            text = httpx.get(f"{endpoint}/metrics").text
            rss = peak_rss_mb(proc.pid)
            workers_rss = sum(peak_rss_mb(c) for c in children(proc.pid))
            main_cpu = cpu_s(proc.pid) - cpu0
            watch.stop()
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    written = metric(text, "tokentrace_requests_written_total")
    return {
        "spans_accepted": load.spans_accepted,
        "requests_written": written,
        "spans_kept_written": metric(text, "tokentrace_spans_written_total"),
        "refusals_retried": load.retries,
        "errors": len(load.errors),
        "elapsed_s": elapsed,
        "persisted_spans_per_s": written * SPANS_PER_TRACE / elapsed,
        "parse_ceiling_spans_per_s": ceiling,
        "peak_rss_mb": rss,
        "workers_peak_rss_mb": workers_rss,
        "collector_cpu_s": main_cpu,
        "workers_cpu_s": sum(watch.worker_cpu.values()),
        "senders": senders,
        "sender_cpu_s": sender_cpu,
        "send_s": send_s,
        "rss_over_time": watch.at_fractions(),
        "max_buffered_spans_seen": watch.max_buffered(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=20.0, help="how long to send")
    ap.add_argument("--traces-per-export", type=int, default=200)
    ap.add_argument("--grace-s", type=float, default=0.5)
    ap.add_argument("--senders", type=int, default=2, help="sending threads (exports in flight)")
    ap.add_argument("--array-offsets", action="store_true",
                    help="token times as an OTLP int array (older SDKs), not a packed string")  # fmt: skip
    ap.add_argument("--wal-cost", action="store_true",
                    help="then compare spans/s with the write-ahead log on and off (same load)")  # fmt: skip
    ap.add_argument("serve_args", nargs="*", help="extra `tokentrace serve` flags (after --)")
    args = ap.parse_args()
    r = run(args.seconds, args.traces_per_export, args.grace_s, args.serve_args, args.senders,
            packed=not args.array_offsets)  # fmt: skip
    print(f"cores: {os.cpu_count()}  payload: {args.traces_per_export} traces x "
          f"{SPANS_PER_TRACE} spans per export, token times "
          f"{'an int array' if args.array_offsets else 'packed'}, grace {args.grace_s}s, {args.senders} senders, "
          f"serve flags: {' '.join(args.serve_args) or 'defaults'}")  # fmt: skip
    print(f"accepted {r['spans_accepted']:.0f} spans; stored {r['requests_written']:.0f} request "
          f"summaries (every request) and {r['spans_kept_written']:.0f} kept spans; "
          f"{r['refusals_retried']:.0f} 503s retried; {r['errors']:.0f} errors")  # fmt: skip
    lost = r["spans_accepted"] / SPANS_PER_TRACE - r["requests_written"]
    print(f"persisted end-to-end:   {r['persisted_spans_per_s']:>10,.0f} spans/s  (lost: {lost:.0f})")
    print(f"raw protobuf parse:     {r['parse_ceiling_spans_per_s']:>10,.0f} spans/s  (ceiling)")
    print(f"ratio persisted/parse:  {r['persisted_spans_per_s'] / r['parse_ceiling_spans_per_s']:>10.3f}")
    print(f"peak RSS of the collector: {r['peak_rss_mb']:.0f} MiB "
          f"+ decode workers {r['workers_peak_rss_mb']:.0f} MiB "
          f"(DuckDB memory_limit {os.environ.get('TOKENTRACE_DUCKDB_MEMORY_LIMIT', 'default')}, "
          f"most spans buffered {r['max_buffered_spans_seen']:.0f})")  # fmt: skip
    spans = r["requests_written"] * SPANS_PER_TRACE
    print(f"CPU per 1,000 persisted spans: collector process {1e6 * r['collector_cpu_s'] / spans:.1f} ms, "
          f"decode workers {1e6 * r['workers_cpu_s'] / spans:.1f} ms, load generator "
          f"{1e6 * r['sender_cpu_s'] / r['spans_accepted']:.1f} ms per 1,000 sent "
          f"({r['sender_cpu_s'] / r['send_s']:.0%} of a core)")  # fmt: skip
    growth = ", ".join(f"{t:.0f} s: {mb:.0f}" for t, mb in r["rss_over_time"])
    print(f"peak RSS so far (collector + workers), MiB, by time into the run (flat = bounded): {growth}")
    if args.wal_cost:
        wal_cost(args)


def wal_cost(args: argparse.Namespace, rounds: int = 2) -> None:
    """Prints persisted spans/s with the write-ahead log on against off: runs alternate
    (off, on, off, on) so that a noisy machine weighs on both sides alike."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for wal in ("off", "on"):
            flags = [*args.serve_args, "--wal", wal]
            r = run(args.seconds, args.traces_per_export, args.grace_s, flags, args.senders,
                    packed=not args.array_offsets)  # fmt: skip
            rates[wal].append(r["persisted_spans_per_s"])
    on, off = max(rates["on"]), max(rates["off"])
    print(f"write-ahead log: on {on:,.0f} spans/s, off {off:,.0f} spans/s (best of {rounds} "
          f"alternating runs each): on/off = {on / off:.3f}")  # fmt: skip
    runs = ", ".join(f"{w} {r:,.0f}" for pair in zip(rates["off"], rates["on"], strict=True)
                     for w, r in zip(("off", "on"), pair, strict=True))  # fmt: skip
    print(f"  every run, in order: {runs}")


if __name__ == "__main__":
    main()
