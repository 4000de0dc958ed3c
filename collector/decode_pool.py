"""Protobuf trace exports decoded in worker processes.

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
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import pickle
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import fields
from operator import attrgetter
from typing import Any

from tokentrace.analyzer.attribution import TraceResult, summarize_trace
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.spans import KIND_SERVER, STATUS_ERROR, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.gc_tuning import tune_for_ingest
from tokentrace.collector.itl_hist import itl_histograms
from tokentrace.collector.otlp import Rejected, decode_protobuf_partial
from tokentrace.collector.packed import PackedTrace

logger = logging.getLogger("tokentrace.collector")

#: Exports smaller than this are decoded in-process (round trip > decode).
OFFLOAD_MIN_BYTES = 64 * 1024

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


def decode_export(body: bytes) -> tuple[list[WireTrace], Rejected]:
    """Runs in the worker: the export's valid spans grouped by trace (first-seen
    order, spans in export order) and packed, each with its summary as if the
    export held the whole trace; and what was rejected.  Raises OtlpDecodeError
    for a body that is not an export, like the in-process path."""
    spans, rejected = decode_protobuf_partial(body)
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
    return out, rejected


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


class DecodePool:
    """`await pool.decode(body)` gives what `decode_protobuf_partial(body)` gives."""

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
        self.offloaded = 0
        self.fallbacks = 0
        self.worker_restarts = 0  # pools replaced after a worker died

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                # spawn, not fork: the collector runs gRPC and writer threads, and
                # a forked copy of them is unsafe.  Workers start on first use.
                self._executor = ProcessPoolExecutor(
                    self.processes,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_init_worker,
                    initargs=(os.getpid(), self.itl_bounds_ms),
                )
            return self._executor

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._executor is broken:
                self._executor = None
                self.worker_restarts += 1  # once per broken pool, however many decodes saw it
        broken.shutdown(wait=False, cancel_futures=True)

    async def decode(self, body: bytes) -> tuple[list[Span] | list[PackedTrace], Rejected]:
        """Gives the export's spans (a list of `Span`, or of `PackedTrace` when a
        worker decoded it; `Pipeline.offer` takes either) and what was rejected."""
        if self._closed or len(body) < self.min_bytes:
            return decode_protobuf_partial(body)
        pool = self._pool()
        try:
            wire, rejected = await asyncio.get_running_loop().run_in_executor(
                pool, decode_export, body
            )
        except BrokenProcessPool:
            # a worker died (OOM killer, kill): decode here, start a new pool next time
            logger.warning("tokentrace: a decode worker died; decoding in-process")
            self.fallbacks += 1
            self._replace(pool)
            return decode_protobuf_partial(body)
        self.offloaded += 1
        return unpack(wire), rejected

    def worker_pids(self) -> list[int]:
        """Gives the pids of the running workers (for RSS accounting and tests)."""
        with self._lock:
            executor = self._executor
        processes = getattr(executor, "_processes", None) or {}
        return [p.pid for p in processes.values() if p.pid is not None]

    def close(self) -> None:
        """Stops the workers; later decodes run in-process.  Safe to call twice."""
        self._closed = True
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True, cancel_futures=True)
