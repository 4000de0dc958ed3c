"""NVML sampling on a daemon thread, shipped as OTLP metrics with per-sample timestamps.

Only cheap NVML calls are made (utilization, memory, SM clock, power); never
process lists.  Samples go to a bounded ring per GPU (for request GPU summaries,
whose window is found by bisection) and a bounded export queue; a second daemon thread ships the queue to the collector
every second as OTLP gauges, one data point per sample, each with its own
timestamp.  A failed export drops that batch (no retries: the host never waits),
and exports pause for a while after it; with the SDK disabled or shut down
nothing is sent.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from bisect import bisect_left, bisect_right
from collections import deque
from typing import Any, NamedTuple, Protocol
from urllib.parse import urlsplit

from tokentrace.instrumentation import semconv
from tokentrace.instrumentation._export import Breaker
from tokentrace.instrumentation._runtime import runtime
from tokentrace.instrumentation._safety import log_once, logger

DEFAULT_INTERVAL_S = 0.1
DEFAULT_RING_SIZE = 6_000  # per GPU: 10 min at 10 Hz
EXPORT_INTERVAL_S = 1.0
EXPORT_TIMEOUT_S = 2.0
MAX_EXPORT_QUEUE = 20_000


class GpuReading(NamedTuple):
    utilization_pct: float
    memory_used_bytes: int
    memory_total_bytes: int
    sm_clock_mhz: float
    power_w: float


class GpuSample(NamedTuple):
    ts_ns: int
    gpu_index: int
    reading: GpuReading


class GpuRing:
    """One GPU's last `size` samples, as parallel lists of timestamp, utilization and
    memory used written round (no object a sample): a window's start and end are
    found by bisection on the timestamps, and its mean and max are C-level `sum` and
    `max` over list slices.  Not thread-safe (`GpuSampler` locks)."""

    __slots__ = ("size", "ts", "util", "mem", "_next")

    def __init__(self, size: int) -> None:
        self.size = max(0, size)
        self.ts: list[int] = []
        self.util: list[float] = []
        self.mem: list[int] = []
        #: where the next sample goes once full (the oldest one)
        self._next = 0

    def __len__(self) -> int:
        return len(self.ts)

    def append(self, ts_ns: int, util: float, mem: int) -> None:
        ts = self.ts
        n = len(ts)
        if n:  # kept in order for bisection: a wall clock stepped back counts as no time
            last = ts[self._next - 1] if n == self.size else ts[-1]
            ts_ns = max(ts_ns, last)
        if n < self.size:
            ts.append(ts_ns)
            self.util.append(util)
            self.mem.append(mem)
        elif self.size:
            i = self._next
            ts[i], self.util[i], self.mem[i] = ts_ns, util, mem
            self._next = (i + 1) % self.size

    def window(self, start_ns: int, end_ns: int) -> tuple[float, int, int]:
        """Gives (sum of utilization, sample count, max memory used or -1) over
        [start_ns, end_ns]."""
        ts, total, count, mem_max = self.ts, 0.0, 0, -1
        oldest = self._next if len(ts) == self.size else 0
        # in time order: the oldest samples are at [oldest, n), then the newer at [0, oldest)
        for lo, hi in ((oldest, len(ts)), (0, oldest)):
            if lo >= hi:
                continue
            a = bisect_left(ts, start_ns, lo, hi)
            b = bisect_right(ts, end_ns, a, hi)
            if a < b:
                total += sum(self.util[a:b])
                count += b - a
                mem_max = max(mem_max, max(self.mem[a:b]))
        return total, count, mem_max


class GpuBackend(Protocol):
    """What the sampler needs from NVML (tests inject a fake with the same shape)."""

    def device_count(self) -> int: ...

    def read(self, index: int) -> GpuReading: ...

    def close(self) -> None: ...


class NvmlBackend:
    """The real backend: `pynvml` from the nvidia-ml-py package."""

    def __init__(self) -> None:
        import pynvml

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    def device_count(self) -> int:
        return len(self._handles)

    def read(self, index: int) -> GpuReading:
        nv, h = self._nvml, self._handles[index]
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            power_w = nv.nvmlDeviceGetPowerUsage(h) / 1000.0  # milliwatts
        except nv.NVMLError:
            power_w = float("nan")  # not supported on every board
        sm = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
        return GpuReading(float(util.gpu), int(mem.used), int(mem.total), float(sm), power_w)

    def close(self) -> None:
        try:
            self._nvml.nvmlShutdown()
        except Exception:
            pass


_METRICS = (
    (semconv.METRIC_GPU_UTIL, "%", 0),
    (semconv.METRIC_GPU_MEM_USED, "By", 1),
    (semconv.METRIC_GPU_MEM_TOTAL, "By", 2),
    (semconv.METRIC_GPU_SM_CLOCK, "MHz", 3),
    (semconv.METRIC_GPU_POWER, "W", 4),
)


def samples_to_otlp(samples: list[GpuSample], resource: dict[str, Any]) -> Any:
    """Gives an ExportMetricsServiceRequest: one gauge per metric, one point per sample."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )
    from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
    from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

    def any_value(v: Any) -> AnyValue:
        if isinstance(v, bool):
            return AnyValue(bool_value=v)
        if isinstance(v, int):
            return AnyValue(int_value=v)
        if isinstance(v, float):
            return AnyValue(double_value=v)
        return AnyValue(string_value=str(v))

    req = ExportMetricsServiceRequest()
    rm = req.resource_metrics.add()
    rm.resource.attributes.extend(KeyValue(key=k, value=any_value(v)) for k, v in resource.items())
    sm = rm.scope_metrics.add()
    sm.scope.name = "tokentrace"
    for name, unit, field in _METRICS:
        metric = Metric(name=name, unit=unit)
        for s in samples:
            value = s.reading[field]
            if value != value:  # NaN: the board does not report it
                continue
            point = NumberDataPoint(time_unix_nano=s.ts_ns)
            if field in (1, 2):
                point.as_int = int(value)
            else:
                point.as_double = float(value)
            point.attributes.append(
                KeyValue(key=semconv.GPU_INDEX, value=AnyValue(int_value=s.gpu_index))
            )
            metric.gauge.data_points.append(point)
        if metric.gauge.data_points:
            sm.metrics.append(metric)
    return req


