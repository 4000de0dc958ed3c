"""A request's engine steps when its engine runs in another process of the same service.

vLLM V1 serves from an API server process (the request spans) and an engine core process
(the engine steps): OpenTelemetry gives each its own `service.instance.id`, so the steps
that name a request sit on another instance than the request.  They are still its engine's
steps; but two replicas that both count ids ("req-1") at the same time keep their own.
"""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

import duckdb
import pytest

from tokentrace.analyzer import queries
from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.diagnosis._base import compose
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.web._trace import trace_data

from . import workloads
from .workloads import T0_NS, S, Server, Workload

pytestmark = pytest.mark.slow

#: prefill tokens of the big steps (the small ones prefill at most 300)
BIG = 6000


def _decode_window(s: RequestSummary) -> tuple[int, int]:
    return s.start_ns + int((s.ttft_ms or 0) * NS_PER_MS), s.start_ns + int(s.e2e_ms * NS_PER_MS)


def _decoding(reqs: list[RequestSummary], t: int) -> list[str]:
    """Gives the ids of the requests decoding at `t`: who a step at `t` names."""
    return [s.request_id for s in reqs if _decode_window(s)[0] <= t <= _decode_window(s)[1]]


def _steps(
    reqs: list[RequestSummary], instance: str, big: list[int], rng: random.Random
) -> list[EngineStep]:
    """Steps of one engine, each naming the requests decoding then: a small step every
    2 s and a big prefill at each of `big`."""
    out = [
        EngineStep("llm", instance, b, 900_000, BIG, 12, 13, 2, 0.5, None, _decoding(reqs, b))
        for b in big
    ]
    for t in range(0, 600, 2):
        at = T0_NS + t * S
        out.append(
            EngineStep(
                "llm",
                instance,
                at,
                20_000,
                rng.choice([0, 0, 120, 300]),
                12,
                12,
                1,
                0.4,
                None,
                _decoding(reqs, at),
            )
        )
    return out


def _big_prefills(w: Workload) -> list[int]:
    return sorted(s.start_ns for s in w.engine_steps if s.prefill_tokens == BIG)


def _engine_process(w: Workload) -> Workload:
    """`w` with its requests on the API server's instance and its steps, naming the
    requests they decoded, on the engine core's: one replica, two processes."""
    reqs = [replace(s, instance="api-7f3a") for s in w.requests]
    steps = _steps(reqs, "engine-9c1e", _big_prefills(w), random.Random(1))
    return Workload(reqs, engine_steps=steps, raw=w.raw)


def _stutter_finding(conn: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    findings = build_report(conn)["findings"]
    found = [f for f in findings if f["complaint"] == "stutter"]
    assert found, [f["complaint"] for f in findings]
    return found[0]


def _engines(conn: duckdb.DuckDBPyConnection) -> dict[tuple[str, str], set[str]]:
    """Gives each request's (instance, request id) -> the engine instances `request_engine` finds."""
    cte, params = Filters().cte()
    sql = queries.include(
        "WITH asked AS (SELECT trace_id, request_id, service, instance, start_ns AS t0, "
        "start_ns + CAST(e2e_ms * 1e6 AS BIGINT) AS t1 FROM req),\n{request_engines}\n"
        "SELECT instance, request_id, engine FROM request_engine"
    )
    out: dict[tuple[str, str], set[str]] = {}
    for instance, request_id, engine in conn.execute(compose(cte, sql), params).fetchall():
        out.setdefault((instance, request_id), set()).add(engine)
    return out


def test_engine_in_another_process_explains_the_stalls(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = _engine_process(workloads.stutter())
    conn = write_workload(w)
    stutter = _stutter_finding(conn)
    linked = next(e for e in stutter["evidence"] if "stalled_with_large_prefill" in e)
    # the same workload in one process reads 100 % against 0 %; across the two
    # processes it read 0 % against 0 % and gave the generic advice
    assert linked["stalled_with_large_prefill"] > 0.9, linked
    assert linked["stalled_with_large_prefill"] > linked["smooth_with_large_prefill"] + 0.5, linked
    assert stutter["fix_first"].startswith("Enable chunked prefill"), stutter["fix_first"]
    named = {i for step in w.engine_steps for i in step.request_ids}
    assert len(named) > len(w.requests) * 0.9
    # a request no step names (between two sparse steps) stays on its own instance
    want = {
        ("api-7f3a", s.request_id): {"engine-9c1e" if s.request_id in named else "api-7f3a"}
        for s in w.requests
    }
    assert _engines(conn) == want


def test_engine_in_another_process_has_the_kv_pressure(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.kv_cache_pressure()
    reqs = [replace(s, instance="api-7f3a") for s in w.requests]
    steps = [
        replace(s, instance="engine-9c1e", request_ids=_decoding(reqs, s.start_ns))
        for s in w.engine_steps
    ]
    findings = build_report(write_workload(Workload(reqs, engine_steps=steps)))["findings"]
    kv = next(f for f in findings if f["complaint"] == "kv_cache_pressure")
    # requests arriving while their engine's cache was full: none were named before
    assert len(kv["affected_trace_ids"]) > 50


def test_trace_view_shows_the_engine_in_another_process(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = _engine_process(workloads.stutter())
    conn = write_workload(w)
    stalled = next(s for s in w.requests if s.stall_count)
    view = trace_data(conn.cursor(), stalled.trace_id)["requests"][0]
    steps = view["engine_steps"]
    assert steps["served"] > 0 and steps["overlapping"] >= steps["served"], steps
    assert any(s["prefill_tokens"] == BIG for s in view["timeline"]["steps"])


def _two_replicas() -> Workload:
    """Replicas `a` and `b`, each its engine in its own process, the same arrivals and the
    same counter ids at the same moments; only `a` ran big prefills, so only its streams froze."""
    a = workloads.stutter()
    rng = random.Random(6)  # workloads.stutter's arrivals and gaps, before its freezes
    raw = workloads._base(rng, 600, lambda t: 1.5, output=150)
    workloads.serve(rng, raw, Server(slots=16))
    b = workloads.summarize(rng, raw)
    assert [s.request_id for s in b] == [s.request_id for s in a.requests]
    reqs_a = [replace(s, instance="a") for s in a.requests]
    reqs_b = [replace(s, instance="b") for s in b]
    steps = _steps(reqs_a, "a", _big_prefills(a), random.Random(1)) + _steps(
        reqs_b, "b", [], random.Random(2)
    )
    return Workload(reqs_a + reqs_b, engine_steps=steps)


def test_replicas_with_the_same_ids_keep_their_own_steps(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = _two_replicas()
    conn = write_workload(w)
    engines = _engines(conn)
    assert len(engines) == len(w.requests)
    assert all(found == {instance} for (instance, _), found in engines.items())
    # b's smooth streams decoded beside a's big prefills, under the same ids: borrowed,
    # they would count as smooth streams beside large prefills and hide the link
    linked = next(
        e for e in _stutter_finding(conn)["evidence"] if "stalled_with_large_prefill" in e
    )
    assert linked["stalled_with_large_prefill"] > 0.9, linked
    assert linked["smooth_with_large_prefill"] < 0.2, linked
    b_request = next(
        s for s in w.requests if s.instance == "b" and s.output_tokens and s.output_tokens > 50
    )
    view = trace_data(conn.cursor(), b_request.trace_id)["requests"][0]
    assert view["engine_steps"]["served"] > 0
    assert not any(s["prefill_tokens"] == BIG for s in view["timeline"]["steps"]), (
        "a's steps shown for b"
    )
