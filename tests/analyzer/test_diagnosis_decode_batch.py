"""Decode that batching stretches: every decode step costs more as the batch grows.

The shape a reviewer's ground-truth server showed (decode 20 ms + 3 ms per running
sequence; TPOT 20 → 104 ms, decode 95 % of E2E) read "no latency complaint stands out":
the stall signal compares gaps with each stream's own median, and a stream slow from its
first token to its last has no gap above it.
"""

from __future__ import annotations

import random
from collections import deque

import duckdb
import pytest

from tokentrace.analyzer import queries
from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.diagnosis import decode_batch
from tokentrace.analyzer.diagnosis._base import compose
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report

from . import workloads
from .workloads import T0_NS, Req, Workload, arrivals, summarize


def _burst_rate(t: float) -> float:
    """Bursts of 6 requests a second for 10 s, then 30 s of a trickle: the batch fills to
    dozens of sequences, then drains to one or two."""
    return 6.0 if t % 40 < 10 else 0.2


def continuous_batching(
    seed: int, step_ms: float = 20.0, per_sequence_ms: float = 3.0, with_steps: bool = True
) -> Workload:
    """Gives a window served by one continuous-batching engine: each step either prefills the
    requests that arrived (one step for all of them) or decodes one token for every running
    sequence, in `step_ms` + `per_sequence_ms` per sequence (±5 %).  Its engine steps name
    their requests, as the SDK's do; `with_steps=False` leaves them out (vLLM's spans)."""
    rng = random.Random(seed)
    reqs = [Req(a, 20, 64, network_ms=rng.uniform(2, 10)) for a in arrivals(rng, 120, _burst_rate)]
    ids = {id(r): f"req-{i}" for i, r in enumerate(reqs)}  # as `summarize` names them
    waiting, running = deque(reqs), []
    last_token: dict[int, int] = {}
    steps: list[EngineStep] = []
    t = T0_NS
    while waiting or running:
        if not running and waiting[0].arrival_ns > t:
            t = waiting[0].arrival_ns
        admitted = []
        while waiting and waiting[0].arrival_ns + int(waiting[0].tokenize_ms * NS_PER_MS) <= t:
            admitted.append(waiting.popleft())
        if admitted:
            took = (15.0 + 0.05 * sum(r.prompt for r in admitted)) * rng.uniform(0.95, 1.05)
            steps.append(
                EngineStep(
                    "llm",
                    "i0",
                    t,
                    int(took * 1000),
                    sum(r.prompt for r in admitted),
                    0,
                    len(admitted),
                    len(waiting),
                    None,
                    None,
                    [ids[id(r)] for r in admitted],
                )
            )
            for r in admitted:
                r.queue_ms = (t - r.arrival_ns) / NS_PER_MS - r.tokenize_ms
                r.prefill_ms = took
            t += int(took * NS_PER_MS)
            for r in admitted:
                last_token[id(r)] = t
            running += admitted
            continue
        took = (step_ms + per_sequence_ms * len(running)) * rng.uniform(0.95, 1.05)
        steps.append(
            EngineStep(
                "llm",
                "i0",
                t,
                int(took * 1000),
                0,
                len(running),
                len(running),
                len(waiting),
                None,
                None,
                [ids[id(r)] for r in running],
            )
        )
        t += int(took * NS_PER_MS)
        for r in running:
            r.gaps_ms.append((t - last_token[id(r)]) / NS_PER_MS)
            last_token[id(r)] = t
        running = [r for r in running if len(r.gaps_ms) < r.output - 1]
    return Workload(summarize(rng, reqs), engine_steps=steps if with_steps else [], raw=reqs)


def _finding(w: Workload, write_workload, name: str = "t.duckdb") -> dict | None:  # type: ignore[no-untyped-def,type-arg]
    found = build_report(write_workload(w, name=name))["findings"]
    return next((f for f in found if f["complaint"] == "stutter"), None)


