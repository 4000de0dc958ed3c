"""Values as long as a sender cares to write them: the pages and the search's paging stay bounded.

A request id, model or tenant is whatever a span carried: 100,000 characters, or 1,000
non-ASCII ones. The next-page cursor no longer carries such a value (it grew to 140 KB and
uvicorn answered a bare 400), and the pages show at most MAX_SHOWN_CHARS of a value, saying
how long it is and where the whole of it is.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import duckdb
import httpx
import pytest
from hostile import PAYLOADS
from markupsafe import escape
from tracegen import generate
from tt_testkit import explorer
from web_testkit import HostileServer

from tokentrace.web._format import MAX_SHOWN_CHARS, clip_note
from tokentrace.web._params import _MAX_CURSOR

#: How many requests the paging database holds.
PAGED = 9


@pytest.fixture(scope="module")
def long_ids(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """A database whose request ids are 1,000 non-ASCII characters or 105,000 ASCII ones, and whose
    models and tenants are 100,000 characters each, alike in their first thousands."""
    db, _ = generate(tmp_path_factory.mktemp("webdb-long-ids"), count=PAGED, evil=False)
    with duckdb.connect(str(db)) as conn:
        conn.execute("UPDATE requests SET request_id = repeat('é', 1000) || request_id WHERE request_id < 'req-0004'")
        conn.execute("UPDATE requests SET request_id = repeat('r', 105000) || request_id WHERE request_id LIKE 'req-%'")
        conn.execute(
            "UPDATE requests SET model = repeat('ü', 100000) || right(request_id, 1), tenant = repeat('W', 100000)"
        )
    return db, PAGED


@pytest.mark.slow
@pytest.mark.parametrize("sort,order", [("start_ns", "desc"), ("e2e_ms", "asc"), ("model", "asc"), ("tenant", "desc")])
def test_next_page_cursors_stay_small_whatever_the_ids_and_values(
    long_ids: tuple[Path, int], sort: str, order: str
) -> None:
    db, count = long_ids
    seen: list[tuple[str, str]] = []
    cursors: list[int] = []
    with explorer(db) as url, httpx.Client(base_url=url, timeout=60) as client:
        params: dict[str, str] = {"sort": sort, "order": order, "limit": "1"}
        for _ in range(count + 2):
            r = client.get("/api/search", params=params)
            assert r.status_code == 200, r.text[:300]
            page = r.json()
            seen.extend((row["trace_id"], row["request_id"]) for row in page["rows"])
            if page["next"] is None:
                break
            cursors.append(len(page["next"]["after"]))
            params = page["next"]
    assert len(seen) == len(set(seen)) == count
    # the cursor no longer carries the row's request id: ~100 characters by a number; by a text
    # column, its first SORT_PREFIX_CHARS characters (~600 of these two-byte ones), under the bound
    numeric = sort.endswith(("_ns", "_ms"))
    assert cursors and max(cursors) <= (200 if numeric else _MAX_CURSOR)


def test_the_next_page_link_walks_every_request(long_ids: tuple[Path, int]) -> None:
    """The page's own link: its cursor was refused once ~1,000 non-ASCII characters made it
    longer than the bound the app itself sets on `after`."""
    db, count = long_ids
    rows = 0
    with explorer(db) as url, httpx.Client(base_url=url, timeout=60) as client:
        path = "/search?sort=model&order=asc&limit=2"
        for _ in range(count):
            r = client.get(path)
            assert r.status_code == 200, r.text[:300]
            rows += r.text.count('class="trace-link"')
            found = re.search(r'id="next-page" href="([^"]+)"', r.text)
            if found is None:
                break
            path = html.unescape(found.group(1))
            assert len(path) < 1_000
    assert rows == count


def _runs(page: str, char: str) -> int:
    """Gives the longest run of `char` in `page`."""
    return max((len(m) for m in re.findall(f"{re.escape(char)}+", page)), default=0)


@pytest.mark.slow
def test_pages_show_at_most_a_kilobyte_of_a_value_and_say_how_long_it_is(hostile: HostileServer) -> None:
    long = next(t for t in hostile.traces if t.payload_name == "long")
    run = len(PAYLOADS["long"]) - len(PAYLOADS["long"].lstrip("L"))
    with httpx.Client(base_url=hostile.url, timeout=60) as client:
        for path in ("/", "/search", "/search?sort=model&order=asc", "/diagnosis", f"/trace/{long.trace_id}"):
            page = client.get(path).text
            # the value was on the page whole, once per place it shows (39 times on the reviewer's
            # trace page): now its first MAX_SHOWN_CHARS characters at most, in the HTML and the
            # span-details block alike
            assert 0 < _runs(page, "L") <= MAX_SHOWN_CHARS < run, path
        trace = client.get(f"/trace/{long.trace_id}").text
        assert escape(clip_note(len(PAYLOADS["long"]))) in trace  # the request's model, tenant, …
        assert escape(clip_note(len(long.request_id))) in trace
        assert escape(clip_note(len(PAYLOADS["long"]))) in client.get("/search").text
        # scripts still get the values whole from the JSON twins
        rows = client.get("/api/search", params={"limit": "500"}).json()["rows"]
        assert PAYLOADS["long"] in {row["model"] for row in rows}


#: Two request ids whose DuckDB `hash` is the same (its string hash is unkeyed: a sender can
#: make such pairs; a reviewer's, found in ~100 tries).
COLLIDING_IDS = ("req-victim-00001-request", "req-qe21im-0QhV6-request")


@pytest.fixture(scope="module")
def tied_rows(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tuple[str, str]]]:
    """A database where the keyset cannot tell rows apart: one request stored twice (a re-sent
    export), and two requests of one trace whose ids' hashes collide, with the same E2E."""
    db, _ = generate(tmp_path_factory.mktemp("webdb-tied"), count=PAGED, evil=False)
    with duckdb.connect(str(db)) as conn:
        (tid, rid), (_, other) = conn.execute("SELECT trace_id, request_id FROM requests ORDER BY request_id LIMIT 2").fetchall()
        conn.execute("INSERT INTO requests SELECT * FROM requests WHERE request_id = ?", [rid])
        conn.execute("UPDATE requests SET request_id = ?, trace_id = ?, e2e_ms = 1234.5 WHERE request_id = ?", [COLLIDING_IDS[0], tid, other])
        conn.execute("INSERT INTO requests SELECT * REPLACE (? AS request_id) FROM requests WHERE request_id = ?", [COLLIDING_IDS[1], COLLIDING_IDS[0]])
        collide = conn.execute("SELECT hash(?) = hash(?)", list(COLLIDING_IDS)).fetchall()[0][0]
        everything = sorted(conn.execute("SELECT trace_id, request_id FROM requests").fetchall())
    if not collide:
        pytest.fail("this DuckDB hashes the two ids apart: find another colliding pair")
    return db, everything