class GpuSampler:
    """Polls the GPUs on a daemon thread; `.summary()` gives a window's mean / max."""

    def __init__(
        self,
        backend: GpuBackend | None,
        interval_s: float = DEFAULT_INTERVAL_S,
        *,
        ring_size: int = DEFAULT_RING_SIZE,
        export: bool = True,
        export_interval_s: float = EXPORT_INTERVAL_S,
    ) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, not {interval_s}")
        self.backend = backend
        self.interval_s = interval_s
        #: samples kept for request summaries, per GPU (`ring_size` each)
        self.ring_size = ring_size
        self._rings: dict[int, GpuRing] = {}
        self._ring_lock = threading.Lock()
        self._outbox: deque[GpuSample] = deque(maxlen=MAX_EXPORT_QUEUE)
        self._export = export
        self._export_interval_s = export_interval_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.samples_taken = 0
        self.samples_exported = 0
        self.export_failures = 0
        #: samples not sent: the SDK disabled or shut down, or the collector unreachable
        self.samples_dropped = 0
        #: after a failed export, exports pause (doubling up to 30 s) instead of
        #: waiting EXPORT_TIMEOUT_S on a dead collector every second
        self._breaker = Breaker()

    @property
    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def start(self) -> GpuSampler:
        if self.backend is None or self._threads:
            return self
        self._threads = [
            threading.Thread(target=self._sample_loop, name="tokentrace-nvml", daemon=True)
        ]
        if self._export:
            self._threads.append(
                threading.Thread(
                    target=self._export_loop, name="tokentrace-gpu-export", daemon=True
                )
            )
        for t in self._threads:
            t.start()
        return self

    def sample_once(self) -> None:
        """Reads every GPU now and records the samples (the thread's body; tests call it)."""
        assert self.backend is not None
        now = time.time_ns()
        for i in range(self.backend.device_count()):
            self.record(GpuSample(now, i, self.backend.read(i)))

    def record(self, sample: GpuSample) -> None:
        """Keeps `sample` in its GPU's ring and queues it for export."""
        reading = sample.reading
        with self._ring_lock:
            ring = self._rings.get(sample.gpu_index)
            if ring is None:
                ring = self._rings[sample.gpu_index] = GpuRing(self.ring_size)
            ring.append(sample.ts_ns, reading.utilization_pct, reading.memory_used_bytes)
        self._outbox.append(sample)
        self.samples_taken += 1

    def _sample_loop(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                self.sample_once()
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("NVML sampling", exc)
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))

    def _export_loop(self) -> None:
        while not self._stop.wait(self._export_interval_s):
            self.export_now()
        self.export_now()

    def export_now(self) -> int:
        """Ships the queued samples to the collector once (no retry); gives how many went.

        Nothing is sent when the SDK is disabled or was shut down, nor for a while
        after a failed export (the samples of then are dropped, counted in
        `samples_dropped`): a collector that is down costs no time here.  After
        `shutdown()` nothing is made either (the configuration that exports nothing
        is not asked for: at exit its provider could not be made).
        """
        batch: list[GpuSample] = []
        while self._outbox:
            batch.append(self._outbox.popleft())
        if not batch:
            return 0
        try:
            if runtime.exports_nothing():
                self.samples_dropped += len(batch)
                return 0
            tracing = runtime.get_tracing()
            if tracing.settings.disabled or tracing.closed:
                self.samples_dropped += len(batch)
                return 0
            if not self._breaker.allow():
                self.samples_dropped += len(batch)
                return 0
            resource = dict(getattr(tracing.provider, "resource", None).attributes or {})  # type: ignore[union-attr]
            body = samples_to_otlp(batch, resource)
            _send(tracing.settings.metrics_endpoint, tracing.settings.metrics_protocol, body)
        except Exception as exc:
            self.export_failures += 1
            self.samples_dropped += len(batch)
            self._breaker.failed()
            log_once("GPU metrics export", exc)
            return 0
        self._breaker.succeeded()
        self.samples_exported += len(batch)
        return len(batch)

    def summary(self, start_ns: int, end_ns: int) -> dict[str, Any] | None:
        """Gives the mean utilization and max memory used over [start_ns, end_ns], or None:
        over every GPU's samples in the window (each GPU keeps its last `ring_size`)."""
        total, count, mem_max = 0.0, 0, -1
        with self._ring_lock:
            for ring in self._rings.values():
                t, n, m = ring.window(start_ns, end_ns)
                total, count, mem_max = total + t, count + n, max(mem_max, m)
        if not count:
            return None
        return {semconv.GPU_UTIL_MEAN: total / count, semconv.GPU_MEM_MAX_BYTES: mem_max}

    def ring_samples(self) -> dict[int, int]:
        """Gives how many samples each GPU's ring holds."""
        with self._ring_lock:
            return {i: len(ring) for i, ring in self._rings.items()}

    def stop(self) -> None:
        """Stops both threads (the exporter ships what is left) and closes the backend; runs once."""
        global _active
        if _active is self:
            # Requests finished while it ran get their GPU summary when the finisher
            # builds their spans (within FINISH_INTERVAL_S): build them now, while the
            # samples are still here, or `stop()` right after a request loses its summary.
            from tokentrace.instrumentation._request import finisher

            try:
                finisher.flush()
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("request finish before GPU sampler stop", exc)
        self._stop.set()
        for t in self._threads:
            t.join(timeout=EXPORT_TIMEOUT_S + 1)
        self._threads = []
        if self.backend is not None:
            try:
                self.backend.close()
            except Exception as exc:
                log_once("NVML shutdown", exc)
            self.backend = None
        if _active is self:
            _active = None


