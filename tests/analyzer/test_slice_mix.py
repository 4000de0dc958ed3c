"""The per-slice signals' figures, added up from one pass (slice_mix.py), against the queries
each signal ran apart before: diag_slices, diag_peak, diag_peak_tenants, diag_batch_mode_sides
and diag_tenants.  Counts agree to the unit, sums to their last digits; on the scenario
windows and on windows drawn at random with the edges that matter (requests of no tenant or
of neither class, slices of batch traffic alone, fewer than ten slices, a tenant in one slice
only);
and past MAX_SLICE_MIX_ROWS each signal runs its own query again.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import _base, slice_mix
from tokentrace.analyzer.diagnosis._base import Context, compose
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import open_db

from . import workloads
from .requests_rows import insert_requests

T0_NS = 1_750_000_000 * 10**9
MS = 10**6
#: The queries slice_mix stands in for.
APART = ("diag_slices", "diag_peak", "diag_peak_tenants", "diag_batch_mode_sides", "diag_tenants")
SEEDS = range(12)


def _drawn(path: Path, seed: int) -> duckdb.DuckDBPyConnection:
    """A window drawn at random: a few seconds to two hours, tenants named and unnamed ('')
    in classes batch, interactive and one of neither, some in bursts of one slice."""
    rng = random.Random(seed)
    span_ms = rng.choice([3_000, 40_000, 600_000, 7_200_000])
    tenants = ["", "a", "b", "c", "big"][: rng.randint(1, 5)]
    classes = rng.choice([["interactive"], ["interactive", "batch"], ["batch", "interactive", "x"]])
    rows: list[tuple[int, float, float, str, str, int | None]] = []
    for _ in range(rng.randint(30, 600)):
        start = rng.randrange(0, span_ms)
        rows.append(
            (start, rng.lognormvariate(6, 1), rng.expovariate(0.01), rng.choice(tenants),
             rng.choice(classes), rng.choice([None, rng.randint(1, 4000)]))
        )  # fmt: skip
    burst = rng.randrange(0, span_ms)
    rows += [(burst, 900.0, 500.0, "burst", "interactive", 7)] * rng.randint(0, 40)
    conn = open_db(path)
    cols = list(zip(*rows, strict=True))
    insert_requests(
        conn,
        {
            "start_ns": [T0_NS + t * MS for t in cols[0]],
            "e2e_ms": [a + b for a, b in zip(cols[1], cols[2], strict=True)],
            "queue_ms": cols[2],
            "tenant": cols[3],
            "traffic_class": cols[4],
            "prompt_tokens": cols[5],
        },
        {"prefill_ms": "e2e_ms - queue_ms", "queue_wait_ms": "queue_ms"},
    )
    return conn


def _alike(mixed: Any, apart: Any) -> None:
    """Holds figures added up from the pass to a query's: integers and lists exactly (lists
    as sets: the query's order is its own), floats to their last digits."""
    if isinstance(apart, float) and isinstance(mixed, float):
        assert mixed == pytest.approx(apart, rel=1e-12)
    elif isinstance(apart, list) and isinstance(mixed, list):
        assert sorted(mixed) == sorted(apart)
    else:
        assert mixed == apart
        assert type(mixed) is type(apart) or {type(mixed), type(apart)} <= {int, float}


def _rows_alike(mixed: list[dict[str, Any]], apart: list[dict[str, Any]], key: str) -> None:
    by_key = {r[key]: r for r in apart}
    assert sorted(r[key] for r in mixed) == sorted(by_key), (mixed, apart)
    for r in mixed:
        assert r.keys() == by_key[r[key]].keys()
        for col, value in r.items():
            _alike(value, by_key[r[key]][col])


def _held_to_the_queries(ctx: Context) -> None:
    assert ctx.slice_mix is not None
    for cls in (None, "interactive"):
        split = slice_mix.busy_split(ctx, cls)
        old = {r["busy"]: r for r in ctx.query("diag_slices", [ctx.slice_ns, cls, cls])}
        _rows_alike(list(split.values()), list(old.values()), "busy")
        assert split.keys() == old.keys()
    _rows_alike(slice_mix.per_slice(ctx), ctx.query("diag_peak", [ctx.slice_ns]), "slice")
    busy = [int(x) for x in (split.get(True) or {"slice_ids": []})["slice_ids"]]
    for ids in (busy, busy[:1], [-1]):
        mixed = slice_mix.tenant_shares(ctx, ids)
        old_shares = ctx.query("diag_peak_tenants", [ctx.slice_ns, ids])
        pairs = {(r["busy"], r["tenant"]): r["share"] for r in old_shares}
        assert {(r["busy"], r["tenant"]): r["share"] for r in mixed} == pairs
    sides = ctx.query("diag_batch_mode_sides", [ctx.slice_ns])
    assert slice_mix.batch_sides(ctx) == {r["with_batch"]: r["n"] for r in sides}
    for cls in (None, "interactive", "batch"):
        # in the query's order: big_tenants takes the heaviest first
        assert slice_mix.tenant_volumes(ctx, cls) == ctx.query("diag_tenants", [cls, cls])


