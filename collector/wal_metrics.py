"""The write-ahead log's self-metrics (`GET /metrics`), on the collector's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

#: fdatasync takes ~0.05-2 ms on an SSD, tens of ms on a busy or network disk
SYNC_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class WalMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.appends = Counter(
            "tokentrace_wal_appends", "exports appended to the OTLP write-ahead log", registry=r
        )
        self.bytes = Counter(
            "tokentrace_wal_bytes", "bytes appended to the OTLP write-ahead log", registry=r
        )
        self.sync_seconds = Histogram(
            "tokentrace_wal_sync_seconds",
            "time to write and fdatasync one group commit of the write-ahead log",
            buckets=SYNC_BUCKETS,
            registry=r,
        )
        self.replayed_records = Counter(
            "tokentrace_wal_replayed_records",
            "write-ahead log records replayed at start (not committed before the last stop)",
            registry=r,
        )
        self.segments = Gauge(
            "tokentrace_wal_segments", "segment files of the write-ahead log on disk", registry=r
        )
        self.writable = Gauge(
            "tokentrace_wal_writable",
            "1 while the write-ahead log takes records, 0 while it fails (exports get 503)",
            registry=r,
        )

    def on_sync(self, seconds: float, records: int, nbytes: int) -> None:
        self.sync_seconds.observe(seconds)
        self.appends.inc(records)
        self.bytes.inc(nbytes)
