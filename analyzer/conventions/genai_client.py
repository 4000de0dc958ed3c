"""Adapter for client-side LLM spans when no server convention is in the trace.

Understands OpenTelemetry GenAI client spans (kind CLIENT,
`gen_ai.operation.name`, `gen_ai.usage.*`, `gen_ai.response.time_to_first_chunk`),
OpenInference LLM spans (INTERNAL) with their `"First Token Stream Event"`, OpenLLMetry's
per-chunk events (user-side token times: `_client_times.py`), and plain HTTP server spans
beneath them.  With a server span, network = client − server duration.  Without
server-side phases the wait before the first token cannot be split between
queue and prefill: it is counted as prefill and the request is flagged
`server_unseen`.  Without per-chunk times, or with a chunk list the SDK cut short
(`client_events_dropped`), a streamed answer of more than one token (its first chunk's
time known) decodes from the first chunk to the end of the client span, which ends when
the stream does.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._client_errors import stream_aborted
from tokentrace.analyzer.conventions._client_times import (
    CHUNK_EVENTS,
    FIRST_TOKEN_EVENT,
    read_client_times,
)
from tokentrace.analyzer.conventions._common import attr_any, build_summary, inside_any
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span
from tokentrace.analyzer.trace_view import TraceView
from tokentrace.instrumentation import semconv as sc

NAME = "genai_client"
#: a client sees no server phases: its queue is all `other` (the columns of these read 0)
UNMEASURED_PARTS = frozenset({"queue_wait", "tokenize"})
LLM_PREFIXES = ("gen_ai.", "llm.")
INPUT_TOKENS = (sc.PROMPT_TOKENS, "gen_ai.usage.prompt_tokens", "llm.token_count.prompt", "llm.usage.prompt_tokens")
OUTPUT_TOKENS = (sc.OUTPUT_TOKENS, "gen_ai.usage.completion_tokens", "llm.token_count.completion", "llm.usage.completion_tokens")
MODEL_KEYS = ("llm.model_name", "llm.request.model")


def is_llm_client(span: Span) -> bool:
    # checked on every span of every trace: the cheap tests first
    if span.name == sc.SPAN_CLIENT:
        return True
    a = span.attributes
    if span.kind == KIND_CLIENT and any(k.startswith(LLM_PREFIXES) for k in a):
        # any GenAI / OpenLLMetry attribute marks it: a sender may leave out the usual
        # markers (gen_ai.operation.name, gen_ai.system, llm.request.type, llm.model_name)
        return True
    if "openinference.span.kind" in a and a["openinference.span.kind"] == "LLM":
        return True
    return bool(span.events) and any(e.name in CHUNK_EVENTS or e.name == FIRST_TOKEN_EVENT for e in span.events)


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    return [summarize_client(trace, c) for c in outer_clients(trace)]


def outer_clients(trace: TraceView) -> list[Span]:
    """Gives the LLM client spans that are requests: the outermost (wrappers nest)."""
    clients = [x for x in trace.spans if is_llm_client(x)]
    if len(clients) < 2:
        return clients
    # remembered for every span on the way up: a chain of n wrappers walked afresh from
    # each would cost n^2/2 (a hostile export); loops of parent ids answered as the walk
    nested = inside_any(trace, is_llm_client)
    return [c for c in clients if not nested(c)]


def _server_below(trace: TraceView, client: Span) -> Span | None:
    """Gives the outermost server span below `client`: one with no server span between
    them (a gateway's, not the backend's behind it, whatever their clocks say), the
    earliest, then the longest, where there are several (retries)."""
    servers: list[Span] = []
    seen = {client.span_id}  # a sender's parent ids may loop: each span once
    stack = list(trace.children.get(client.span_id, ()))
    while stack:
        x = stack.pop()
        if x.span_id in seen:
            continue
        seen.add(x.span_id)
        if x.kind == KIND_SERVER:
            servers.append(x)  # what lies below it is its own
        else:
            stack.extend(trace.children.get(x.span_id, ()))
    return min(servers, key=lambda x: (x.start_ns, -x.duration_ns), default=None)


def summarize_client(trace: TraceView, client: Span) -> s.RequestSummary:
    """Gives the request summary of one LLM client span (an outer one)."""
    rd = ValueReader()
    times = read_client_times(client, rd)
    offsets, ttft_client = times.chunks_ms, times.first_token_ms
    server = _server_below(trace, client)
    client_ns = client.duration_ns
    server_ns = server.duration_ns if server is not None else client_ns
    network_ns = client_ns - server_ns if server is not None else 0
    # a list the SDK cut short counts neither the tokens nor the decode from its first
    counted = len(offsets) if not times.truncated else 0
    output_tokens = rd.count(attr_any(client, OUTPUT_TOKENS)) or (counted or None)
    decode_ns: int | None = None
    if len(offsets) > 1 and not times.truncated:
        decode_ns = round((offsets[-1] - offsets[0]) * NS_PER_MS)
    elif ttft_client is not None and ((output_tokens or 0) > 1 or len(offsets) > 1):
        # streamed (its first chunk came) with no later chunk times, or only the ones the
        # SDK kept: the stream, and the span with it, ends at the last token; both times
        # are the client's
        after_first_ns = client_ns - round(ttft_client * NS_PER_MS)
        decode_ns = after_first_ns if after_first_ns >= 0 else None
    # the first-token wait as the server lived it: the user's TTFT minus the wire
    # (both ways, an upper bound of the one-way part, so prefill is never overstated)
    prefill_ns = 0
    if ttft_client is not None:
        prefill_ns = max(0, round(ttft_client * NS_PER_MS) - max(0, network_ns))
    part = partition(
        server_ns=server_ns,
        client_ns=client_ns if server is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
    )
    flags = [s.FLAG_SERVER_UNSEEN]
    aborted = stream_aborted(client)  # no server span tells of it: vLLM sends none
    if aborted:
        flags.append(s.FLAG_STREAM_ABORTED)
    if not offsets:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
    root = server if server is not None else client
    summary = build_summary(
        trace,
        root,
        part,
        source=NAME,
        request_id=str(attr_any(client, ("gen_ai.response.id", sc.REQUEST_ID)) or client.span_id),
        related=[client],
        client=None,
        ttft_ms=None,
        prompt_tokens=rd.count(attr_any(client, INPUT_TOKENS)),
        output_tokens=output_tokens,
        token_offsets_ms=offsets,
        token_times_source=s.TOKEN_TIMES_CLIENT,
        flags=flags,
        reader=rd,
        extra_model_keys=MODEL_KEYS,
        decode_measured=decode_ns is not None,
        error=aborted,
    )
    summary.start_ns = client.start_ns
    summary.ttft_client_ms = ttft_client
    return summary
