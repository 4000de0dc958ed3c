"""Big trace exports (protobuf or OTLP/JSON) decoded in worker processes.

The collector is bound by the GIL, and turning an export into `Span` records
(upb wrappers, one per field and attribute) is its largest single cost: ~10 µs
a span.  A worker process does that work on the other core and hands each trace
back packed (`collector/packed.py`): its spans as one pickled blob that the
collector opens only when it needs them.  Small exports stay in-process: for
them the round trip costs more than the decode.

The worker also summarizes each trace of the export as if the export held the
whole trace (`summarize_trace` is a pure function of the span list; the second
largest cost).  The pipeline uses that result only when, at decision time, the
trace's spans are exactly the ones of that export (no span came in another
export); otherwise it summarizes the trace itself.  Either way the summary is
the one `summarize_trace` gives for the trace's spans.

Nothing is accepted before its spans are back in the receiving process and
offered to the pipeline, so a worker that dies loses nothing: the export is
decoded in-process instead and the pool is replaced.

A worker is a new interpreter (spawn): it takes 1-2 s to start, over 4 s on a
loaded machine.  `serve` starts it with the collector, and an export that comes
before a worker is ready is decoded in-process rather than waiting for it: an
export that waited would outlast the SDK's 3 s export timeout, and the SDK
would count a batch that landed as dropped and pause its exports.

What one export makes the collector build of engine steps is bounded
(`MAX_STEPS_PER_EXPORT`, `limit_export_steps`): here for the exports a worker
decodes, in `Pipeline.offer` for the others.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import fields
from operator import attrgetter
from typing import Any

from tokentrace.analyzer.attribution import TraceResult, summarize_trace
from tokentrace.analyzer.engine_steps import (
    MAX_STEPS_PER_SPAN,
    MAX_STEPS_PER_TRACE,
    EngineStep,
    dropped_steps,
)
from tokentrace.analyzer.spans import KIND_SERVER, STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.gc_tuning import tune_for_ingest
from tokentrace.collector.itl_hist import itl_histograms
from tokentrace.collector.otlp import Rejected, decode_json_body, decode_protobuf_partial
from tokentrace.collector.packed import PackedTrace
from tokentrace.instrumentation import semconv as sc

logger = logging.getLogger("tokentrace.collector")

#: Exports smaller than this are decoded in-process (round trip > decode).
OFFLOAD_MIN_BYTES = 64 * 1024

#: Pools started again after their worker died starting, before giving up.
MAX_FAILED_STARTS = 3

#: Records cross the process boundary as tuples of their fields, in
#: constructor order: plain tuples, dicts and lists pickle at C speed, slotted
#: dataclasses through a Python-level __getstate__ per object.
_span_row = attrgetter(*(f.name for f in fields(Span)))
_summary_row = attrgetter(*(f.name for f in fields(RequestSummary)))
_step_row = attrgetter(*(f.name for f in fields(EngineStep)))

#: One trace as it crosses the pipe: trace id, span count, root candidates,
#: error, pickled span rows, summary rows, engine-step rows and the summaries'
#: ITL histogram counts (the last three None when summarizing failed).
WireTrace = tuple[
    str, int, list[str], bool, bytes, list[tuple[Any, ...]] | None,
    list[tuple[Any, ...]] | None, list[list[int]] | None,
]  # fmt: skip

#: The store's ITL bucket bounds, handed to each worker by the collector (the
#: worker does not import the store, and with it DuckDB).
_itl_bounds_ms: tuple[float, ...] = ()


#: The most engine steps one export may make the collector build.  The analyzer reads
#: at most MAX_STEPS_PER_SPAN (4,096) a batch span and MAX_STEPS_PER_TRACE (65,536) a
#: trace, but an export may hold many traces: a few MB of packed lists (gzip makes them
#: a few KB on the wire) made a decode worker (or, for the exports decoded in-process,
#: the decider) build traces x 65,536 steps, ~300 bytes each.  The tokentrace SDK sends
#: at most 512 steps a batch span (instrumentation/_steps.py MAX_STEPS_PER_SPAN) and the
#: OpenTelemetry batch processor at most 512 spans an export: 262,144 steps.  Twice that
#: is never reached by a legitimate export (room for a sender that exports bigger
#: batches), and bounds what one export costs to ~150 MB of steps.
MAX_STEPS_PER_EXPORT = 2 * 512 * 512
#: The parallel lists of an engine-step batch span (one element a step).
_STEP_LISTS = frozenset(
    (
        sc.STEP_START_NS, sc.STEP_DURATION_US, sc.STEP_PREFILL_TOKENS, sc.STEP_DECODE_SEQS,
        sc.STEP_BATCH_SIZE, sc.STEP_QUEUE_DEPTH, sc.STEP_KV_USAGE, sc.STEP_GPU_US,
        sc.STEP_REQUEST_IDS, sc.STEP_FORWARD_HOST_US,
    )
)  # fmt: skip


def _elements(value: Any) -> int:
    """Gives how many elements a list attribute holds, at most, without parsing it: an
    OTLP array its length, a packed one its commas + 1 (exact for numbers; a comma
    inside an element counts one more), anything else none."""
    if isinstance(value, list):
        return len(value)
    if isinstance(value, str):
        commas = value.count(",")
        return commas + 1 if commas or value.strip(" \t\n\r[]") else 0
    if isinstance(value, bytes):
        commas = value.count(b",")
        return commas + 1 if commas or value.strip(b" \t\n\r[]") else 0
    return 0


def limit_export_steps(
    spans: Sequence[Span], budget: int = MAX_STEPS_PER_EXPORT
) -> tuple[int, str]:
    """Bounds the engine steps the spans of one export make the analyzer build to
    `budget`: in export order, each batch span takes what the per-span and per-trace
    caps would read of it (counted, not parsed); one that no longer fits loses its step
    lists, unread, and the rest of the export is kept (whole spans: the SDK's are 512
    steps at most).  Gives how many steps the stripped spans carried, and the service
    of the first (for the log)."""
    left = budget
    trace_left: dict[str, int] = {}
    dropped = 0
    service = ""
    for span in spans:
        if span.name != sc.SPAN_ENGINE_STEPS:
            continue
        attributes = span.attributes
        carried = _elements(attributes.get(sc.STEP_START_NS))
        if not carried:
            continue
        in_trace = trace_left.get(span.trace_id, MAX_STEPS_PER_TRACE)
        read = min(carried, MAX_STEPS_PER_SPAN, in_trace)
        if read <= left:
            left -= read
            trace_left[span.trace_id] = in_trace - read
            continue
        span.attributes = {k: v for k, v in attributes.items() if k not in _STEP_LISTS}
        if not dropped:
            service = span.service_name
        dropped += carried
    return dropped, service


class _ExportCap:
    """What `limit_export_steps` dropped in this process (`export_dropped_steps()`), and
    whether it was logged."""

    lock = threading.Lock()
    dropped = 0
    logged = False
    #: what the per-span / per-trace caps (analyzer/engine_steps.py) dropped in decode
    #: workers: counted in the worker's own process, handed back with each export
    worker_capped = 0


def export_dropped_steps() -> int:
    """Gives how many engine steps the export bound (MAX_STEPS_PER_EXPORT) dropped in
    this process (those a decode worker dropped included)."""
    return _ExportCap.dropped


def steps_dropped_total() -> int:
    """Gives every engine step this collector dropped unread: the export bound's, and the
    per-span / per-trace caps' in this process and in its decode workers."""
    return dropped_steps() + _ExportCap.dropped + _ExportCap.worker_capped


