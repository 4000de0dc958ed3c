"""The collector process: store, writer, sampler and pipeline wired from settings."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokentrace.collector.gc_tuning import tune_for_ingest
from tokentrace.collector.grpc_receiver import start_grpc_server
from tokentrace.collector.http_receiver import create_http_app
from tokentrace.collector.otlp import OtlpDecodeError, decode_json, decode_protobuf
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.sampling import P99Tracker, Sampler, SloLimits, parse_rules
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.writer import Writer
from tokentrace.store.connection import open_db

logger = logging.getLogger("tokentrace.collector")


class Collector:
    """Owns the one write connection and the pipeline in front of it."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.metrics = CollectorMetrics()
        self.conn = open_db(settings.db)
        self.writer = Writer(
            self.conn,
            max_pending=settings.max_pending_writes,
            on_write=self.metrics.write_latency.observe,
        )
        self.sampler = Sampler(
            baseline=settings.baseline,
            slo=SloLimits(settings.slo_ttft_ms, settings.slo_e2e_ms, settings.slo_itl_ms),
            rules=parse_rules(settings.keep_rules),
            p99=P99Tracker(min_samples=settings.p99_min_samples),
        )
        self.pipeline = Pipeline(
            self.writer,
            self.sampler,
            max_buffered_spans=settings.max_buffered_spans,
            grace_s=settings.grace_s,
            decision_wait_s=settings.decision_wait_s,
            metrics=self.metrics,
        )
        self.metrics.on_scrape(self._refresh_gauges)
        self._closed = False

    def _refresh_gauges(self) -> None:
        m = self.metrics
        m.buffered_spans.set(self.pipeline.buffered_spans)
        m.buffered_traces.set(self.pipeline.buffered_traces)
        m.writer_queue.set(self.writer.pending)
        m.write_errors.set(self.writer.write_errors)
        m.requests_written.set(self.writer.requests_written)
        m.spans_written.set(self.writer.spans_written)

    def start(self) -> None:
        self.pipeline.start()

    def close(self) -> None:
        """Decides and writes everything buffered, then closes the database; runs once."""
        if self._closed:
            return
        self._closed = True
        self.pipeline.close()
        self.writer.close()
        self.conn.close()


def read_otlp_file(path: Path) -> list[Any]:
    """Gives the spans in one OTLP file: protobuf, JSON, or JSON lines (one export per line)."""
    data = path.read_bytes()
    if path.suffix in (".json", ".jsonl", ".ndjson") or data[:1] in (b"{", b"["):
        text = data.decode("utf-8")
        try:
            docs = [json.loads(text)]
        except json.JSONDecodeError:
            docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        spans = []
        for doc in docs:
            for d in doc if isinstance(doc, list) else [doc]:
                spans.extend(decode_json(d))
        return spans
    return decode_protobuf(data)


def import_files(settings: CollectorSettings, paths: Iterable[Path]) -> dict[str, int]:
    """Runs OTLP files through the same pipeline as `serve`; gives counts."""
    paths = list(paths)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no such file: {p}")
    collector = Collector(settings)
    files = spans = 0
    try:
        for p in paths:
            try:
                found = read_otlp_file(p)
            except (OtlpDecodeError, ValueError) as exc:
                raise OtlpDecodeError(f"{p}: {exc}") from exc
            while not collector.pipeline.add(found):
                collector.pipeline.decide_ready(force=True)
            files += 1
            spans += len(found)
        collector.pipeline.decide_ready(force=True)
        stats = collector.pipeline.stats
        return {
            "files": files,
            "spans": spans,
            "requests": stats.requests_summarized,
            "kept_traces": stats.traces_kept,
        }
    finally:
        collector.close()


def _quiet_server_class() -> type:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """A uvicorn server that leaves SIGTERM/SIGINT to the collector.

        Each uvicorn server would otherwise capture the signals itself and
        re-raise them on exit; the collector must instead stop every server
        together and then decide and flush what is buffered.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            return None

    return QuietServer


async def _serve(settings: CollectorSettings, ready: Any = None) -> None:
    import uvicorn

    collector = Collector(settings)
    collector.start()
    grpc_server, grpc_port = start_grpc_server(
        collector.pipeline, settings.host, settings.grpc_port, settings.max_body_bytes,
        collector.metrics,
    )  # fmt: skip
    apps: list[tuple[Any, int]] = [
        (
            create_http_app(collector.pipeline, settings.max_body_bytes, collector.metrics),
            settings.http_port,
        )
    ]
    try:
        from tokentrace.web.app import create_web_app
    except ImportError:  # the web explorer is optional at this layer
        create_web_app = None  # type: ignore[assignment]
    if create_web_app is not None:
        apps.append((create_web_app(settings, collector), settings.web_port))
    _QuietServer = _quiet_server_class()
    servers = [
        _QuietServer(
            uvicorn.Config(app, host=settings.host, port=port, log_level="warning", lifespan="off")
        )
        for app, port in apps
    ]
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
        except (NotImplementedError, RuntimeError):
            pass
    tasks = [asyncio.create_task(s.serve()) for s in servers]
    try:
        while not all(s.started for s in servers):
            if any(t.done() for t in tasks):
                for t in tasks:
                    if t.done() and t.exception():
                        raise t.exception()  # type: ignore[misc]
                raise RuntimeError("a server stopped during start-up")
            await asyncio.sleep(0.02)
        logger.info(
            "tokentrace serving: OTLP/HTTP %s:%d, OTLP/gRPC %s:%d, web %s:%d, db %s",
            settings.host,
            settings.http_port,
            settings.host,
            grpc_port,
            settings.host,
            settings.web_port,
            settings.db,
        )
        restore_gc = tune_for_ingest()
        if ready is not None:
            ready()
        try:
            await stop.wait()
        finally:
            restore_gc()
    finally:
        # stop taking data first (gRPC lets in-flight exports finish), then
        # decide and flush everything buffered
        grpc_server.stop(grace=5).wait(10)
        for s in servers:
            s.should_exit = True
        await asyncio.gather(*tasks, return_exceptions=True)
        collector.close()


def serve(settings: CollectorSettings, ready: Any = None) -> None:
    """Runs the collector until SIGTERM/SIGINT, then decides and flushes everything."""
    asyncio.run(_serve(settings, ready))
