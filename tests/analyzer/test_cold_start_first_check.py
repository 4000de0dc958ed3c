"""cold_start's first check (diag_cold_first) held to the full computation.

diag_cold_start flagged every request cold or warm (`cold_requests`) and took the median wait
of every warm one (0.7 CPU-s at 10 M requests, 2.7 over a lake).  The first check finds the
cold side alone (`cold_set`: from the few requests that can be cold) and counts the warm waits
above a bar drawn from the cold median; `detect` runs diag_cold_start only where the counts
cannot rule the finding out.  diag_cold_start and affected_cold_start read `cold_set` too.
All are held here to `cold_requests`' flag on every request, and `detect` to itself without
the first check, on windows drawn at random with the edges that matter: requests tied at an
instance's first instant (the least ids pick its first), instances that start at the same
instant, one instance or several, two services, requests with no instance, the SDK's marks,
engine start-ups (one of an instance the window does not show), waits from the client's TTFT
or the E2E where the server's is missing, and a window that starts after the traffic did.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import cold_start
from tokentrace.analyzer.diagnosis._base import INSIDE, Context, compose
from tokentrace.analyzer.filters import Filters
from tokentrace.store.connection import open_db

from .alike import findings_alike
from .requests_rows import insert_requests

T0_NS = 1_750_000_000 * 10**9
MS = 10**6
FIRST_ARGS = [
    cold_start.AFTER_START_NS,
    cold_start.MIN_INSTANCES,
    cold_start.MIN_RATIO * INSIDE,
    cold_start.MIN_GAIN_MS * INSIDE,
]
FULL_ARGS = [cold_start.AFTER_START_NS, cold_start.MIN_INSTANCES]

#: One request: service, instance, trace id, start (ms from T0), server TTFT (None: missing),
#: client TTFT (None: missing), E2E (ms), the SDK's cold mark.
Row = tuple[str, str, str, int, float | None, float | None, float, bool]
#: One engine start-up: service, instance, start and end (ms from T0).
Start = tuple[str, str, int, int]


def _write(path: Path, rows: list[Row], starts: list[Start]) -> duckdb.DuckDBPyConnection:
    conn = open_db(path)
    cols = list(zip(*rows, strict=True))
    insert_requests(
        conn,
        {
            "service": cols[0],
            "instance": cols[1],
            "trace_id": cols[2],
            "start_ns": [T0_NS + t * MS for t in cols[3]],
            "ttft_ms": cols[4],
            "ttft_client_ms": cols[5],
            "e2e_ms": cols[6],
            "cold_start": cols[7],
        },
        {
            "tpot_ms": "20.0",
            "queue_ms": "1.0",
            "prefill_ms": "1.0",
            "queue_wait_ms": "1.0",
            "kept": "i % 3 = 0",
        },
    )
    for k, (service, instance, start, end) in enumerate(starts):
        conn.execute(
            "INSERT INTO engine_starts (trace_id, service, instance, start_ns, end_ns, phases) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [f"start{k}", service, instance, T0_NS + start * MS, T0_NS + end * MS, "{}"],
        )
    return conn


def _window(rng: random.Random, cold_factor: float) -> tuple[list[Row], list[Start]]:
    """A window of ten minutes drawn at random: one to four instances (of one service or two),
    each with a few requests tied at its first instant now and then, requests with no instance,
    SDK marks, engine start-ups; the requests a cold start touches wait `cold_factor` times
    longer, and 300 ms more where it is above 1."""
    services = ["svc", "other"] if rng.random() < 0.3 else ["svc"]
    instances = [(rng.choice(services), f"i{k}") for k in range(rng.randint(1, 4))]
    starts: list[Start] = []
    for service, instance in instances:
        if rng.random() < 0.35:
            begin = rng.randrange(-20_000, 120_000)
            starts.append((service, instance, begin, begin + rng.randrange(0, 20_000)))
    if rng.random() < 0.2:
        starts.append(("svc", "gone", 0, 10_000))  # an instance the window does not show
    rows: list[Row] = []

    def add(service: str, instance: str, t: int, slow: bool, marked: bool = False) -> None:
        wait = rng.lognormvariate(5.5, 0.4)
        if slow and cold_factor > 1:
            wait = wait * cold_factor + 300.0
        missing = rng.random()
        server = None if missing < 0.2 else wait
        client = None if missing < 0.1 else wait + 5.0
        trace_id = f"{rng.getrandbits(128):032x}"
        rows.append((service, instance, trace_id, t, server, client, wait + 100.0, marked))

    firsts: list[int] = []
    for service, instance in instances:
        # now and then at another instance's first instant: warm requests at a cold instant
        first = rng.choice(firsts) if firsts and rng.random() < 0.3 else rng.randrange(0, 30_000)
        firsts.append(first)
        for _ in range(rng.choice([1, 1, 2, 3])):  # ties at the first instant
            add(service, instance, first, slow=True)
        for _ in range(rng.choice([5, 15, 60, 200])):
            t = rng.randrange(first + 1, 600_000)
            in_start = any(
                (s, i) == (service, instance) and b <= t <= e + cold_start.AFTER_START_NS // MS
                for s, i, b, e in starts
            )
            marked = rng.random() < 0.02
            add(service, instance, t, slow=in_start or marked, marked=marked)
    for _ in range(rng.randint(0, 3)):
        add("svc", "", rng.randrange(0, 600_000), slow=rng.random() < 0.5)
    return rows, starts


def _filters(rng: random.Random) -> Filters:
    """The whole window, or one that starts after the traffic did, or one service's."""
    pick = rng.random()
    if pick < 0.2:
        return Filters(start_ns=T0_NS + 20_000 * MS)
    if pick < 0.3:
        return Filters(service="svc")
    return Filters()


