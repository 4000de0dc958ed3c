"""The in-flight sweeps' first checks (in_flight_gaps, diag_batch_apart, diag_tenant_apart).

batch_mode_breaks_live and big_tenants_slower compare light requests that arrived while heavy
ones (batch traffic, the heavy tenants) were in flight on their instance with those that
arrived while none were.  The sweep that counts, for every light request, the heavy requests
in flight sorts them all (5-8 CPU-s at 10 M requests).  The first checks find the requests
with none in flight from the gaps between the heavy requests alone, and rule the contrast out
from counts where they can.  Held here to the sweep itself, on windows drawn at random with
the edges that matter: arrivals on the very instant a heavy request starts or ends, requests
of no length, nested and chained heavy requests, instances with no heavy traffic at all, and
a heavy request that ends before it starts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import batch_mode, big_tenants
from tokentrace.analyzer.diagnosis._base import INSIDE, Context, compose
from tokentrace.analyzer.filters import Filters
from tokentrace.store.connection import open_db

from .alike import findings_alike
from .requests_rows import insert_requests

T0_NS = 1_750_000_000 * 10**9
MS = 10**6

#: One request of the window: instance, start (ms from T0), E2E (ms), TTFT (ms), traffic class
#: and tenant; the columns the sweeps read, the others given plain values.
Row = tuple[str, int, float, float, str, str]


def _write(path: Path, rows: list[Row]) -> duckdb.DuckDBPyConnection:
    conn = open_db(path)
    cols = list(zip(*rows, strict=True))
    insert_requests(
        conn,
        {
            "instance": cols[0],
            "start_ns": [T0_NS + t * MS for t in cols[1]],
            "e2e_ms": cols[2],
            "ttft_ms": cols[3],
            "traffic_class": cols[4],
            "tenant": cols[5],
        },
        {
            "tpot_ms": "20.0 + i % 7",
            "queue_ms": "1.0 + i % 5",
            "prefill_ms": "ttft_ms",
            "queue_wait_ms": "1.0",
        },
    )
    return conn


def _window(rng: random.Random, slow_beside: float) -> list[Row]:
    """A window of a minute drawn at random: heavy requests (batch traffic of tenant `big`) on
    a 100 ms grid so that light arrivals often fall on their very starts and ends, few of them
    or enough for batch traffic in every time slice; light requests whose TTFT is
    `slow_beside` times longer while a heavy request is in flight on their instance; and an
    instance with no heavy traffic now and then."""
    instances = ["i0", "i1", "i2"][: rng.randint(1, 3)]
    quiet = rng.choice(instances) if rng.random() < 0.3 else None
    many = rng.random() < 0.6
    heavy: list[tuple[str, int, int]] = []
    for inst in instances:
        if inst == quiet:
            continue
        for _ in range(rng.randint(150, 250) if many else rng.randint(0, 30)):
            start = rng.randrange(0, 600) * 100
            heavy.append((inst, start, rng.choice([0, 100, 300, 1000, rng.randrange(0, 50) * 100])))
    rows: list[Row] = [(i, s, float(e), 50.0, "batch", "big") for i, s, e in heavy]
    for _ in range(rng.randint(20, 300)):
        inst = rng.choice(instances)
        t = rng.randrange(0, 600) * 100 if rng.random() < 0.5 else rng.randrange(0, 60_000)
        busy = any(i == inst and s <= t <= s + e for i, s, e in heavy)
        ttft = rng.lognormvariate(5.5, 0.4) * (slow_beside if busy else 1.0)
        rows.append((inst, t, ttft + 100.0, ttft, "interactive", rng.choice(["a", "b"])))
    return rows


def _in_flight_sides(
    ctx: Context, sweep: str, extra: list[Any], key: str
) -> dict[bool, dict[str, Any]]:
    return {r[key]: r for r in ctx.query(sweep, extra)}


@pytest.mark.parametrize("seed", range(12))
def test_the_requests_apart_are_those_the_sweep_finds_with_none_in_flight(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    conn = _write(tmp_path / "w.duckdb", _window(rng, rng.choice([1.0, 2.0, 4.0])))
    ctx = Context(conn, Filters())
    # batch traffic against the live requests
    swept = _in_flight_sides(ctx, "diag_batch_concurrency", [], "with_batch")
    first = ctx.one("diag_batch_apart", [*ctx.instance_arrivals, 1.5, 1.5])
    apart, beside = swept.get(False), swept.get(True)
    assert first["reversed"] == 0
    assert first["apart_n"] == (apart["n"] if apart else 0)
    assert first["beside_n"] == (beside["n"] if beside else 0)
    if apart:
        assert first["apart_ttft_p50"] == apart["ttft_p50"]
        assert first["apart_tpot_p50"] == apart["tpot_p50"]
    # the heavy tenant against the lighter ones, of one class and of all
    for cls in ("interactive", None):
        heavy_args = [["big", "a"], cls, cls]
        swept = _in_flight_sides(ctx, "diag_tenant_beside", heavy_args, "beside")
        first = ctx.one(
            "diag_tenant_apart", [*heavy_args, *ctx.instance_arrivals, 3.0, 200.0, 200.0]
        )
        apart, beside = swept.get(False), swept.get(True)
        assert first["apart_n"] == (apart["n"] if apart else 0)
        assert first["beside_n"] == (beside["n"] if beside else 0)
        if apart:
            assert first["apart_wait_p50"] == apart["wait_p50"]


def test_the_counts_below_the_bar_are_the_sweeps(tmp_path: Path) -> None:
    rng = random.Random(99)
    conn = _write(tmp_path / "w.duckdb", _window(rng, 1.6))
    ctx = Context(conn, Filters())
    first = ctx.one("diag_batch_apart", [*ctx.instance_arrivals, 1.5, 1.5])
    bar = 1.5 * first["apart_ttft_p50"]
    [(below, n)] = conn.execute(
        compose(
            ctx.cte,
            queries.include(
                "WITH {batch_in_flight}\n"
                "SELECT count_if(ttft < ?), count(ttft) FROM live_beside WHERE in_flight > 0"
            ),
        ),
        [*ctx.params, bar],
    ).fetchall()
    assert (first["beside_ttft_below"], first["beside_ttft_n"]) == (below, n)
    assert 0 < below < n


def test_the_instances_arrivals_are_each_instances_first_and_last_start(tmp_path: Path) -> None:
    """The first checks clip their gaps to each instance's arrivals (Context.instance_arrivals,
    from diag_signals' pass), of every request of the window, light or heavy."""
    conn = _write(tmp_path / "w.duckdb", _window(random.Random(5), 1.6))
    for filters in (Filters(), Filters(traffic_class="interactive"), Filters(tenant="nobody")):
        ctx = Context(conn, filters)
        expected = conn.execute(
            f"{ctx.cte} SELECT service, instance, min(start_ns), max(start_ns) FROM req"  # noqa: S608
            " GROUP BY ALL ORDER BY ALL",
            ctx.params,
        ).fetchall()
        assert list(zip(*ctx.instance_arrivals, strict=True)) == expected
        if filters == Filters():
            assert len(expected) > 1


