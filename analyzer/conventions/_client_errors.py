"""Errors only a client saw: a stream that ended without a finish reason.

vLLM emits no span for a request its client aborted (docs/conventions.md), so the client's
span is all there is of it.  OpenLLMetry marks a streamed call (`gen_ai.is_streaming`) and
sets its finish reasons when the stream ends (`gen_ai.response.finish_reasons`, not gated
by content capture); a stream closed before that, by the client or a dropped connection,
has none: the user got a cut-short answer, which is an error.  A 4xx/5xx is an ERROR status
on the client span already.
"""

from __future__ import annotations

from tokentrace.analyzer.spans import STATUS_ERROR, Span

#: The attributes that say a call streamed its answer (OpenLLMetry, new and old names).
STREAMING_KEYS = ("gen_ai.is_streaming", "llm.is_streaming")
#: Where a finished stream's finish reasons are: OpenLLMetry's (new, old), OpenInference's.
FINISH_REASON_KEYS = (
    "gen_ai.response.finish_reasons", "llm.response.finish_reason",
    "gen_ai.completion.0.finish_reason", "llm.finish_reason",
)  # fmt: skip


def _said(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return any(_said(v) for v in value)
    return value is not None and str(value).strip() not in ("", "None")


def stream_aborted(client: Span) -> bool:
    """Says whether the client span is a stream that ended without a finish reason."""
    a = client.attributes
    if client.status_code == STATUS_ERROR:
        return False  # an error already, with its own status
    if not any(a.get(k) is True or str(a.get(k)).lower() == "true" for k in STREAMING_KEYS):
        return False
    return not any(_said(a.get(k)) for k in FINISH_REASON_KEYS)