@pytest.mark.parametrize("seed", SEEDS)
def test_drawn_windows_add_up_to_the_queries(tmp_path: Path, seed: int) -> None:
    conn = _drawn(tmp_path / "w.duckdb", seed)
    _held_to_the_queries(Context(conn, Filters()))
    # a part of the window, as a report of one tenant or one hour reads it
    _held_to_the_queries(Context(conn, Filters(tenant="a")))


@pytest.mark.parametrize(
    "workload", ["peak_hours", "batch_mode_breaks_live", "big_tenants_slower", "tenant_bursts"]
)
def test_scenario_windows_add_up_to_the_queries(write_workload, workload: str) -> None:  # type: ignore[no-untyped-def]
    _held_to_the_queries(Context(write_workload(getattr(workloads, workload)()), Filters()))


def test_the_drawn_windows_take_the_edges(tmp_path: Path) -> None:
    """The drawn windows hold what the edges need: else agreeing would prove little."""
    seen: set[str] = set()
    for seed in SEEDS:
        ctx = Context(_drawn(tmp_path / f"w{seed}.duckdb", seed), Filters())
        mix = ctx.slice_mix or []
        # the bound Context.slice_mix runs the pass under is never below its rows
        bound = (int(ctx.overview["span_ns"]) // ctx.slice_ns + 2) * (ctx.carried["tenants"] + 1)
        assert len(mix) <= bound * len(ctx.carried["traffic_classes"])
        slices = {r["slice"] for r in mix}
        seen.add("few slices" if len(slices) < slice_mix.DECILES else "many slices")
        seen |= {"unnamed" for r in mix if r["tenant"] == ""}
        seen |= {"neither class" for r in mix if r["traffic_class"] == "x"}
        batch = {r["slice"] for r in mix if r["traffic_class"] == "batch"}
        live = {r["slice"] for r in mix if r["traffic_class"] != "batch"}
        seen |= {"batch alone"} if batch - live else set()
        seen |= {"slices without batch"} if batch and live - batch else set()
    assert seen >= {
        "few slices", "many slices", "unnamed", "neither class", "batch alone", "slices without batch"
    }, seen  # fmt: skip


def test_a_report_counts_the_slices_once(write_workload) -> None:  # type: ignore[no-untyped-def]
    """A report over a window with a peak, batch traffic and tenants scans the requests for
    the per-slice figures once: diag_slice_mix, none of the queries it stands in for."""
    conn = write_workload(workloads.tenant_bursts())
    recorder = StatementRecorder(conn)
    build_report(recorder)  # type: ignore[arg-type]
    cte = Filters().cte()[0]
    ran = {name for name in (*APART, "diag_slice_mix") for s, _ in recorder.statements
           if s == compose(cte, queries.load(name))}  # fmt: skip
    assert ran == {"diag_slice_mix"}


def test_too_many_rows_run_the_queries_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the pass may give more than MAX_SLICE_MIX_ROWS rows (tenants by the hundred) it
    is not run, and each signal runs its own query: the same figures."""
    conn = _drawn(tmp_path / "w.duckdb", 3)
    whole = Context(conn, Filters())
    assert whole.slice_mix is not None
    monkeypatch.setattr(_base, "MAX_SLICE_MIX_ROWS", 1)
    recorder = StatementRecorder(conn)
    apart = Context(recorder, Filters())  # type: ignore[arg-type]
    assert apart.slice_mix is None
    # diag_peak has no order (peak_hours sums and looks its slices up), and two runs of its
    # parallel GROUP BY gave its rows in two orders (CI): its rows, not their order
    _rows_alike(slice_mix.per_slice(apart), apart.query("diag_peak", [apart.slice_ns]), "slice")
    _rows_alike(slice_mix.per_slice(whole), slice_mix.per_slice(apart), "slice")
    assert slice_mix.tenant_volumes(apart, None) == slice_mix.tenant_volumes(whole, None)
    assert slice_mix.batch_sides(apart) == slice_mix.batch_sides(whole)
    mix = compose(apart.cte, queries.load("diag_slice_mix"))
    assert all(s != mix for s, _ in recorder.statements)
