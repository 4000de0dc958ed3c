"""Relative windows end at the newest request that is not dated in the future.

The collector takes any start time a span carries; one request dated 2200 must not become
the "newest request" that every relative window ("last 24h") ends at, leaving it alone in
the window. Imported old data still shows: a window ends at the newest request, not at now.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from tracegen import GeneratedRequest
from tt_testkit import explorer

from tokentrace.web._overview import FUTURE_SKEW_NS, newest_start_ns

YEAR_2200_NS = 7_258_118_400 * 10**9
NOW_NS = 1_800_000_000 * 10**9


@pytest.fixture(scope="module")
def future(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int, int]]:
    """Serves a copy of the generated database with one more request, dated 2200; gives the
    URL, how many requests were there before, and the newest of their starts."""
    src, _ = generated
    db = tmp_path_factory.mktemp("webdb-future") / "web.duckdb"
    shutil.copy(src, db)
    conn = duckdb.connect(str(db))
    try:
        count, newest = conn.execute("SELECT count(*), max(start_ns) FROM requests").fetchone()  # type: ignore[misc]
        conn.execute(
            "INSERT INTO requests SELECT * REPLACE (? AS start_ns, 'req-from-2200' AS request_id, "
            "'f' || substr(trace_id, 2) AS trace_id, 'bogus' AS model) FROM requests ORDER BY start_ns LIMIT 1",
            [YEAR_2200_NS],
        )
    finally:
        conn.close()
    with explorer(db) as url:
        yield url, count, newest


def _json(url: str) -> Any:
    r = httpx.get(url, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.slow
@pytest.mark.parametrize("window", ["1h", "24h", "7d"])
def test_a_request_dated_2200_leaves_the_relative_windows_to_the_others(future: tuple[str, int, int], window: str) -> None:
    url, count, newest = future
    overview = _json(f"{url}/api/overview?window={window}")
    assert overview["range"]["newest_ns"] == newest and overview["range"]["end_ns"] == newest + 1
    assert overview["report"]["requests"]["count"] == count
    assert _json(f"{url}/api/search?window={window}&limit=1")["total"] == count
    assert _json(f"{url}/api/diagnosis?window={window}")["report"]["requests"]["count"] == count
    rows = httpx.get(f"{url}/api/requests.jsonl?window={window}", timeout=120).text.splitlines()
    assert len(rows) == count


def test_window_all_still_holds_the_request_dated_2200(future: tuple[str, int, int]) -> None:
    url, count, _ = future
    assert _json(f"{url}/api/overview?window=all")["report"]["requests"]["count"] == count + 1


class _Counting:
    """A cursor that counts the statements run through it."""

    def __init__(self, cur: duckdb.DuckDBPyConnection) -> None:
        self.cur, self.statements = cur, 0

    def execute(self, *args: Any) -> Any:
        self.statements += 1
        return self.cur.execute(*args)


def _newest(starts: list[int], now_ns: int = NOW_NS) -> tuple[int | None, int]:
    conn = duckdb.connect()
    try:
        conn.execute("CREATE TABLE requests (start_ns BIGINT)")
        for start in starts:
            conn.execute("INSERT INTO requests VALUES (?)", [start])
        counting = _Counting(conn)
        return newest_start_ns(counting, now_ns=now_ns), counting.statements  # type: ignore[arg-type]
    finally:
        conn.close()


def test_the_newest_start_skips_far_future_requests_in_one_query() -> None:
    old = NOW_NS - 400 * 86_400 * 10**9  # imported data of last year: the window ends there, not now
    assert _newest([old - 10**9, old, YEAR_2200_NS]) == (old, 1)
    # a little clock skew between hosts is no future date
    assert _newest([old, NOW_NS + FUTURE_SKEW_NS - 1]) == (NOW_NS + FUTURE_SKEW_NS - 1, 1)
    assert _newest([old, NOW_NS + FUTURE_SKEW_NS + 1]) == (old, 1)
    # when every request is dated ahead, the newest of them: the window still shows something
    assert _newest([YEAR_2200_NS, YEAR_2200_NS + 5]) == (YEAR_2200_NS + 5, 1)
    assert _newest([]) == (None, 1)
