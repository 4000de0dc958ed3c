"""Deciding one trace (`collector/deciding.py`): from a pending trace and the sampler to
its summaries, whether its spans are kept and why, with nothing written or counted."""

from __future__ import annotations

from collections.abc import Sequence

from otlp_traces import T0, new_id, request_trace, to_protobuf

from tokentrace.analyzer.spans import KIND_INTERNAL, Span
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.collector.deciding import UNSUMMARIZED_DECISION, decide_trace
from tokentrace.collector.decode_pool import decode_export, unpack
from tokentrace.collector.sampling import AttributeRule, Decision, P99Tracker, Sampler
from tokentrace.collector.trace_buffer import PendingTrace
from tokentrace.instrumentation import semconv as sc
from tokentrace.store.reasons import REASON_DROPPED, REASON_ERROR, REASON_RULE


def _sampler(**kw: object) -> Sampler:
    return Sampler(baseline=0.0, p99=P99Tracker(warmup=0), **kw)  # type: ignore[arg-type]


def _pending(spans: list[Span]) -> PendingTrace:
    return PendingTrace(list(spans), 0)


def _packed(spans: list[Span]) -> PendingTrace:
    """The trace as a decode worker hands it over: packed, with the worker's summary."""
    (trace,) = unpack(decode_export(to_protobuf(spans).SerializeToString())[0])
    return PendingTrace([], 0, trace)


def test_an_unremarkable_trace_is_summarized_and_dropped() -> None:
    spans = request_trace()
    outcome = decide_trace(spans[0].trace_id, _pending(spans), _sampler())
    assert outcome.decision == Decision(False, REASON_DROPPED, 1.0)
    assert [r.trace_id for r in outcome.result.requests] == [spans[0].trace_id]
    assert (outcome.duplicates, outcome.failure, outcome.itl_counts) == (0, None, None)


def test_an_error_trace_is_kept_with_its_spans() -> None:
    spans = request_trace(error=True)
    outcome = decide_trace(spans[0].trace_id, _pending(spans), _sampler())
    assert outcome.decision is not None and outcome.decision.keep
    assert outcome.decision.reason == REASON_ERROR
    assert outcome.spans == spans


def test_a_retried_span_is_summarized_once_and_its_repeats_counted() -> None:
    spans = request_trace()
    p = _pending(spans + spans[:2])  # an exporter sent two of its spans again
    outcome = decide_trace(spans[0].trace_id, p, _sampler())
    assert outcome.duplicates == 2
    assert len(outcome.result.requests) == 1
    assert p.spans == spans


def test_a_packed_trace_dropped_stays_packed_and_is_decided_on_the_workers_summary() -> None:
    spans = request_trace()
    p = _packed(spans)
    outcome = decide_trace(spans[0].trace_id, p, _sampler())
    assert outcome.decision == Decision(False, REASON_DROPPED, 1.0)
    assert outcome.spans is None and p.packed is not None  # never unpacked
    assert len(outcome.result.requests) == 1
    assert outcome.itl_counts is p.packed.itl_counts  # the worker's, when it made them


def test_a_packed_trace_with_a_failed_span_is_kept_and_unpacked() -> None:
    spans = request_trace(error=True)
    p = _packed(spans)
    outcome = decide_trace(spans[0].trace_id, p, _sampler())
    assert outcome.decision is not None and outcome.decision.reason == REASON_ERROR
    assert p.packed is None and outcome.spans is not None
    assert [s.span_id for s in outcome.spans] == [s.span_id for s in spans]


def test_attribute_rules_read_the_spans_of_a_packed_trace() -> None:
    spans = request_trace(attributes={"tenant.id": "acme"})
    sampler = _sampler(rules=[AttributeRule("tenant.id", "acme")])
    outcome = decide_trace(spans[0].trace_id, _packed(spans), sampler)
    assert outcome.decision is not None and outcome.decision.reason == REASON_RULE


def test_a_trace_of_engine_steps_only_is_no_decision() -> None:
    starts = "[" + ",".join([str(T0)] * 3) + "]"
    trace_id = new_id(16)
    carrier = [
        Span(
            trace_id, new_id(8), "", sc.SPAN_ENGINE_STEPS, KIND_INTERNAL, T0, T0 + 1000,
            {sc.STEP_START_NS: starts, sc.STEP_DURATION_US: "[1,1,1]", sc.STEP_COUNT: 3},
            {sc.SERVICE_NAME: "engine"},
        )  # fmt: skip
        for _ in range(2)
    ]
    outcome = decide_trace(trace_id, _pending(carrier), _sampler())
    assert outcome.decision is None
    assert len(outcome.result.engine_steps) == 6 and not outcome.result.requests


class _FailingSampler(Sampler):
    """A sampler with a bug: every decision raises."""

    def decide(
        self,
        trace_id: str,
        spans: Sequence[Span],
        requests: Sequence[RequestSummary],
        *,
        span_error: bool | None = None,
    ) -> Decision:
        raise RuntimeError("a sampler bug")


def test_a_trace_the_sampler_fails_on_is_kept_whole_and_says_why() -> None:
    spans = request_trace()
    p = _packed(spans)
    outcome = decide_trace(spans[0].trace_id, p, _FailingSampler(baseline=0.0))
    assert outcome.decision == UNSUMMARIZED_DECISION
    assert isinstance(outcome.failure, RuntimeError)
    assert outcome.spans is not None and len(outcome.spans) == len(spans)
    assert len(outcome.result.requests) == 1  # the summary is still written


def test_deciding_leaves_the_summaries_to_the_round() -> None:
    # the round writes the decision into each summary as it commits it (`RoundBatch.add`)
    spans = request_trace(error=True)
    outcome = decide_trace(spans[0].trace_id, _pending(spans), _sampler())
    (request,) = outcome.result.requests
    assert (request.kept, request.sample_reason) == (False, "")