@pytest.mark.slow
@pytest.mark.parametrize("sort,order", [("e2e_ms", "desc"), ("start_ns", "asc"), ("model", "asc")])
def test_paging_one_row_at_a_time_skips_no_row_the_keyset_cannot_tell_apart(
    tied_rows: tuple[Path, list[tuple[str, str]]], sort: str, order: str
) -> None:
    db, everything = tied_rows
    seen: list[tuple[str, str]] = []
    with explorer(db) as url, httpx.Client(base_url=url, timeout=60) as client:
        params: dict[str, str] = {"sort": sort, "order": order, "limit": "1"}
        for _ in range(len(everything) + 1):
            page = client.get("/api/search", params=params).json()
            seen += [(row["trace_id"], row["request_id"]) for row in page["rows"]]
            if page["next"] is None:
                break
            params = {k: str(v) for k, v in page["next"].items()}
    assert sorted(seen) == everything


def test_a_cursor_holding_a_lone_surrogate_is_refused_not_a_500(long_ids: tuple[Path, int]) -> None:
    import base64
    import json

    raw = json.dumps(["\ud800", "a" * 32, 1])  # JSON can say it; UTF-8 cannot
    cursor = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    with explorer(long_ids[0]) as url, httpx.Client(base_url=url, timeout=60) as client:
        for path in ("/api/search", "/search"):
            r = client.get(path, params={"sort": "model", "after": cursor})
            assert r.status_code == 400, (path, r.status_code, r.text[:300])


def test_a_list_summary_keeps_its_ends_short() -> None:
    from tokentrace.web._long_values import ITEM_CHARS, MAX_LIST_VALUES, bounded

    summary = bounded("some.list", ["x" * 100_000] * (MAX_LIST_VALUES + 1), "ab" * 16)
    # ten 100 KB texts rode along whole in /api/trace
    assert summary["count"] == MAX_LIST_VALUES + 1
    assert all(len(v) <= ITEM_CHARS + 1 for v in [*summary["first"], *summary["last"]])
