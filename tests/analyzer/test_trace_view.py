"""`TraceView`: the request's context read from the spans around it, and the instance
that names its process (docs/conventions.md)."""

from __future__ import annotations

import time

import pytest

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span
from tokentrace.analyzer.trace_view import CONTEXT_KEYS, TENANT_KEYS, TraceView, instance_of

from . import spanfactory as f

APP = {"service.name": "chat-app", "service.instance.id": "app-1"}


def _wrapped_vllm(app_attrs: dict[str, object], app_resource: dict[str, object] | None = None) -> list[Span]:
    """vLLM's span below an instrumented OpenAI call (openai.chat → httpx POST), inside the
    application's own span: what tests/data/engines/tenants.jsonl holds."""
    spans, _ = f.vllm_trace(10.0, 20.0, 100.0)
    (llm,) = spans
    tid = llm.trace_id
    app = f.span(tid, "handle_request", -5, 150, attrs=app_attrs, resource=app_resource or APP)
    call = f.span(tid, "openai.chat", -3, 140, app, kind=KIND_CLIENT,
                  attrs={"gen_ai.operation.name": "chat"})  # fmt: skip
    post = f.span(tid, "POST", -2, 135, call, kind=KIND_CLIENT, attrs={"http.method": "POST"})
    llm.parent_span_id = post.span_id
    return [app, call, post, llm]


def test_tenant_traffic_and_environment_from_the_application_span() -> None:
    spans = _wrapped_vllm(
        {"tenant.id": "acme", "tokentrace.traffic_class": "batch"},
        {**APP, "deployment.environment.name": "staging"},
    )
    (row,) = summarize_trace(spans).requests
    assert (row.tenant, row.traffic_class, row.environment) == ("acme", "batch", "staging")


def test_the_request_own_spans_come_before_its_ancestors() -> None:
    spans = _wrapped_vllm({"tenant.id": "outer", "deployment.environment": "prod"})
    call = next(s for s in spans if s.name == "openai.chat")
    call.attributes["tenant.id"] = "own"  # the client span is the request's own
    (row,) = summarize_trace(spans).requests
    assert (row.tenant, row.environment) == ("own", "prod")


def test_the_nearest_ancestor_wins() -> None:
    spans = _wrapped_vllm({"tenant.id": "inner"})
    app = spans[0]
    outer = f.span(app.trace_id, "job", -10, 200, attrs={"tenant.id": "outer"}, resource=APP)
    app.parent_span_id = outer.span_id
    (row,) = summarize_trace([outer, *spans]).requests
    assert row.tenant == "inner"


def test_an_empty_value_is_none() -> None:
    spans = _wrapped_vllm({"tenant.id": "acme"})
    next(s for s in spans if s.name == "openai.chat").attributes["tenant.id"] = ""
    (row,) = summarize_trace(spans).requests
    assert row.tenant == "acme"


def test_no_context_anywhere_stays_empty() -> None:
    (row,) = summarize_trace(_wrapped_vllm({})).requests
    assert (row.tenant, row.traffic_class, row.environment) == ("", "interactive", "")


def _chain(n: int, tenant_at: int | None) -> list[Span]:
    """`n` spans, each the parent of the next; the one at `tenant_at` names a tenant."""
    tid = f.new_id(32)
    spans: list[Span] = []
    for i in range(n):
        attrs = {"tenant.id": f"t{i}"} if i == tenant_at else {}
        spans.append(f.span(tid, f"s{i}", i, 1, spans[-1] if spans else None, attrs=attrs))
    return spans


def test_inherited_is_the_plain_walk() -> None:
    spans = _chain(6, tenant_at=2)
    view = TraceView(spans)
    got = [view.inherited(s, (TENANT_KEYS,))[0] for s in reversed(spans)]  # memo filled deepest first
    assert got[::-1] == [None, None, None, "t2", "t2", "t2"]


def test_inherited_in_a_loop_of_parent_ids() -> None:
    # s0 → s1 → s2 → s0 (a sender's loop), s3 hangs from s2; s1 names the tenant
    spans = _chain(4, tenant_at=1)
    s0, s1, s2, s3 = spans
    s0.parent_span_id, s1.parent_span_id, s2.parent_span_id = s2.span_id, s0.span_id, s1.span_id
    s3.parent_span_id = s2.span_id
    view = TraceView(spans)
    plain = {
        s.span_id: next((a.attributes["tenant.id"] for a in view.ancestors(s) if a.attributes), None)
        for s in spans
    }
    for start in (s3, s0, s1, s2):  # any order of asking gives the plain walk's answers
        fresh = TraceView(spans)
        fresh.inherited(start)
        assert {s.span_id: fresh.inherited(s)[0] for s in spans} == plain
    assert plain[s1.span_id] is None  # itself is not its own ancestor


@pytest.mark.slow
def test_a_long_chain_costs_its_spans_once() -> None:
    spans = _chain(20_000, tenant_at=0)
    view = TraceView(spans)
    t0 = time.perf_counter()
    for s in spans:
        assert view.inherited(s, CONTEXT_KEYS)[0] == ("t0" if s is not spans[0] else None)
    # a walk up from each span would visit 2e8 parents (many seconds)
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize(
    ("resource", "instance", "instance_id"),
    [
        # vLLM names its process by pid (str(os.getpid())); OpenTelemetry adds a random id
        ({"vllm.process_id": "5092", "service.instance.id": "b140ec11"}, "pid 5092", "b140ec11"),
        ({"vllm.process_id": "5092", "host.name": "gpu-3"}, "gpu-3 pid 5092", None),
        ({"vllm.process_id": 77, "host.id": "ab12", "host.name": ""}, "ab12 pid 77", None),
        # any other sender: the instance as before, the OpenTelemetry id beside it
        ({"service.instance.id": "i-1", "process.pid": 9}, "i-1", "i-1"),
        ({"process.pid": 9}, "9", None),
        ({}, "", None),
    ],
)
def test_instance_of(resource: dict[str, object], instance: str, instance_id: str | None) -> None:
    assert instance_of({}, resource) == (instance, instance_id)


def test_request_rows_carry_both() -> None:
    spans, _ = f.vllm_trace(5.0, 10.0, 50.0, resource={**f.VLLM_RESOURCE, "service.instance.id": "r"})
    (row,) = summarize_trace(spans).requests
    assert (row.instance, row.instance_id) == ("pid 4242", "r")
    sdk, _ = f.sdk_trace(1.0, 2.0, 10.0, 5.0, 4)
    (row,) = summarize_trace(sdk).requests
    assert (row.instance, row.instance_id) == ("i0", "i0")
    assert next(s for s in sdk if s.kind == KIND_SERVER).resource["service.instance.id"] == "i0"