SEEDS = range(40)
FACTORS = [1.0, 1.5, 2.5, 4.0, 12.0]


def _drawn(tmp_path: Path, seed: int) -> Context:
    rng = random.Random(seed)
    rows, starts = _window(rng, FACTORS[seed % len(FACTORS)])
    return Context(_write(tmp_path / f"w{seed}.duckdb", rows, starts), _filters(rng))


#: diag_cold_start as it read `cold_requests`' flag on every request (before `cold_set`)
FLAGGED_SIDES = """
WITH {cold_requests},
r AS (
    SELECT *, coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait FROM cold_req
)
SELECT cold, count(*) AS n, median(wait) AS wait_p50,
       count(DISTINCT (service, instance)) FILTER (WHERE cold) AS instances,
       count(*) FILTER (WHERE cold_start) AS marked,
       count(*) FILTER (WHERE after_start) AS after_start, sum(e2e_ms) AS e2e_total
FROM r GROUP BY cold
"""


def _flagged_sides(ctx: Context) -> dict[bool, dict[str, Any]]:
    """Gives the cold and the warm side as `cold_requests`' flag on every request makes them."""
    cur = ctx.conn.execute(
        compose(ctx.cte, queries.include(FLAGGED_SIDES)), [*ctx.params, *FULL_ARGS]
    )
    cols = [d[0] for d in cur.description or []]
    return {r[0]: dict(zip(cols, r, strict=True)) for r in cur.fetchall()}


def _warm_counts(ctx: Context, bar: float | None) -> tuple[int, int]:
    """Counts the warm waits, and those above `bar` (NaN not), as cold_requests flags them."""
    sql = queries.include(
        "WITH {cold_requests}\n"
        "SELECT count(wait), count_if(wait > ? AND NOT isnan(wait)) FROM ("
        "SELECT coalesce(ttft_ms, ttft_client_ms, e2e_ms) AS wait FROM cold_req WHERE NOT cold)"
    )
    [(waits, above)] = ctx.conn.execute(
        compose(ctx.cte, sql), [*ctx.params, *FULL_ARGS, bar]
    ).fetchall()
    return waits, above


