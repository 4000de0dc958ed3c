"""The collector's own Prometheus metrics, declared up front with descriptions.

Each `CollectorMetrics` has its own `CollectorRegistry` (no global state, so
two collectors in one process, or one per test, never mix their counts).  It
also carries histograms of the request summaries with vLLM's bucket
boundaries, so a Prometheus/Grafana user gets latency dashboards for free,
and the process and Python metrics (`process_*`, `python_*`) of the collector.

Every label value that comes from a client (the `model` of a request) is
capped (`MAX_MODEL_LABELS`): a client sending random model names must not grow
every scrape without bound; and made encodable (`label_value`): a lone UTF-16
surrogate in one must not make every later scrape fail.  `_created` series are off (`disable_created_metrics`,
process-wide): they double the series count and no dashboard uses them.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import (
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.utils import floatToGoString

from tokentrace import __version__
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.metric_views import (
    LakeMoves,
    LakeState,
    PipelineCounts,
    RetentionPasses,
    RetentionState,
    RunningTotal,
    StoreFiles,
)
from tokentrace.collector.pipeline_stats import PipelineStats

logger = logging.getLogger("tokentrace.collector")

# `_created` series (one per counter/histogram series, a timestamp) double the
# size of a scrape and Prometheus ignores them in the text format.  The switch
# is process-wide in prometheus_client; the collector's metrics are the only
# ones its process exposes.
disable_created_metrics()

#: Distinct values of a client-controlled label (the request's `model`) that get
#: a series of their own; later values share `OTHER_LABEL`.
MAX_MODEL_LABELS = 50
#: The label value of everything past `MAX_MODEL_LABELS`.
OTHER_LABEL = "other"

_SURROGATE = re.compile("[\ud800-\udfff]")


def label_value(value: str) -> str:
    """Gives `value` as a label value the text format can carry: UTF-8, so each
    lone UTF-16 surrogate (which a str may hold) becomes U+FFFD."""
    if value.__class__ is not str:
        value = str(value)
    if value.isascii():
        return value
    try:
        value.encode()
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", value)
    return value

#: vLLM's `vllm:time_to_first_token_seconds` buckets.
TTFT_BUCKETS_S: tuple[float, ...] = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
#: vLLM's `vllm:time_per_output_token_seconds` / `vllm:inter_token_latency_seconds` buckets.
TPOT_BUCKETS_S: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
)  # fmt: skip
#: vLLM's request-latency buckets (`vllm:e2e_request_latency_seconds`, queue, prefill, decode).
REQUEST_LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
#: Internal latencies (decision, write): sub-millisecond to seconds.
INTERNAL_BUCKETS_S: tuple[float, ...] = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0,
)  # fmt: skip

#: The request histograms: (metric name, summary field in ms, buckets, description).
REQUEST_HISTOGRAMS: tuple[tuple[str, str, Sequence[float], str], ...] = (
    ("tokentrace_request_ttft_seconds", "ttft_ms", TTFT_BUCKETS_S, "time to first token (server side)"),
    ("tokentrace_request_tpot_seconds", "tpot_ms", TPOT_BUCKETS_S, "time per output token after the first"),
    ("tokentrace_request_itl_max_seconds", "itl_max_ms", TPOT_BUCKETS_S, "largest inter-token gap per request"),
    ("tokentrace_request_e2e_seconds", "e2e_ms", REQUEST_LATENCY_BUCKETS_S, "end-to-end request latency"),
    ("tokentrace_request_network_seconds", "network_ms", REQUEST_LATENCY_BUCKETS_S, "network bucket"),
    ("tokentrace_request_queue_seconds", "queue_ms", REQUEST_LATENCY_BUCKETS_S, "queue bucket"),
    ("tokentrace_request_prefill_seconds", "prefill_ms", REQUEST_LATENCY_BUCKETS_S, "prefill bucket"),
    ("tokentrace_request_decode_seconds", "decode_ms", REQUEST_LATENCY_BUCKETS_S, "decode bucket"),
)  # fmt: skip


class CollectorMetrics:
    """Counters, gauges and histograms of one collector, in its own registry.

    `db`: the database file; its size and its WAL's (`<db>.wal`) are read at
    each scrape.
    """

    def __init__(self, db: str | os.PathLike[str] | None = None) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        _register_runtime_collectors(r)
        self.build_info = Gauge(
            "tokentrace_build_info", "always 1; the tokentrace version as a label", ["version"], registry=r
        )
        self.build_info.labels(__version__).set(1)
        self.spans_received = Counter(
            "tokentrace_spans_received", "spans received by the OTLP receivers", ["protocol"], registry=r
        )
        self.spans_accepted = Counter(
            "tokentrace_spans_accepted", "spans accepted into the tail buffer", ["protocol"], registry=r
        )
        self.spans_rejected = Counter(
            "tokentrace_spans_rejected",
            "spans refused: invalid (partial success) or backpressure (503/UNAVAILABLE)",
            ["protocol", "reason"],
            registry=r,
        )
        self.exports_refused = Counter(
            "tokentrace_exports_refused",
            "whole export requests answered 4xx/5xx, by HTTP status or gRPC code",
            ["protocol", "status"],
            registry=r,
        )
        # the pipeline keeps these counts (`PipelineStats`, one tally); read at each scrape
        self.pipeline_counts = PipelineCounts()
        r.register(self.pipeline_counts)
        self.gpu_samples = Counter(
            "tokentrace_gpu_samples", "GPU sample rows received over OTLP metrics", registry=r
        )
        self.log_records_rejected = Counter(
            "tokentrace_log_records_rejected",
            "OTLP log records received and not stored (tokentrace stores traces and GPU metrics, "
            "not logs): each log export is answered with a partial success rejecting them all",
            ["protocol"],
            registry=r,
        )
        self.buffered_spans = Gauge(
            "tokentrace_buffer_spans", "spans waiting in the tail buffer", registry=r
        )
        self.buffered_traces = Gauge(
            "tokentrace_buffer_traces", "traces waiting in the tail buffer", registry=r
        )
        self.buffer_capacity = Gauge(
            "tokentrace_buffer_capacity_spans", "bound of the tail buffer", registry=r
        )
        self.buffered_bytes = Gauge(
            "tokentrace_buffer_bytes",
            "what the spans in the tail buffer are reckoned to weigh (max_buffered_bytes bounds it)",
            registry=r,
        )
        self.buffer_capacity_bytes = Gauge(
            "tokentrace_buffer_capacity_bytes", "byte bound of the tail buffer", registry=r
        )
        self.writer_queue = Gauge(
            "tokentrace_writer_queue_batches", "batches waiting for the DuckDB writer", registry=r
        )
        self.writer_capacity = Gauge(
            "tokentrace_writer_queue_capacity_batches", "bound of the DuckDB writer's queue", registry=r
        )
        # the writer keeps these totals itself; `set()` them before each scrape
        self.requests_written = RunningTotal(
            "tokentrace_requests_written",
            "request summary rows committed to DuckDB",
            registry=r,
        )
        self.spans_written = RunningTotal(
            "tokentrace_spans_written",
            "span rows committed to DuckDB (of kept traces, and late spans of kept traces)",
            registry=r,
        )
        self.requests_already_stored = RunningTotal(
            "tokentrace_requests_already_stored",
            "request summary rows left out because the database held that request already "
            "(a re-sent export or a re-imported file beyond the decision cache: the first copy wins)",
            registry=r,
        )
        self.spans_already_stored = RunningTotal(
            "tokentrace_spans_already_stored",
            "span rows left out because the database held that span of a kept trace already, "
            "or its trace was stored dropped",
            registry=r,
        )
        self.write_errors = RunningTotal(
            "tokentrace_write_errors",
            "rows dropped because DuckDB would not take them, after their batch failed and was "
            "retried row by row: each request summary, kept trace (with its spans), late span, "
            "engine step or GPU sample counts one",
            registry=r,
        )
        self.rows_lost = RunningTotal(
            "tokentrace_rows_lost",
            "rows decided after the DuckDB writer thread had stopped, never written "
            "(request summaries, kept traces, late spans, engine steps, GPU samples); "
            "tokentrace_store_writable reads 0 then: restart the collector",
            registry=r,
        )
        self.engine_steps_dropped = RunningTotal(
            "tokentrace_engine_steps_dropped",
            "engine steps dropped unread: past 4,096 a batch span, 65,536 a trace or "
            "524,288 an export (the tokentrace SDK sends at most 512 a span)",
            registry=r,
        )
        self.decode_worker_restarts = RunningTotal(
            "tokentrace_decode_worker_restarts",
            "decode worker pools replaced because a worker process died (OOM killer, kill); "
            "the exports in flight were decoded in-process",
            registry=r,
        )
        self.store_writable = Gauge(
            "tokentrace_store_writable",
            "1 while DuckDB takes writes, 0 while they fail (rows wait and are retried; receivers answer 503)",
            registry=r,
        )
        self.store_writable.set(1)  # until `watch_store` hands over the writer's own state
        self.store_seconds_since_write = Gauge(
            "tokentrace_store_seconds_since_write",
            "seconds since the writer last committed a transaction (grows while idle too)",
            registry=r,
        )
        self.p99_shared_requests = RunningTotal(
            "tokentrace_p99_shared_requests",
            "requests judged on the one running p99 that the (service, model, route) keys beyond"
            " the first 256 share (a sender making up names, or more deployments than that)",
            registry=r,
        )
        self.model_label_overflow = Counter(
            "tokentrace_model_label_overflow",
            f"request summaries counted under model=\"{OTHER_LABEL}\" because "
            f"{MAX_MODEL_LABELS} distinct models already had their own label value",
            registry=r,
        )
        if db is not None:
            r.register(StoreFiles(db))
        self.decision_latency = Histogram(
            "tokentrace_decision_latency_seconds",
            "time from a trace's first span to its decision",
            buckets=(0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0),
            registry=r,
        )
        self.write_latency = Histogram(
            "tokentrace_write_latency_seconds",
            "duration of one DuckDB write transaction",
            buckets=INTERNAL_BUCKETS_S,
            registry=r,
        )
        self.models = BoundedLabel("model", MAX_MODEL_LABELS, self.model_label_overflow.inc)
        self.request_histograms = RequestHistograms(self.models)
        r.register(self.request_histograms)
        self._sources: list[Callable[[], None]] = []
        self._unencodable_logged = False
        self._logs_lock = threading.Lock()
        self._logs_logged = False

    def note_log_records(self, protocol: str, records: int, service: str) -> None:
        """Counts the log records of one export, which are not stored; logs the first
        export that held any (once per collector, whichever receiver took it)."""
        if not records:
            return
        self.log_records_rejected.labels(protocol).inc(records)
        with self._logs_lock:
            first = not self._logs_logged
            self._logs_logged = True
        if not first:
            return
        logger.warning(
            "tokentrace: an OTLP log export came in over %s (service %r, %d log records): "
            "tokentrace stores traces and GPU metrics, not logs, so log records are answered "
            "with a partial success and dropped (counted in "
            "tokentrace_log_records_rejected_total); send logs elsewhere, or turn the "
            "sender's log exporter off (OTEL_LOGS_EXPORTER=none). Further ones are dropped "
            "without a word",
            protocol, service, records,
        )  # fmt: skip

    def observe_requests(self, requests: Sequence[RequestSummary]) -> None:
        """Adds each request's summary to the latency histograms."""
        self.request_histograms.observe(requests)

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        """Registers a callback that refreshes gauges just before each scrape."""
        self._sources.append(refresh)

    def watch_pipeline(self, stats: PipelineStats) -> None:
        """Reports the pipeline's counts at each scrape: `tokentrace_traces_total`,
        `tokentrace_late_spans_total` and the others `PipelineCounts` names."""
        self.pipeline_counts.stats = stats

    def watch_decoder(self, pool: _RestartCounting) -> None:
        """Reports the decode pool's `worker_restarts` at each scrape."""
        self.on_scrape(lambda: self.decode_worker_restarts.set(pool.worker_restarts))

    def watch_retention(self, retention: RetentionState) -> None:
        """Exports `--retention`'s passes (only a collector with retention has them):
        `tokentrace_retention_deleted_total{table}`,
        `tokentrace_retention_failed_passes_total` and
        `tokentrace_retention_last_run_timestamp_seconds`."""
        self.registry.register(RetentionPasses(retention))

    def watch_lake(self, lake: LakeState) -> None:
        """Exports a shard's moves into the lake (only a collector with `--lake` has them):
        the `tokentrace_lake_*` series of `LakeMoves`."""
        self.registry.register(LakeMoves(lake))

    def render(self) -> tuple[bytes, str]:
        """Gives the Prometheus text exposition and its content type.

        Should a label value still not encode as UTF-8 (client-controlled ones
        are made encodable as they come in, `label_value`), the scrape is
        rendered again with every label value repaired, rather than failing."""
        for refresh in self._sources:
            refresh()
        try:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        except UnicodeEncodeError as exc:
            if not self._unencodable_logged:
                self._unencodable_logged = True
                logger.warning("tokentrace: a /metrics label value is not UTF-8 (%s); replaced", exc)
            repaired = CollectorRegistry(auto_describe=False)
            repaired.register(_EncodableLabels(self.registry))
            return generate_latest(repaired), CONTENT_TYPE_LATEST

    # ---- store state (the store-failure work; kept apart from the metrics above) ----
    def watch_store(self, writable: Callable[[], float], seconds_since_write: Callable[[], float]) -> None:
        """Reads the gauges of the DuckDB store's state from these at each scrape:
        `tokentrace_store_writable` (1, or 0 while writes fail and are retried) and
        `tokentrace_store_seconds_since_write` (since the last committed write)."""
        self.store_writable.set_function(writable)
        self.store_seconds_since_write.set_function(seconds_since_write)