def _send(url: str, protocol: str, body: Any) -> None:
    """Exports `body` to `url`: over OTLP/HTTP the full metrics URL, used as given
    (`…/v1/metrics`, or `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` as written:
    `Settings.metrics_endpoint`); over gRPC the collector's `host:port` is taken from it."""
    if protocol == "grpc":
        import grpc
        from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
            MetricsServiceStub,
        )

        target = urlsplit(url).netloc or url.split("://", 1)[-1]
        with grpc.insecure_channel(target) as channel:
            MetricsServiceStub(channel).Export(body, timeout=EXPORT_TIMEOUT_S)
        return
    req = urllib.request.Request(
        url,
        data=body.SerializeToString(),
        headers={"Content-Type": "application/x-protobuf"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=EXPORT_TIMEOUT_S) as resp:  # noqa: S310 - http(s) checked in Settings
        resp.read()


_active: GpuSampler | None = None


def _after_fork_in_child() -> None:
    """A forked child has none of the sampler's threads, and its NVML handle and ring
    lock are the parent's (a lock held at the fork would hang the child's span building
    in `gpu_summary`): the child starts without a sampler."""
    global _active
    sampler, _active = _active, None
    if sampler is not None:
        sampler._ring_lock = threading.Lock()
        sampler._threads = []


runtime.on_fork_in_child(_after_fork_in_child)


def start_gpu_sampler(
    interval_s: float = DEFAULT_INTERVAL_S,
    backend: GpuBackend | None = None,
    *,
    ring_size: int = DEFAULT_RING_SIZE,
    export: bool = True,
    export_interval_s: float = EXPORT_INTERVAL_S,
) -> GpuSampler:
    """Starts sampling the GPUs (NVML unless `backend` is given); gives the sampler.

    Without NVML or a GPU it logs once and gives a sampler that stays off.
    Request spans finished while it runs get a GPU summary over their lifetime.
    """
    global _active
    if backend is None:
        try:
            backend = NvmlBackend()
            if backend.device_count() == 0:
                backend.close()
                raise RuntimeError("NVML sees no GPU")
        except ImportError as exc:
            # asked for GPU sampling, but the package is missing: worth a warning
            logger.warning(
                'tokentrace: GPU sampler off: %s (pip install "tokentrace[gpu]", in a clone'
                " pip install '.[gpu]', installs nvidia-ml-py)",
                exc,
            )
            backend = None
        except Exception as exc:  # no driver or no GPU: the usual case on a CPU machine
            logger.info("tokentrace: GPU sampler off (%s)", exc)
            backend = None
    sampler = GpuSampler(
        backend, interval_s, ring_size=ring_size, export=export, export_interval_s=export_interval_s
    )
    if _active is not None and _active is not sampler:
        _active.stop()
    if backend is not None:
        _active = sampler.start()
        if export:
            # its exporter thread is a daemon: exit ships what waits, configured or not
            runtime.register_exit_flush(_samples_wait)
    return sampler


def gpu_summary(start_ns: int, end_ns: int) -> dict[str, Any] | None:
    """Gives the running sampler's summary of a window, or None when none runs."""
    sampler = _active
    return None if sampler is None else sampler.summary(start_ns, end_ns)


def _samples_wait() -> bool:
    """Whether the running sampler holds samples not yet exported."""
    sampler = _active
    return sampler is not None and bool(sampler._outbox)


def _flush_active() -> None:
    sampler = _active
    if sampler is not None:
        sampler.export_now()


runtime.add_flush_hook(_flush_active)