def note_dropped_steps(dropped: int, service: str) -> None:
    """Counts the steps `limit_export_steps` dropped of one export; logs the first time."""
    with _ExportCap.lock:
        _ExportCap.dropped += dropped
        first = not _ExportCap.logged
        _ExportCap.logged = True
    if first:
        logger.warning(
            "an export's engine-step batch spans (service %r) carry more steps than the %d "
            "read from one export (the tokentrace SDK sends at most 512 a span, 512 spans an "
            "export): %d steps of the spans past the bound are dropped unread; further ones "
            "are dropped without a word",
            service, MAX_STEPS_PER_EXPORT, dropped,
        )  # fmt: skip


def decode_export(
    body: bytes, json_body: bool = False
) -> tuple[list[WireTrace], Rejected, tuple[int, str, int]]:
    """Runs in the worker: the export's valid spans grouped by trace (first-seen
    order, spans in export order) and packed, each with its summary as if the
    export held the whole trace; what was rejected; and what `limit_export_steps`
    dropped (with the service it names), and then the per-span / per-trace caps.
    `json_body`: the body is OTLP/JSON, else protobuf.  Raises OtlpDecodeError for
    a body that is not an export, like the in-process path."""
    capped_before = dropped_steps()
    spans, rejected = decode_json_body(body) if json_body else decode_protobuf_partial(body)
    dropped, service = limit_export_steps(spans)
    by_trace: dict[str, list[Span]] = {}
    for span in spans:
        group = by_trace.get(span.trace_id)
        if group is None:
            by_trace[span.trace_id] = [span]
        else:
            group.append(span)
    out: list[WireTrace] = []
    gap_lists: list[list[float]] = []
    for trace_id, group in by_trace.items():
        ids = {s.span_id for s in group}
        # the pipeline's root candidates (see Pipeline.offer); a SERVER span whose
        # parent is in this export is never the root, whatever arrives later
        roots = [
            s.parent_span_id
            for s in group
            if not s.parent_span_id or (s.kind == KIND_SERVER and s.parent_span_id not in ids)
        ]
        error = any(s.status_code == STATUS_ERROR for s in group)
        blob = pickle.dumps(list(map(_span_row, group)), protocol=pickle.HIGHEST_PROTOCOL)
        if len(ids) < len(group):
            # a span id twice in the export: no summary here, so the pipeline
            # drops the repeats (and counts them) before it summarizes the trace
            out.append((trace_id, len(group), roots, error, blob, None, None, None))
            continue
        try:
            result = summarize_trace(group)
        except Exception:  # noqa: BLE001 - the collector then summarizes it itself, and logs
            out.append((trace_id, len(group), roots, error, blob, None, None, None))
            continue
        requests = list(map(_summary_row, result.requests))
        steps = list(map(_step_row, result.engine_steps))
        gap_lists.extend(r.itl_gaps_ms for r in result.requests)
        out.append((trace_id, len(group), roots, error, blob, requests, steps, []))
    if gap_lists and _itl_bounds_ms:
        # one numpy pass for the export; each trace takes its requests' rows
        counts = iter(itl_histograms(gap_lists, _itl_bounds_ms))
        for *_, rows, _, trace_counts in out:
            if trace_counts is not None and rows:
                trace_counts.extend(next(counts) for _ in rows)
    return out, rejected, (dropped, service, dropped_steps() - capped_before)


