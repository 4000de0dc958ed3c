"""Engine start-ups: a trace of an engine loading its model, recognized as one.

vLLM exports a trace at every start (`@instrument` spans of its front end, engine core
and workers: `Overall Loading` around `Load weights`, `Allocate KV cache`, …), which
yields no request.  It is the best cold-start evidence there is: the collector keeps it
whole and writes one `engine_starts` row (docs/report.md, the cold_start finding).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import instance_of

#: vLLM's start-up spans (`vllm/tracing`'s `instrument(span_name=...)`): a trace holding
#: one of these, sent from vLLM's tracer, is a start-up.
VLLM_STARTUP_SPANS = frozenset({
    "Overall Loading", "Load weights", "Load model", "Allocate KV cache", "EngineCoreProc init",
    "Executor init", "Worker init", "Initialize model", "Prepare model",
})  # fmt: skip
#: The resource key vLLM's tracer sets on every span it sends.
VLLM_TRACER = "vllm.instrumenting_module_name"


@dataclass(slots=True)
class EngineStart:
    """One engine start-up: who started, when, and how long each phase took."""

    trace_id: str
    service: str
    instance: str
    start_ns: int
    end_ns: int
    #: phase name -> ms, in the order the phases started (a name that repeats, nested, is
    #: its longest span's: the outer one holds the inner)
    phases: dict[str, float] = field(default_factory=dict)

    def phases_json(self) -> str:
        """Gives the phases as the `engine_starts.phases` column stores them."""
        return json.dumps(self.phases, ensure_ascii=False)


def root_of(spans: Sequence[Span]) -> Span:
    """Gives the trace's root: its earliest span whose parent is not in it."""
    ids = {s.span_id for s in spans}
    tops = [s for s in spans if not s.parent_span_id or s.parent_span_id not in ids]
    return min(tops or spans, key=lambda s: (s.start_ns, -s.end_ns))


def recognize_start(spans: Sequence[Span]) -> EngineStart | None:
    """Gives the engine start-up the trace is (vLLM's), None when it is none."""
    if not spans or not any(s.name in VLLM_STARTUP_SPANS for s in spans):
        return None
    if not any(VLLM_TRACER in s.resource for s in spans):
        return None
    root = root_of(spans)
    phases: dict[str, float] = {}
    for s in sorted(spans, key=lambda s: (s.start_ns, -s.end_ns)):
        took = max(0, s.end_ns - s.start_ns) / 1e6
        phases[s.name] = round(max(took, phases.get(s.name, 0.0)), 3)
    # the front end's process (the root's) is the one that then serves the requests
    instance, _ = instance_of(root.attributes, root.resource)
    return EngineStart(
        trace_id=root.trace_id,
        service=root.service_name,
        instance=instance,
        start_ns=min(s.start_ns for s in spans),
        end_ns=max(s.end_ns for s in spans),
        phases=phases,
    )
