"""big_tenants_slower's first check on its queue contrast (tenant_queues.py), held to the
quantiles it stands in for (diag_tenant_groups): each group's queue p95 lies within the
bounds its counts give, and a window the counts rule out fails the contrast when computed.
On windows drawn at random with the edges that matter: queue times of zero, on the buckets'
very edges, all alike, and p95s near the bar and near the ratio; the windows take every
path (ruled out, computed and failing, computed and holding).
"""

from __future__ import annotations

import random
from pathlib import Path

import duckdb
import pytest
from statement_recorder import StatementRecorder

from tokentrace.analyzer import queries
from tokentrace.analyzer.diagnosis import big_tenants, tenant_queues
from tokentrace.analyzer.diagnosis._base import Context, compose
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import open_db

from . import workloads

T0_NS = 1_750_000_000 * 10**9
MS = 10**6
HEAVY = ["big"]
SEEDS = range(40)


def _queue(rng: random.Random, scale: float, shape: str) -> float:
    if shape == "edges":  # on a bucket's very edge, where log2 may round either way
        return float(2 ** (rng.randrange(0, 120) / tenant_queues.PER_DOUBLING))
    if shape == "zeros":
        return 0.0 if rng.random() < 0.7 else rng.uniform(0, 3) * scale
    if shape == "alike":
        return 40.0 * scale
    return rng.lognormvariate(0, 0.8) * scale


def _drawn(path: Path, seed: int) -> duckdb.DuckDBPyConnection:
    """Heavy tenant `big` and lighter `a`, `b`, `c`, of classes batch and interactive; each
    group's queue times of its own scale (the heavy one's 1 to 3 times the light one's, near
    the contrast's ratio) and shape."""
    rng = random.Random(seed)
    light_scale = rng.choice([5.0, 20.0, 45.0, 200.0])
    heavy_scale = light_scale * rng.choice([1.0, 1.5, 1.9, 2.1, 3.0])
    shapes = {t: rng.choice(["lognormal", "edges", "zeros", "alike"]) for t in ("big", "light")}
    rows: list[tuple[int, float, str, str]] = []
    for _ in range(rng.randint(20, 400)):
        tenant = rng.choice(["big", "big", "a", "b", "c"])
        side = "big" if tenant == "big" else "light"
        scale = heavy_scale if side == "big" else light_scale
        queue = _queue(rng, scale, shapes[side])
        rows.append((rng.randrange(0, 60_000), queue, tenant, rng.choice(["interactive", "batch"])))
    conn = open_db(path)
    cols = list(zip(*rows, strict=True))
    conn.execute(
        """
        INSERT INTO requests BY NAME
        SELECT 'svc' AS service, 'i0' AS instance, printf('%032x', i) AS trace_id,
               'r' || i AS request_id, start_ns, queue_ms + 300 + i % 97 AS e2e_ms, queue_ms,
               300.0 AS prefill_ms, 0.0 AS decode_ms, 300.0 AS server_ms,
               queue_ms AS queue_wait_ms, 0.0 AS tokenize_ms, 0.0 AS other_ms, 'm' AS model,
               tenant, traffic_class, '' AS environment, '/v1' AS route, false AS cold_start,
               false AS error, 'test' AS source, []::VARCHAR[] AS flags, false AS kept,
               'dropped' AS sample_reason, 1.0 AS sample_weight
        FROM (
            SELECT unnest(?) AS start_ns, unnest(?) AS queue_ms, unnest(?) AS tenant,
                   unnest(?) AS traffic_class, unnest(range(len(?))) AS i
        )
        """,
        [
            [T0_NS + t * MS for t in cols[0]],
            list(cols[1]),
            list(cols[2]),
            list(cols[3]),
            list(cols[0]),
        ],
    )
    return conn


def _contrast_fails(groups: dict[bool, dict]) -> bool:  # type: ignore[type-arg]
    """big_tenants' queue test, on diag_tenant_groups' rows."""
    h, lt = groups[True], groups[False]
    worse, better = (h, lt) if h["queue_p95"] >= lt["queue_p95"] else (lt, h)
    ratio = worse["queue_p95"] / max(better["queue_p95"], 1.0)
    return bool(
        worse["queue_p95"] < big_tenants.MIN_QUEUE_P95_MS or ratio < big_tenants.MIN_QUEUE_RATIO
    )


def _paths(ctx: Context, cls: str | None) -> tuple[bool, bool] | None:
    """Holds the first check to diag_tenant_groups in one window; gives (ruled out, fails
    when computed), None where a group has no requests."""
    first = tenant_queues.groups(ctx, HEAVY, cls)
    full = {r["heavy"]: r for r in ctx.query("diag_tenant_groups", [HEAVY, cls, cls])}
    assert first.keys() == full.keys()
    if len(full) < 2:
        return None
    for side, row in full.items():
        assert sum(first[side].counts.values()) == row["n"]
        assert first[side].e2e_total == pytest.approx(row["e2e_total"], rel=1e-12)
        lo, hi = tenant_queues.p95_bounds(first[side].counts)
        assert lo <= row["queue_p95"] <= hi, (side, lo, row["queue_p95"], hi)
    ruled_out = tenant_queues.surely_no_contrast(
        first, big_tenants.MIN_QUEUE_P95_MS, big_tenants.MIN_QUEUE_RATIO
    )
    fails = _contrast_fails(full)
    assert fails or not ruled_out, full
    return ruled_out, fails


def test_the_first_check_agrees_with_the_quantiles(tmp_path: Path) -> None:
    """Every drawn window: the bounds hold the p95s, and what the counts rule out fails when
    computed; and the windows take every path, else agreeing would prove little."""
    paths: set[tuple[bool, bool]] = set()
    for seed in SEEDS:
        ctx = Context(_drawn(tmp_path / f"w{seed}.duckdb", seed), Filters())
        for cls in (None, "interactive"):
            taken = _paths(ctx, cls)
            if taken is not None:
                paths.add(taken)
    assert paths == {(True, True), (False, True), (False, False)}, paths


def test_a_group_of_one_request_has_bounds(tmp_path: Path) -> None:
    counts = {0.0: 1}
    assert tenant_queues.p95_bounds(counts) == (float("-inf"), pytest.approx(2 ** (1 / 8)))
    assert tenant_queues.p95_bounds({float("nan"): 3, 4.0: 2}) == (float("-inf"), float("inf"))


def _ran(conn: duckdb.DuckDBPyConnection, name: str) -> tuple[bool, list[str]]:
    recorder = StatementRecorder(conn)
    findings = build_report(recorder)["findings"]  # type: ignore[arg-type]
    prefix = compose(Filters().cte()[0], queries.load(name))
    return any(s == prefix for s, _ in recorder.statements), [f["complaint"] for f in findings]


@pytest.mark.slow
def test_the_quantiles_run_only_where_the_counts_cannot_tell(
    write_workload, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    """A window whose tenants' queue p95s the counts place close together (drawn: seed 2)
    reads no quantile; a heavy tenant that queues far longer reads them, and is found as
    before."""
    conn = _drawn(tmp_path / "alike.duckdb", 2)
    assert _paths(Context(conn, Filters()), "interactive") == (True, True)
    ran, _ = _ran(conn, "diag_tenant_groups")
    assert not ran
    assert _ran(conn, "diag_tenant_queue_buckets")[0]  # the check ran, and ruled it out
    ran, found = _ran(
        write_workload(workloads.big_tenants_slower(), "big.duckdb"), "diag_tenant_groups"
    )
    assert ran
    assert "big_tenants_slower" in found, found
