"""One small adapter per span convention: spans of one trace in, request summaries out.

Each adapter module exposes ``NAME`` and ``summarize(trace: TraceView) ->
list[RequestSummary]`` (empty when the trace holds no request of its
convention).  `ADAPTERS` is tried in order; the first that yields wins, so
server-side conventions (which see the phases) come before the client-only one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from tokentrace.analyzer.conventions import genai_client, sglang, tgi, tokentrace_sdk, vllm
from tokentrace.analyzer.summary import RequestSummary
from tokentrace.analyzer.trace_view import TraceView

Adapter = Callable[[TraceView], list[RequestSummary]]

ADAPTERS: Sequence[tuple[str, Adapter]] = (
    (tokentrace_sdk.NAME, tokentrace_sdk.summarize),
    (vllm.NAME, vllm.summarize),
    (sglang.NAME, sglang.summarize),
    (tgi.NAME, tgi.summarize),
    (genai_client.NAME, genai_client.summarize),
)

#: Queue parts (`queue_wait`, `tokenize`) a convention does not measure: their columns
#: read 0 (the schema keeps them NOT NULL), and pages show them as "—", not "0.0 ms".
UNMEASURED_PARTS: Mapping[str, frozenset[str]] = {
    vllm.NAME: vllm.UNMEASURED_PARTS,
    genai_client.NAME: genai_client.UNMEASURED_PARTS,
}