def test_decode_steps_that_slow_with_the_batch_are_diagnosed(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = continuous_batching(seed=21)
    f = _finding(w, write_workload)
    assert f is not None, "no stutter finding for decode stretched by the batch"
    assert f["title"] == decode_batch.TITLE
    steps, tpot = f["evidence"]
    # the engine's steps say what a sequence costs: ~3 ms each, and big batches cost 2× and more
    assert steps["large_batch_step_p50_ms"] >= 2 * steps["small_batch_step_p50_ms"], steps["text"]
    assert steps["large_batch_min"] >= 2 * steps["small_batch_max"]
    assert 2.5 <= steps["ms_per_sequence"] <= 3.5, steps["text"]
    assert steps["text"].startswith(
        f"decode steps take {steps['small_batch_step_p50_ms']:.0f} ms at batch {steps['small_batch_min']}"
    ), steps["text"]
    assert (
        f"vs {steps['large_batch_step_p50_ms']:.0f} ms at batch {steps['large_batch_min']}–"
        in steps["text"]
    )
    # and the median stream feels it
    assert tpot["tpot_p50_ms"] >= 1.5 * tpot["unloaded_tpot_ms"]
    assert "(TPOT p50)" in tpot["text"] and "of all E2E time" in tpot["text"]
    assert f["fix_first"].startswith("Cap the decode batch where streaming speed matters"), f[
        "fix_first"
    ]
    assert "--max-num-seqs" in f["fix_first"]
    assert f["example_traces"] and f["affected_trace_ids"]
    slowest = max(w.requests, key=lambda s: s.tpot_ms or 0.0)
    assert slowest.trace_id in f["affected_trace_ids"]


def test_without_engine_steps_tpot_against_concurrency_stands_in(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = _finding(continuous_batching(seed=21, with_steps=False), write_workload)
    assert f is not None, "no stutter finding from TPOT against concurrency"
    assert f["title"] == decode_batch.TITLE
    by_load, tpot = f["evidence"]
    assert by_load["large_running_tpot_p50_ms"] >= 2 * by_load["small_running_tpot_p50_ms"], (
        by_load["text"]
    )
    assert by_load["large_running_min"] >= 2 * by_load["small_running_max"]
    assert "no engine steps were recorded" in by_load["text"]
    assert f["fix_first"].startswith("Cap the decode batch"), f["fix_first"]


def test_a_batch_that_costs_little_per_sequence_is_no_finding(write_workload) -> None:  # type: ignore[no-untyped-def]
    # a GPU's memory-bound decode: batching is nearly free, which is what it is for
    w = continuous_batching(seed=21, per_sequence_ms=0.2)
    assert _finding(w, write_workload) is None
    w = continuous_batching(seed=21, per_sequence_ms=0.2, with_steps=False)
    assert _finding(w, write_workload, name="no_steps.duckdb") is None


@pytest.mark.slow
def test_batch_jobs_that_fill_the_batch_stay_batch_mode(write_workload) -> None:  # type: ignore[no-untyped-def]
    # live TPOT triples while batch jobs share the decode batch: batch_mode_breaks_live tells
    # it, with its own fix; the same batch told again as stutter would be one story twice
    found = build_report(write_workload(workloads.batch_slows_decode()))["findings"]
    assert found and found[0]["complaint"] == "batch_mode_breaks_live", found
    assert all(f["title"] != decode_batch.TITLE for f in found), [f["title"] for f in found]


#: diag_decode_concurrency as it first counted: every request's start (+1) and end (-1) of
#: computing and the streams' middles (0) in time order, the running sum at a middle (one
#: sort of twice the window's requests).  The query now counts per second and within the
#: middle's own second; the figures must be the same.
_RUNNING_IN_TIME_ORDER = """
WITH streams AS (
    SELECT row_number() OVER () AS stream, tpot_ms,
           start_ns + CAST((ttft_ms + decode_ms / 2) * 1e6 AS BIGINT) AS mid_ns
    FROM requests WHERE tpot_ms IS NOT NULL AND ttft_ms IS NOT NULL AND output_tokens >= 3
),
edges AS (
    SELECT start_ns + CAST((ttft_ms - prefill_ms) * 1e6 AS BIGINT) AS at_ns, 1 AS step,
           NULL::BIGINT AS stream, NULL::DOUBLE AS tpot_ms
    FROM requests WHERE ttft_ms IS NOT NULL
    UNION ALL
    SELECT start_ns + CAST((ttft_ms + decode_ms) * 1e6 AS BIGINT), -1, NULL, NULL
    FROM requests WHERE ttft_ms IS NOT NULL
    UNION ALL
    SELECT mid_ns, 0, stream, tpot_ms FROM streams
),
beside AS (
    SELECT stream, tpot_ms, running FROM (
        SELECT stream, tpot_ms, sum(step) OVER (ORDER BY at_ns, step ROWS UNBOUNDED PRECEDING) AS running
        FROM edges
    )
    WHERE stream IS NOT NULL
),
q AS (SELECT quantile_disc(running, 0.25) AS lo, quantile_disc(running, 0.75) AS hi FROM beside)
SELECT
    count(*) FILTER (WHERE running <= q.lo), min(running) FILTER (WHERE running <= q.lo),
    max(running) FILTER (WHERE running <= q.lo), median(tpot_ms) FILTER (WHERE running <= q.lo),
    count(*) FILTER (WHERE running >= q.hi), min(running) FILTER (WHERE running >= q.hi),
    max(running) FILTER (WHERE running >= q.hi), median(tpot_ms) FILTER (WHERE running >= q.hi)
FROM beside, q
"""


@pytest.mark.parametrize("seed", range(12))
def test_the_concurrency_count_is_the_running_sum_in_time_order(seed: int) -> None:
    """Requests on a coarse grid of times (quarter seconds), so starts, ends and middles
    fall on one instant and on a second's edge (a start at a middle's instant is not yet
    computing, an end is done), some before 0 (where integer division truncates); fewer
    streams than the query's sample, so it reads them all."""
    rng = random.Random(seed)
    conn = duckdb.connect()
    conn.execute(
        "CREATE TABLE requests (start_ns BIGINT, ttft_ms DOUBLE, prefill_ms DOUBLE, "
        "decode_ms DOUBLE, tpot_ms DOUBLE, output_tokens INTEGER)"
    )
    t0 = 0 if seed % 2 else T0_NS
    rows = [
        (
            t0 + rng.randint(0, 40) * 250 * NS_PER_MS,
            rng.choice([None, 0.0, 250.0, 750.0, 1250.0]),
            rng.choice([0.0, 250.0, 1000.0]),
            rng.choice([0.0, 500.0, 2000.0]),
            rng.choice([None, 10.0, 20.0, 40.0]),
            rng.choice([1, 3, 10]),
        )
        for _ in range(rng.randint(50, 400))
    ]
    conn.executemany("INSERT INTO requests VALUES (?, ?, ?, ?, ?, ?)", rows)
    expected = conn.execute(_RUNNING_IN_TIME_ORDER).fetchone()
    got = conn.execute(
        compose(Filters().cte()[0], queries.load("diag_decode_concurrency"))
    ).fetchone()
    assert expected is not None and expected[0] > 5
    assert got == expected