def _drawn(path: Path, seed: int) -> duckdb.DuckDBPyConnection:
    """A window where the light requests beside heavy ones are hardly slower, or far slower
    (the finding)."""
    rng = random.Random(1000 + seed)
    return _write(path, _window(rng, [1.0, 1.3, 1.6, 3.0, 8.0][seed % 5]))


AGREEMENT_SEEDS = range(20)


@pytest.mark.parametrize("seed", AGREEMENT_SEEDS)
def test_a_first_check_that_rules_out_agrees_with_the_sweep(
    tmp_path: Path, seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The findings are the same with the first checks as with the sweeps alone."""
    conn = _drawn(tmp_path / "w.duckdb", seed)
    ctx = Context(conn, Filters())
    checked_batch = batch_mode.detect(ctx)
    checked_tenants = big_tenants._beside_heavy(ctx, ["big"], ["a", "b"], None, 0.5, 1000.0)
    monkeypatch.setattr(batch_mode, "_request_contrast_needed", lambda ctx, has_steps: True)
    monkeypatch.setattr(big_tenants, "_beside_surely_none", lambda ctx, heavy, cls: False)
    ctx = Context(conn, Filters())
    findings_alike(checked_batch, batch_mode.detect(ctx))
    findings_alike(
        checked_tenants, big_tenants._beside_heavy(ctx, ["big"], ["a", "b"], None, 0.5, 1000.0)
    )


def test_the_drawn_windows_take_every_path(tmp_path: Path) -> None:
    """The windows above rule out, take the sweep, and find, in both signals: else agreeing
    would prove little."""
    batch: set[tuple[bool | None, bool]] = set()
    tenants: set[tuple[bool, bool]] = set()
    for seed in AGREEMENT_SEEDS:
        ctx = Context(_drawn(tmp_path / f"w{seed}.duckdb", seed), Filters())
        sides = {
            r["with_batch"]: r["n"] for r in ctx.query("diag_batch_mode_sides", [ctx.slice_ns])
        }
        if sides.get(False, 0) < batch_mode.MIN_PER_SIDE:  # the request-level contrast decides
            batch.add(
                (
                    batch_mode._request_contrast_needed(ctx, False),
                    batch_mode.detect(ctx) is not None,
                )
            )
        ruled_out = big_tenants._beside_surely_none(ctx, ["big"], None)
        found = big_tenants._beside_heavy(ctx, ["big"], ["a", "b"], None, 0.5, 1000.0) is not None
        tenants.add((ruled_out, found))
    assert {(None, False), (True, True)} <= batch, batch
    assert {(True, False), (False, True)} <= tenants, tenants


def _steady(seed: int, slow_beside: float) -> list[Row]:
    """Ten minutes of batch jobs on one instance, 2 s every 2.5 s (every time slice holds
    batch traffic), and live requests `slow_beside` times slower beside them."""
    rng = random.Random(seed)
    rows: list[Row] = [("i0", k * 2500, 2000.0, 50.0, "batch", "big") for k in range(240)]
    for k in range(2000):
        t = k * 300 + rng.randrange(0, 300)
        ttft = rng.lognormvariate(5.5, 0.3) * (slow_beside if t % 2500 <= 2000 else 1.0)
        rows.append(("i0", t, ttft + 100.0, ttft, "interactive", "a"))
    return rows


@pytest.mark.parametrize(("slow_beside", "sweeps"), [(1.0, False), (4.0, True)])
def test_the_sweep_runs_only_where_the_first_check_cannot_rule_out(
    tmp_path: Path, slow_beside: float, sweeps: bool
) -> None:
    conn = _write(tmp_path / "w.duckdb", _steady(5, slow_beside))
    recorder = StatementRecorder(conn)
    ctx = Context(recorder, Filters())  # type: ignore[arg-type]
    found = batch_mode.detect(ctx)
    assert (found is not None) == sweeps
    ran = {s for s, _ in recorder.statements}
    assert (compose(ctx.cte, queries.load("diag_batch_concurrency")) in ran) == sweeps
    assert compose(ctx.cte, queries.load("diag_batch_apart")) in ran


def test_a_heavy_request_ending_before_it_starts_takes_the_sweep(tmp_path: Path) -> None:
    rows = _steady(6, 1.0)
    rows.append(("i0", 30_000, -5000.0, 50.0, "batch", "big"))
    conn = _write(tmp_path / "w.duckdb", rows)
    ctx = Context(conn, Filters())
    bars = [1.5 * INSIDE, 1.5 * INSIDE]
    assert ctx.one("diag_batch_apart", [*ctx.instance_arrivals, *bars])["reversed"] == 1
    assert batch_mode._request_contrast_needed(ctx, has_steps=False) is True
    assert big_tenants._beside_surely_none(ctx, ["big"], None) is False