@pytest.mark.parametrize("seed", SEEDS)
def test_the_first_checks_cold_side_is_the_full_querys(tmp_path: Path, seed: int) -> None:
    ctx = _drawn(tmp_path, seed)
    full = _flagged_sides(ctx)
    first = ctx.one("diag_cold_first", FIRST_ARGS)
    cold, warm = full.get(True), full.get(False)
    assert first["cold_n"] == (cold["n"] if cold else 0)
    assert first["warm_n"] == (warm["n"] if warm else 0)
    if cold:
        assert first["cold_wait_p50"] == cold["wait_p50"]
        assert first["cold_instances"] == cold["instances"]
    assert (first["warm_waits"], first["warm_above"]) == _warm_counts(ctx, first["bar"])


@pytest.mark.parametrize("seed", SEEDS)
def test_the_affected_cold_requests_are_those_cold_requests_flags(
    tmp_path: Path, seed: int
) -> None:
    """affected_cold_start reads `cold_set`, not every request's flag: the same requests."""
    ctx = _drawn(tmp_path, seed)
    flagged = queries.include(
        "WITH {cold_requests}\n"
        "SELECT trace_id, kept, count(*) OVER () AS matched FROM cold_req WHERE cold\n"
        "ORDER BY coalesce(ttft_ms, ttft_client_ms, e2e_ms) DESC, trace_id"
    )
    cur = ctx.conn.execute(compose(ctx.cte, flagged), [*ctx.params, *FULL_ARGS])
    expected = [dict(zip(("trace_id", "kept", "matched"), r, strict=True)) for r in cur.fetchall()]
    got = ctx.query("affected_cold_start", FULL_ARGS)
    assert got == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_the_full_querys_sides_are_those_cold_requests_flags(tmp_path: Path, seed: int) -> None:
    """diag_cold_start's warm side is every request but `cold_set`'s: the same sides as the
    flag on every request gives (the sums of E2E alike but for their order)."""
    ctx = _drawn(tmp_path, seed)
    expected = _flagged_sides(ctx)
    got = {r["cold"]: r for r in ctx.query("diag_cold_start", FULL_ARGS)}
    assert got.keys() == expected.keys()
    for side, row in got.items():
        assert row.pop("e2e_total") == pytest.approx(expected[side].pop("e2e_total"), rel=1e-12)
        assert row == expected[side]