def unpack(wire: list[WireTrace]) -> list[PackedTrace]:
    """Gives the worker's traces as `PackedTrace`s (their spans stay packed)."""
    return [
        PackedTrace(
            trace_id, count, roots, error, blob,
            None if requests is None or steps is None else TraceResult(
                [RequestSummary(*row) for row in requests], [EngineStep(*row) for row in steps]
            ),
            counts if counts and requests is not None and len(counts) == len(requests) else None,
        )  # fmt: skip
        for trace_id, count, roots, error, blob, requests, steps, counts in wire
    ]


def _init_worker(parent_pid: int, itl_bounds_ms: tuple[float, ...]) -> None:
    """Worker initializer: the collector's GC settings (a decode builds ~10
    containers a span: with the default gen-0 threshold the worker spent ~15 %
    of its time in the cyclic GC), and an exit when the collector dies (a
    kill -9 runs no shutdown), so no orphan keeps its pipes, stdout or memory."""
    global _itl_bounds_ms
    _itl_bounds_ms = itl_bounds_ms
    tune_for_ingest()

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="tokentrace-parent-watch", daemon=True).start()


def _started() -> int:
    """The task that tells a new pool that a worker has started (initializer run)."""
    return os.getpid()


class DecodePool:
    """`await pool.decode(body)` gives what `decode_protobuf_partial(body)` gives
    (`decode_json_body(body)` with `json_body=True`)."""

    def __init__(
        self,
        processes: int,
        min_bytes: int = OFFLOAD_MIN_BYTES,
        itl_bounds_ms: tuple[float, ...] = (),
    ) -> None:
        """`itl_bounds_ms`: the store's ITL bucket bounds, for the workers to
        compute the `itl_hist` counts too (empty: the writer computes them)."""
        if processes < 1:
            raise ValueError("a decode pool needs at least one process")
        self.processes = processes
        self.min_bytes = min_bytes
        self.itl_bounds_ms = tuple(itl_bounds_ms)
        self._lock = threading.Lock()
        self._executor: ProcessPoolExecutor | None = None
        self._closed = False
        #: set once a worker of the current pool has started; until then big
        #: exports are decoded in-process
        self._ready = threading.Event()
        self.offloaded = 0
        self.fallbacks = 0
        self.worker_restarts = 0  # pools replaced after a worker died
        self.decoded_while_starting = 0  # big exports decoded in-process: no worker ready yet
        self._failed_starts = 0

    def start(self) -> None:
        """Starts the workers in the background and returns at once; a no-op when
        they are started (or starting) or the pool is closed.  `decode` calls it
        too, so a pool nobody started starts on its first big export."""
        with self._lock:
            if self._closed or self._executor is not None:
                return
            # spawn, not fork: the collector runs gRPC and writer threads, and
            # a forked copy of them is unsafe
            executor = ProcessPoolExecutor(
                self.processes,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker,
                initargs=(os.getpid(), self.itl_bounds_ms),
            )
            self._executor = executor
            self._ready.clear()
            # one task per worker: the pool spawns a process for each task that
            # finds no idle worker, so all of them start now
            futures = [executor.submit(_started) for _ in range(self.processes)]
        for future in futures:
            future.add_done_callback(lambda f: self._on_started(executor, f))

    def _on_started(self, executor: ProcessPoolExecutor, future: Any) -> None:
        if future.cancelled():
            return  # closed or replaced meanwhile
        if future.exception() is None:
            with self._lock:
                if self._executor is executor:
                    self._ready.set()
                    self._failed_starts = 0
            return
        # a worker died starting (killed, out of memory): another pool, a few times;
        # then big exports stay in-process (they are decoded all the same)
        with self._lock:
            if self._executor is not executor or self._closed:
                return  # this pool's other start tasks: counted once
            self._failed_starts += 1
            failed = self._failed_starts
        if failed > MAX_FAILED_STARTS:
            logger.error(
                "tokentrace: decode workers failed to start %d times (%s); decoding in-process",
                failed, future.exception(),
            )
            return
        # not on this thread: it is the dead pool's own manager thread
        threading.Thread(target=self._replace, args=(executor,), daemon=True).start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Starts the workers if need be; True once one is ready (within `timeout`)."""
        self.start()
        return self._ready.wait(timeout)

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
                self._ready.clear()
                self.worker_restarts += 1  # once per broken pool, however many decodes saw it
        broken.shutdown(wait=False, cancel_futures=True)
        self.start()

    async def decode(
        self, body: bytes, json_body: bool = False
    ) -> tuple[list[Span] | list[PackedTrace], Rejected]:
        """Gives the export's spans (a list of `Span`, or of `PackedTrace` when a
        worker decoded it; `Pipeline.offer` takes either) and what was rejected.
        `json_body`: the body is OTLP/JSON, else protobuf."""
        decode_here = decode_json_body if json_body else decode_protobuf_partial
        if len(body) < self.min_bytes:
            return decode_here(body)
        if self._closed:  # never a big body on the event loop
            return await asyncio.to_thread(decode_here, body)
        with self._lock:
            pool = self._executor if self._ready.is_set() else None
        if pool is None:
            self.start()
            self.decoded_while_starting += 1
            return await asyncio.to_thread(decode_here, body)
        try:
            wire, rejected, (dropped, service, capped) = await asyncio.get_running_loop().run_in_executor(
                pool, decode_export, body, json_body
            )
        except BrokenProcessPool:
            # a worker died (OOM killer, kill): decode here, start another pool now
            logger.warning("tokentrace: a decode worker died; decoding in-process, starting another")
            self.fallbacks += 1
            self._replace(pool)
            return await asyncio.to_thread(decode_here, body)
        self.offloaded += 1
        # counted here: the worker's own counts would never reach /metrics
        if dropped:
            note_dropped_steps(dropped, service)
        if capped:
            with _ExportCap.lock:
                _ExportCap.worker_capped += capped
        return unpack(wire), rejected

    def worker_pids(self) -> list[int]:
        """Gives the pids of the running workers (for RSS accounting and tests)."""
        with self._lock:
            executor = self._executor
        processes = getattr(executor, "_processes", None) or {}
        return [p.pid for p in processes.values() if p.pid is not None]

    def close(self) -> None:
        """Stops the workers; later decodes run in-process.  Safe to call twice."""
        with self._lock:
            self._closed = True
            executor, self._executor = self._executor, None
            self._ready.clear()
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
