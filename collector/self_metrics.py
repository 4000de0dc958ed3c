"""The collector's own Prometheus metrics, declared up front with descriptions.

Each `CollectorMetrics` has its own `CollectorRegistry` (no global state, so
two collectors in one process, or one per test, never mix their counts).  It
also carries histograms of the request summaries with vLLM's bucket
boundaries, so a Prometheus/Grafana user gets latency dashboards for free.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.utils import floatToGoString

from tokentrace.analyzer.summary import RequestSummary

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
    """Counters, gauges and histograms of one collector, in its own registry."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
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
        self.traces_decided = Counter(
            "tokentrace_traces", "traces decided, by outcome and reason", ["kept", "reason"], registry=r
        )
        self.traces_evicted = Counter(
            "tokentrace_traces_evicted_early",
            "traces decided before their root ended because the buffer was nearly full",
            registry=r,
        )
        self.late_spans = Counter(
            "tokentrace_late_spans", "spans arriving after their trace was decided", ["kept"], registry=r
        )
        self.duplicate_spans = Counter(
            "tokentrace_duplicate_spans",
            "spans dropped because their trace already held that span id (an exporter's retry), "
            "while buffered or after the trace was kept",
            ["when"],
            registry=r,
        )
        self.requests_summarized = Counter(
            "tokentrace_requests_summarized", "request summaries written (every request)", registry=r
        )
        self.gpu_samples = Counter(
            "tokentrace_gpu_samples", "GPU sample rows received over OTLP metrics", registry=r
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
        self.writer_queue = Gauge(
            "tokentrace_writer_queue_batches", "batches waiting for the DuckDB writer", registry=r
        )
        self.requests_written = Gauge(
            "tokentrace_requests_written", "request summary rows committed to DuckDB", registry=r
        )
        self.spans_written = Gauge(
            "tokentrace_spans_written", "span rows of kept traces committed to DuckDB", registry=r
        )
        self.write_errors = Gauge(
            "tokentrace_write_errors", "DuckDB write transactions that failed", registry=r
        )
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
        self.request_histograms = RequestHistograms()
        r.register(self.request_histograms)
        self._sources: list[Callable[[], None]] = []

    def observe_requests(self, requests: Sequence[RequestSummary]) -> None:
        """Adds each request's summary to the latency histograms."""
        self.request_histograms.observe(requests)

    def on_scrape(self, refresh: Callable[[], None]) -> None:
        """Registers a callback that refreshes gauges just before each scrape."""
        self._sources.append(refresh)

    def render(self) -> tuple[bytes, str]:
        """Gives the Prometheus text exposition and its content type."""
        for refresh in self._sources:
            refresh()
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class RequestHistograms:
    """The request-summary histograms (`REQUEST_HISTOGRAMS`), one series per model.

    A decision round observes thousands of summaries x 8 measures; through
    `Histogram.observe` that was ~15 % of the decider's time (a lock and a
    bucket walk per value).  Here a round takes one lock and one `bisect` per
    value into plain counts, and a scrape turns the counts into the same
    cumulative `_bucket`/`_count`/`_sum` series.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # per histogram: model -> [count per bucket (+Inf last)..., sum in seconds]
        self._series: list[dict[str, list[float]]] = [{} for _ in REQUEST_HISTOGRAMS]

    def observe(self, requests: Sequence[RequestSummary]) -> None:
        with self._lock:
            for (_, field, buckets, _), series in zip(REQUEST_HISTOGRAMS, self._series, strict=True):
                size = len(buckets) + 1
                for req in requests:
                    value = getattr(req, field)
                    if value is None:
                        continue
                    seconds = value / 1000.0
                    counts = series.get(req.model)
                    if counts is None:
                        counts = series[req.model] = [0] * (size + 1)
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
