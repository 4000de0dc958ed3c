"""/metrics families whose values another part keeps: read at each scrape, never
tallied twice.  The pipeline's counts (`PipelineStats`), the writer's row totals,
the retention thread's passes, a shard's moves into the lake, the database file's size."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tokentrace.collector.pipeline_stats import PipelineStats


class RetentionState(Protocol):
    @property
    def deleted_total(self) -> dict[str, int]: ...

    @property
    def last_pass_s(self) -> float | None: ...

    @property
    def failed_passes(self) -> int: ...


class RetentionPasses:
    """The retention thread's own totals, read at each scrape: rows deleted per
    table and passes that failed (counters), and when the last pass completed (a
    gauge; no sample before the first).  An alert on failures, or on the last
    pass's age, catches passes that keep failing: each failure is logged, but the
    file then grows without bound."""

    def __init__(self, retention: RetentionState) -> None:
        self._retention = retention

    def describe(self) -> list[Metric]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily]:
        return (
            CounterMetricFamily(
                "tokentrace_retention_deleted",
                "rows deleted by --retention because they were older than the retention, per table",
                labels=["table"],
            ),
            CounterMetricFamily(
                "tokentrace_retention_failed_passes",
                "--retention passes that failed (each is logged and retried at the next pass)",
            ),
            GaugeMetricFamily(
                "tokentrace_retention_last_run_timestamp_seconds",
                "unix time at which the last --retention pass completed (a failed pass does not move it)",
            ),
        )

    def collect(self) -> Iterator[Metric]:
        deleted, failed, last_run = self._families()
        for table, rows in list(self._retention.deleted_total.items()):
            deleted.add_metric([table], rows)
        failed.add_metric([], self._retention.failed_passes)
        last = self._retention.last_pass_s
        if last is not None:
            last_run.add_metric([], last)
        yield deleted
        yield failed
        yield last_run


class LakeState(Protocol):
    @property
    def rows_moved_total(self) -> int: ...

    @property
    def unmoved_rows(self) -> int: ...

    @property
    def moves_total(self) -> int: ...

    @property
    def moves_failed_total(self) -> int: ...

    @property
    def last_move_s(self) -> float | None: ...

    @property
    def last_move_seconds(self) -> float | None: ...

    @property
    def reachable(self) -> bool: ...


class LakeMoves:
    """A shard's moves into the lake (`collector/lake_mover.py`), read at each scrape.
    An alert on `tokentrace_lake_reachable == 0`, or on the last move's age, catches a
    lake that is down before the shard reaches its unmoved-rows bound and refuses exports."""

    def __init__(self, lake: LakeState) -> None:
        self._lake = lake

    def describe(self) -> list[Metric]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[
        CounterMetricFamily, CounterMetricFamily, CounterMetricFamily, GaugeMetricFamily,
        GaugeMetricFamily, GaugeMetricFamily, GaugeMetricFamily,
    ]:  # fmt: skip
        return (
            CounterMetricFamily(
                "tokentrace_lake_rows_moved", "rows this shard moved into the lake"
            ),
            CounterMetricFamily("tokentrace_lake_moves", "moves into the lake that committed"),
            CounterMetricFamily(
                "tokentrace_lake_moves_failed",
                "move attempts that failed (the lake unreachable or refusing; retried with a backoff)",
            ),
            GaugeMetricFamily(
                "tokentrace_lake_unmoved_rows",
                "rows in the local file that the lake does not hold yet (beyond "
                "lake_max_unmoved_rows receivers answer 503)",
            ),
            GaugeMetricFamily(
                "tokentrace_lake_last_move_timestamp_seconds",
                "unix time of the last successful move (or of the last check that found nothing to move)",
            ),
            GaugeMetricFamily(
                "tokentrace_lake_last_move_seconds", "how long the last committed move took"
            ),
            GaugeMetricFamily(
                "tokentrace_lake_reachable", "1 while moves succeed, 0 while they fail"
            ),
        )

    def collect(self) -> Iterator[Metric]:
        lake = self._lake
        moved, moves, failed, unmoved, last, took, reachable = self._families()
        moved.add_metric([], lake.rows_moved_total)
        moves.add_metric([], lake.moves_total)
        failed.add_metric([], lake.moves_failed_total)
        unmoved.add_metric([], lake.unmoved_rows)
        if lake.last_move_s is not None:
            last.add_metric([], lake.last_move_s)
        if lake.last_move_seconds is not None:
            took.add_metric([], lake.last_move_seconds)
        reachable.add_metric([], 1.0 if lake.reachable else 0.0)
        yield from (moved, moves, failed, unmoved, last, took, reachable)


class PipelineCounts:
    """The pipeline's counters, read from its `PipelineStats` at each scrape: traces
    decided by outcome and reason, evicted early, late and duplicate spans, requests
    summarized.  A labelled series appears once its count is above 0, as a
    `Counter`'s child does once incremented."""

    def __init__(self) -> None:
        self.stats = PipelineStats()

    def describe(self) -> list[Metric]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[
        CounterMetricFamily, CounterMetricFamily, CounterMetricFamily, CounterMetricFamily,
        CounterMetricFamily,
    ]:  # fmt: skip
        return (
            CounterMetricFamily(
                "tokentrace_traces", "traces decided, by outcome and reason", labels=["kept", "reason"]
            ),
            CounterMetricFamily(
                "tokentrace_traces_evicted_early",
                "traces decided before their root ended because the buffer was nearly full",
            ),
            CounterMetricFamily(
                "tokentrace_late_spans", "spans arriving after their trace was decided", labels=["kept"]
            ),
            CounterMetricFamily(
                "tokentrace_duplicate_spans",
                "spans dropped because their trace already held that span id (an exporter's retry), "
                "while buffered or after the trace was kept",
                labels=["when"],
            ),
            CounterMetricFamily(
                "tokentrace_requests_summarized",
                "request summaries made at decision time, kept or not (counted before the write: "
                "includes summaries whose rows the writer later dropped)",
            ),
        )

    def collect(self) -> Iterator[Metric]:
        stats = self.stats
        traces, evicted, late, duplicates, summarized = self._families()
        for (keep, reason), n in list(stats.decided.items()):
            traces.add_metric([str(keep).lower(), reason], n)
        evicted.add_metric([], stats.traces_evicted_early)
        for kept, n in (("true", stats.late_spans_kept), ("false", stats.late_spans_dropped)):
            if n:
                late.add_metric([kept], n)
        for when, n in (
            ("buffered", stats.duplicate_spans_dropped),
            ("late", stats.late_duplicates_dropped),
        ):
            if n:
                duplicates.add_metric([when], n)
        summarized.add_metric([], stats.requests_summarized)
        yield traces
        yield evicted
        yield late
        yield duplicates
        yield summarized