@pytest.mark.parametrize("seed", SEEDS)
def test_the_finding_is_the_same_with_the_first_check_as_without(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx = _drawn(tmp_path, seed)
    checked = cold_start.detect(ctx)
    monkeypatch.setattr(cold_start, "_may_fire", lambda ctx: True)
    findings_alike(checked, cold_start.detect(Context(ctx.conn, ctx.filters)))


def test_the_drawn_windows_take_every_path(tmp_path: Path) -> None:
    """The windows above are ruled out by the counts and by the early returns, and find: else
    agreeing would prove little.  (Where the counts cannot rule out, the warm median is at
    or below the bar but on its fence, and the full query finds: the fence has its own test.)"""
    paths: set[str] = set()
    for seed in SEEDS:
        ctx = _drawn(tmp_path, seed)
        first = ctx.one("diag_cold_first", FIRST_ARGS)
        may_fire = cold_start._may_fire(ctx)
        found = cold_start.detect(ctx) is not None
        decided_by_counts = (
            first["cold_n"]
            and first["warm_n"] >= cold_start.MIN_WARM
            and (
                first["cold_instances"] >= cold_start.MIN_INSTANCES
                or first["cold_n"] >= cold_start.MIN_COLD_REQUESTS
            )
            and (first["cold_wait_p50"] or 0) > 0
        )
        if not may_fire:
            paths.add("counts" if decided_by_counts else "early")
        else:
            paths.add("found" if found else "full, nothing")
    assert paths == {"counts", "early", "found"}, paths


def _steady(cold_factor: float) -> list[Row]:
    """Three instances, 100 requests each, 1 s apart; each instance's first waits
    `cold_factor` times longer and 300 ms more."""
    rows: list[Row] = []
    for k in range(3):
        for i in range(100):
            wait = 200.0 + (i * 37) % 50
            if i == 0 and cold_factor > 1:
                wait = wait * cold_factor + 300.0
            rows.append(("svc", f"i{k}", f"{k:02d}{i:030x}", i * 1000 + k, wait, None, wait, False))
    return rows


@pytest.mark.parametrize(("cold_factor", "full"), [(1.0, False), (6.0, True)])
def test_the_full_query_runs_only_where_the_first_check_cannot_rule_out(
    tmp_path: Path, cold_factor: float, full: bool
) -> None:
    conn = _write(tmp_path / "w.duckdb", _steady(cold_factor), [])
    recorder = StatementRecorder(conn)
    ctx = Context(recorder, Filters())  # type: ignore[arg-type]
    found = cold_start.detect(ctx)
    assert (found is not None) == full
    ran = {s for s, _ in recorder.statements}
    assert compose(ctx.cte, queries.load("diag_cold_first")) in ran
    assert (compose(ctx.cte, queries.load("diag_cold_start")) in ran) == full


def test_a_contrast_right_at_the_thresholds_still_finds(tmp_path: Path) -> None:
    """Cold waits of exactly 3x the warm ones (the ratio's threshold): warm waits right at the
    bar are not counted above it, and the full query decides (it finds)."""
    rows: list[Row] = []
    for k in range(3):
        for i in range(40):
            wait = 900.0 if i == 0 else 300.0
            rows.append(("svc", f"i{k}", f"{k:02d}{i:030x}", i * 1000, wait, None, wait, False))
    ctx = Context(_write(tmp_path / "w.duckdb", rows, []), Filters())
    first = ctx.one("diag_cold_first", FIRST_ARGS)
    assert first["cold_wait_p50"] == 900.0 and first["warm_above"] == 0
    assert cold_start._may_fire(ctx)
    found = cold_start.detect(ctx)
    assert found is not None and found.evidence[0]["ratio"] == 3.0


def test_warm_waits_half_above_the_bar_take_the_full_query(tmp_path: Path) -> None:
    """Half the warm waits above the bar, half below: the counts cannot tell where the median
    falls (here above it: no finding), and the full query decides."""
    rows: list[Row] = []
    for k in range(3):
        for i in range(41):
            wait = 900.0 if i == 0 else (200.0 if (i + k) % 2 else 500.0)
            rows.append(("svc", f"i{k}", f"{k:02d}{i:030x}", i * 1000, wait, None, wait, False))
    conn = _write(tmp_path / "w.duckdb", rows, [])
    recorder = StatementRecorder(conn)
    ctx = Context(recorder, Filters())  # type: ignore[arg-type]
    first = ctx.one("diag_cold_first", FIRST_ARGS)
    assert first["warm_waits"] == 120 and first["warm_above"] == 60
    assert cold_start._may_fire(ctx)
    assert cold_start.detect(ctx) is None
    assert compose(ctx.cte, queries.load("diag_cold_start")) in {s for s, _ in recorder.statements}


@pytest.mark.parametrize(("nan_share", "ruled_out"), [(0.2, True), (0.6, False)])
def test_nan_warm_waits_are_not_counted_above_the_bar(
    tmp_path: Path, nan_share: float, ruled_out: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB sorts NaN above every number: where most warm waits are NaN their median is NaN,
    which the counts must not rule out (the full query reads it, and finds nothing it can
    compare), and where few are the numbers above the bar rule out alone."""
    rows: list[Row] = []
    for k in range(3):
        for i in range(40):
            wait = 900.0 if i == 0 else (None if i < 40 * nan_share else 500.0)
            rows.append(("svc", f"i{k}", f"{k:02d}{i:030x}", i * 1000, wait, None, 600.0, False))
    conn = _write(tmp_path / "w.duckdb", rows, [])
    conn.execute("UPDATE requests SET ttft_ms = 'nan'::DOUBLE WHERE ttft_ms IS NULL")
    ctx = Context(conn, Filters())
    first = ctx.one("diag_cold_first", FIRST_ARGS)
    assert first["warm_above"] == 3 * sum(1 for i in range(1, 40) if i >= 40 * nan_share)
    assert (first["warm_waits"], first["warm_above"]) == _warm_counts(ctx, first["bar"])
    assert cold_start._may_fire(ctx) is not ruled_out
    assert cold_start.detect(ctx) is None
    if ruled_out:
        monkeypatch.setattr(cold_start, "_may_fire", lambda ctx: True)
        assert cold_start.detect(ctx) is None
