"""The collector: the store's one write connection, the writer, the sampler and the pipeline.

Wired from `CollectorSettings`; `tokentrace serve` (tokentrace.serve) puts the
OTLP receivers in front of it, `tokentrace import` (tokentrace.file_import)
feeds it files.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from tokentrace.collector.decode_pool import steps_dropped_total
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.retention import Retention
from tokentrace.collector.sampling import P99Tracker, Sampler, SloLimits, parse_rules
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.wal import WriteAheadLog, wal_dir
from tokentrace.collector.wal_metrics import WalMetrics
from tokentrace.collector.writer import Writer
from tokentrace.store.connection import open_db
from tokentrace.store.errors import StoreError
from tokentrace.store.location import resolve_db_path

if TYPE_CHECKING:
    from tokentrace.collector.lake_mover import LakeMover

logger = logging.getLogger("tokentrace.collector")


class Collector:
    """Owns the one write connection and the pipeline in front of it."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.metrics = CollectorMetrics(db=settings.db)
        self.conn = open_db(
            settings.db,
            memory_limit=settings.duckdb_memory_limit,
            checkpoint_threshold=settings.duckdb_checkpoint_threshold,
        )
        try:
            self._wire(settings)
        except BaseException:
            # stop the writer thread and close the file: else the file stays
            # locked, and DuckDB's binding reports leaked objects at exit
            if hasattr(self, "writer"):
                self.writer.close()
            wal = getattr(self, "wal", None)
            if wal is not None:
                wal.close()
            self.conn.close()
            raise
        self._closed = False

    def _wire(self, settings: CollectorSettings) -> None:
        self.writer = Writer(
            self.conn,
            max_pending=settings.max_pending_writes,
            on_write=self.metrics.write_latency.observe,
        )
        self.sampler = Sampler(
            baseline=settings.baseline,
            slo=SloLimits(settings.slo_ttft_ms, settings.slo_e2e_ms, settings.slo_itl_ms),
            rules=parse_rules(settings.keep_rules),
            p99=P99Tracker(min_samples=settings.p99_min_samples, warmup=settings.p99_warmup),
        )
        #: the OTLP write-ahead log (`collector/wal.py`): serve with --wal on (auto: --lake)
        self.wal: WriteAheadLog | None = None
        self.wal_metrics: WalMetrics | None = None
        if settings.wal_on and settings.receivers:
            self.wal_metrics = WalMetrics(self.metrics.registry)
            self.wal = WriteAheadLog(
                wal_dir(resolve_db_path(settings.db)),
                checkpoint=self.writer.wal_from,
                on_sync=self.wal_metrics.on_sync,
            )
        self.pipeline = Pipeline(
            self.writer,
            self.sampler,
            max_buffered_spans=settings.max_buffered_spans,
            max_buffered_bytes=settings.max_buffered_bytes,
            grace_s=settings.grace_s,
            server_wait_s=settings.server_wait_s,
            client_wait_s=settings.client_wait_s,
            decision_wait_s=settings.decision_wait_s,
            metrics=self.metrics,
            wal=self.wal,
        )
        self.metrics.on_scrape(self._refresh_gauges)
        # --retention: deletes old rows on its own cursor (collector/retention.py says why that is safe)
        # --lake: the shard's mover (lake_mover.py); imported only with a lake
        self.lake_mover = self._lake_mover(settings) if settings.lake else None
        self.retention = self._retention(settings)
        if self.retention is not None:
            self.metrics.watch_retention(self.retention)

    def _lake_mover(self, settings: CollectorSettings) -> LakeMover:
        """Gives the mover of this shard's rows into the lake, the lake attached when it can
        be: a lake unreachable at start is retried by the mover, the shard takes exports."""
        from tokentrace.collector.lake_mover import LakeMover
        from tokentrace.store.lake.extensions import load_lake_extensions

        load_lake_extensions(self.conn)  # no extension is no lake: an error at start
        assert settings.lake is not None
        mover = LakeMover(
            self.conn,
            settings.lake,
            settings.lake_data,
            settings.shard_name,
            interval_s=settings.lake_move_interval_s,
            max_unmoved_rows=settings.lake_max_unmoved_rows,
            writer=self.writer,
        )
        try:
            mover.attach()
        except StoreError as exc:
            logger.error("tokentrace lake: %s; the shard takes exports and retries", exc)
        self.pipeline.lake_gate = mover
        self.metrics.watch_lake(mover)
        return mover

    def _retention(self, settings: CollectorSettings) -> Retention | None:
        """Gives the thread that deletes old rows: with a lake, those moved and older than
        the hot window (never before they are moved); else those beyond --retention."""
        if self.lake_mover is not None:
            mover = self.lake_mover
            return Retention(
                self.conn, settings.lake_hot_window_s, moved_through=lambda: mover.moved_seq
            )
        return Retention(self.conn, settings.retention_s) if settings.retention_s else None

    def _refresh_gauges(self) -> None:
        m = self.metrics
        m.buffered_spans.set(self.pipeline.buffered_spans)
        m.buffered_bytes.set(self.pipeline.buffered_bytes)
        m.buffered_traces.set(self.pipeline.buffered_traces)
        m.writer_queue.set(self.writer.pending)
        m.writer_capacity.set(self.writer.capacity)
        m.write_errors.set(self.writer.write_errors)
        m.requests_written.set(self.writer.requests_written)
        m.spans_written.set(self.writer.spans_written)
        m.requests_already_stored.set(self.writer.requests_already_stored)
        m.spans_already_stored.set(self.writer.spans_already_stored)
        m.rows_lost.set(self.pipeline.stats.rows_lost)
        m.engine_steps_dropped.set(steps_dropped_total())
        if self.sampler.p99 is not None:
            m.p99_shared_requests.set(self.sampler.p99.shared_requests)
        if self.wal is not None and self.wal_metrics is not None:
            self.wal_metrics.segments.set(self.wal.segments)
            self.wal_metrics.writable.set(0 if self.wal.error else 1)

    def start(self) -> None:
        if self.wal is not None:  # before the receivers open: what was acknowledged first
            from tokentrace.collector.wal_replay import replay

            replayed = replay(self.wal, self.pipeline, self.writer.wal_from)
            if self.wal_metrics is not None:
                self.wal_metrics.replayed_records.inc(replayed.records)
        self.pipeline.start()
        if self.lake_mover is not None:
            self.lake_mover.start()
        if self.retention is not None:
            self.retention.start()

    def close(self) -> None:
        """Decides and writes everything buffered, then closes the database; runs once."""
        if self._closed:
            return
        self._closed = True
        if self.retention is not None:
            self.retention.close()  # before the writer's final CHECKPOINT
        if self.lake_mover is not None:
            self.lake_mover.stop()
        self.pipeline.close()
        self.writer.close()
        if self.wal is not None:  # everything decided is committed: its segments can go
            self.wal.release(self.writer.wal_from)
            self.wal.close()
        if self.lake_mover is not None:
            self.lake_mover.close()  # a last move, bounded: a restart moves the rest
        self.conn.close()