class RunningTotal:
    """A counter whose value is a running total kept elsewhere (the writer's
    row counts): `set(total)` before a scrape, exposed as `<name>_total` of
    type counter.  The total must only grow, as a counter's does."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self._value = 0.0
        registry.register(self)

    def set(self, total: float) -> None:
        self._value = float(total)

    def get(self) -> float:
        return self._value

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(self.name, self.documentation)]

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(self.name, self.documentation, value=self._value)


class StoreFiles:
    """The database file's and its WAL's sizes, `os.stat` at each scrape.  No
    WAL file (everything checkpointed) is 0 bytes; a database file that cannot
    be read gives no sample."""

    def __init__(self, db: str | os.PathLike[str]) -> None:
        self.db = os.fspath(db)

    def describe(self) -> list[Metric]:
        return list(self._families())

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily("tokentrace_db_size_bytes", "size of the DuckDB database file"),
            GaugeMetricFamily("tokentrace_db_wal_size_bytes", "size of the DuckDB write-ahead log (<db>.wal)"),
        )

    def collect(self) -> Iterator[Metric]:
        db, wal = self._families()
        try:
            db.add_metric([], os.stat(self.db).st_size)
        except OSError:
            pass
        try:
            wal.add_metric([], os.stat(self.db + ".wal").st_size)
        except FileNotFoundError:
            wal.add_metric([], 0)
        except OSError:
            pass
        yield db
        yield wal