class _EncodableLabels:
    """A registry's metrics with every label value through `label_value`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for metric in self._registry.collect():
            metric.samples = [
                sample._replace(labels={k: label_value(v) for k, v in sample.labels.items()})
                for sample in metric.samples
            ]
            yield metric


def _register_runtime_collectors(registry: CollectorRegistry) -> None:
    """The `process_*` (CPU, RSS, open fds, start time; Linux /proc), `python_info`
    and `python_gc_*` metrics, as the default registry has them."""
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)


class _RestartCounting(Protocol):
    @property
    def worker_restarts(self) -> int: ...


class BoundedLabel:
    """The values of one client-controlled label, capped: the first `limit`
    distinct values keep their own, later ones become `OTHER_LABEL` (each one
    counted through `on_overflow`; a warning is logged the first time)."""

    def __init__(self, name: str, limit: int, on_overflow: Callable[[float], None]) -> None:
        self.name = name
        self.limit = limit
        self._on_overflow = on_overflow
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        self.overflowed = False

    def __call__(self, value: str) -> str:
        """Gives the label value for `value` (itself, or `OTHER_LABEL`)."""
        return self.map([value])[0]

    def map(self, values: Sequence[str]) -> list[str]:
        """Gives the label value of each of `values`, counting the overflow once."""
        seen = self._seen
        out = list(values)
        if all(v in seen for v in out):  # the common case, no lock (set reads are atomic)
            return out
        other = 0
        with self._lock:
            for i, v in enumerate(out):
                if v in seen:
                    continue
                # only encodable values are in `seen`: one that is not comes here each time
                v = out[i] = label_value(v)
                if v in seen:
                    continue
                if len(seen) < self.limit:
                    seen.add(v)
                    continue
                out[i] = OTHER_LABEL
                other += 1
            first = other and not self.overflowed
            self.overflowed = self.overflowed or bool(other)
        if first:
            logger.warning(
                "tokentrace: more than %d distinct %s values; later ones are reported as "
                '%s="%s" in /metrics',
                self.limit, self.name, self.name, OTHER_LABEL,
            )  # fmt: skip
        if other:
            self._on_overflow(other)
        return out


class RequestHistograms:
    """The request-summary histograms (`REQUEST_HISTOGRAMS`), one series per model.

    A decision round observes thousands of summaries x 8 measures; through
    `Histogram.observe` that was ~15 % of the decider's time (a lock and a
    bucket walk per value).  Here a round takes one lock and one `bisect` per
    value into plain counts, and a scrape turns the counts into the same
    cumulative `_bucket`/`_count`/`_sum` series.
    """

    def __init__(self, models: BoundedLabel | None = None) -> None:
        self._lock = threading.Lock()
        if models is None:
            models = BoundedLabel("model", MAX_MODEL_LABELS, lambda n: None)
        self._models = models
        # per histogram: model -> [count per bucket (+Inf last)..., sum in seconds]
        self._series: list[dict[str, list[float]]] = [{} for _ in REQUEST_HISTOGRAMS]

    def observe(self, requests: Sequence[RequestSummary]) -> None:
        models = self._models.map([req.model for req in requests])
        with self._lock:
            for (_, field, buckets, _), series in zip(REQUEST_HISTOGRAMS, self._series, strict=True):
                size = len(buckets) + 1
                for req, model in zip(requests, models, strict=True):
                    value = getattr(req, field)
                    if value is None:
                        continue
                    seconds = value / 1000.0
                    counts = series.get(model)
                    if counts is None:
                        counts = series[model] = [0] * (size + 1)
                    counts[bisect_left(buckets, seconds)] += 1  # first bound >= value: Prometheus' `le`
                    counts[size] += seconds

    def describe(self) -> list[Metric]:
        return [HistogramMetricFamily(n, d, labels=["model"]) for n, _, _, d in REQUEST_HISTOGRAMS]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = [{m: list(c) for m, c in s.items()} for s in self._series]
        for (name, _, buckets, desc), series in zip(REQUEST_HISTOGRAMS, snapshot, strict=True):
            family = HistogramMetricFamily(name, desc, labels=["model"])
            bounds = [floatToGoString(b) for b in buckets] + ["+Inf"]
            for model, counts in sorted(series.items()):
                cumulative, total = [], 0
                for bound, n in zip(bounds, counts, strict=False):
                    total += int(n)
                    cumulative.append((bound, total))
                family.add_metric([model], cumulative, sum_value=counts[-1])
            yield family
