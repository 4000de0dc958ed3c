"""The report's ITL histogram from the per-minute rollup (`itl_rollup`, schema 6): the same
counts as summing every request's `itl_hist` row, for every window and slice, whichever rows
the rollup holds; and the rollup really answers where it can (analyzer/itl_window.py)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import duckdb
import pytest
from otlp_traces import request_trace

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.itl_window import bucket_sums, window_itl_counts
from tokentrace.analyzer.report import build_report
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db
from tokentrace.store.schema import ROLLUP_NS

T0 = 1_700_000_000 * 10**9 - 1_700_000_000 * 10**9 % ROLLUP_NS  # a minute's start
SLICES = {
    "service": ("vllm", "tgi"),
    "model": ("llama", "qwen"),
    "tenant": ("acme", "globex", "initech"),
    "traffic_class": ("interactive", "batch"),
}


def _write(conn: duckdb.DuckDBPyConnection, n: int = 600, seed: int = 3) -> None:
    """Writes `n` requests over ~6 minutes through the collector's real writer, in many
    transactions (as exports arrive), each with its own gaps and slice."""
    rng = random.Random(seed)
    template = summarize_trace(request_trace()).requests[0]
    writer = Writer(conn)
    batch = []
    for i in range(n):
        gaps = [rng.lognormvariate(3, 1) for _ in range(rng.randint(0, 40))]
        batch.append(
            dataclasses.replace(
                template,
                trace_id=f"{i:032x}",
                request_id=f"r{i}",
                start_ns=T0 + rng.randrange(6 * ROLLUP_NS),
                itl_gaps_ms=gaps,
                **{k: rng.choice(v) for k, v in SLICES.items()},
            )
        )
        if len(batch) == rng.randint(1, 40):
            assert writer.submit(WriteBatch(requests=batch))
            writer.flush()
            batch = []
    assert writer.submit(WriteBatch(requests=batch))
    writer.flush()
    writer.close()


def _raw(conn: duckdb.DuckDBPyConnection, f: Filters) -> list[int]:
    """Every request's own histogram, summed: what the report read before the rollup."""
    cte, params = f.cte()
    sql = f"{cte} SELECT {bucket_sums('h')} FROM itl_hist h SEMI JOIN req USING (trace_id, request_id)"  # noqa: S608 - fixed sums
    row = conn.execute(sql, params).fetchone()
    return [int(x or 0) for x in row or ()]


WINDOWS = [
    Filters(),
    Filters(start_ns=T0 + ROLLUP_NS, end_ns=T0 + 4 * ROLLUP_NS),  # whole minutes
    Filters(start_ns=T0 + ROLLUP_NS // 3, end_ns=T0 + 4 * ROLLUP_NS + 7),  # cut minutes
    Filters(start_ns=T0 + 2 * ROLLUP_NS + 5, end_ns=T0 + 2 * ROLLUP_NS + ROLLUP_NS // 2),
    Filters(tenant="acme"),
    Filters(model="qwen", traffic_class="batch"),
    Filters(start_ns=T0 + ROLLUP_NS // 2, service="tgi", tenant="globex"),
    Filters(tenant="nobody"),
]


@pytest.fixture
def store(tmp_path: Path) -> duckdb.DuckDBPyConnection:
    conn = open_db(tmp_path / "r.duckdb")
    _write(conn)
    yield conn
    conn.close()


@pytest.mark.parametrize("f", WINDOWS)
def test_rollup_counts_equal_every_requests_own(
    store: duckdb.DuckDBPyConnection, f: Filters
) -> None:
    assert window_itl_counts(store, f) == _raw(store, f)


def test_the_rollup_answers_for_whole_minutes(store: duckdb.DuckDBPyConnection) -> None:
    """With the per-request rows of minutes 1-3 gone, a window of those whole minutes still
    counts their gaps: the rollup answered.  Cut minutes are read from itl_hist."""
    whole = Filters(start_ns=T0 + ROLLUP_NS, end_ns=T0 + 4 * ROLLUP_NS)
    before = window_itl_counts(store, whole)
    assert sum(before) > 0
    store.execute(
        "DELETE FROM itl_hist WHERE start_ns >= ? AND start_ns < ?", [whole.start_ns, whole.end_ns]
    )
    assert window_itl_counts(store, whole) == before
    # a window from inside minute 1: that minute is read from itl_hist (gone: nothing), and
    # minutes 2-3 from the rollup
    cut = Filters(start_ns=T0 + ROLLUP_NS + 1, end_ns=T0 + 4 * ROLLUP_NS)
    later = window_itl_counts(
        store, Filters(start_ns=T0 + 2 * ROLLUP_NS, end_ns=T0 + 4 * ROLLUP_NS)
    )
    assert window_itl_counts(store, cut) == later
    assert 0 < sum(later) < sum(before)


def test_minutes_without_their_whole_rollup_read_each_request(
    store: duckdb.DuckDBPyConnection,
) -> None:
    """A minute whose rollup rows are missing (rows stored before schema 6) or count other
    requests than are stored (a minute retention cut in two) is summed from itl_hist."""
    store.execute("DELETE FROM itl_rollup WHERE minute_ns = ?", [T0 + 2 * ROLLUP_NS])
    store.execute(
        "DELETE FROM requests WHERE start_ns >= ? AND start_ns < ?", [T0, T0 + ROLLUP_NS // 2]
    )
    store.execute(
        "DELETE FROM itl_hist WHERE start_ns >= ? AND start_ns < ?", [T0, T0 + ROLLUP_NS // 2]
    )
    for f in WINDOWS:
        assert window_itl_counts(store, f) == _raw(store, f), f
    store.execute("DELETE FROM itl_rollup")  # a file of schema 5's rows only
    for f in WINDOWS:
        assert window_itl_counts(store, f) == _raw(store, f), f


def test_the_report_histogram_is_the_same_with_and_without_the_rollup(
    store: duckdb.DuckDBPyConnection,
) -> None:
    with_rollup = build_report(store)
    store.execute("DELETE FROM itl_rollup")
    without = build_report(store)
    assert with_rollup["itl_histogram"] == without["itl_histogram"] and with_rollup["itl_histogram"]
    assert with_rollup["latency"]["itl"] == without["latency"]["itl"]


def test_the_writer_sums_each_transactions_minutes_and_slices(
    store: duckdb.DuckDBPyConnection,
) -> None:
    rows = store.execute(
        "SELECT count(*), sum(requests) FROM itl_rollup",
    ).fetchone()
    assert rows is not None and rows[1] == 600 and rows[0] < 600  # several requests a row
    mismatched = store.execute(
        "SELECT count(*) FROM (SELECT commit_seq, start_ns - start_ns % $r AS m, service, model, tenant,"
        " traffic_class, count(*) AS n FROM requests GROUP BY ALL) q"
        " FULL JOIN itl_rollup r ON q.commit_seq = r.commit_seq AND q.m = r.minute_ns"
        " AND q.service = r.service AND q.model = r.model AND q.tenant = r.tenant"
        " AND q.traffic_class = r.traffic_class"
        " WHERE q.n IS DISTINCT FROM r.requests",
        {"r": ROLLUP_NS},
    ).fetchone()
    assert mismatched == (0,)


def test_a_file_older_than_the_rollup_is_read_as_before(store: duckdb.DuckDBPyConnection) -> None:
    """A report reads a schema-5 file read-only, unmigrated: it has no itl_rollup table."""
    want = [_raw(store, f) for f in WINDOWS]
    store.execute("DROP TABLE itl_rollup")
    assert [window_itl_counts(store, f) for f in WINDOWS] == want
