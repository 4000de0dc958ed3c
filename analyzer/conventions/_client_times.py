"""What a client span says of the tokens its user saw, and which token times a request uses.

A client span times the user's side: each chunk's arrival (the tokentrace SDK's chunk
offsets, OpenLLMetry's one event per chunk), the first token (OpenInference's
"First Token Stream Event", `gen_ai.response.time_to_first_chunk`).  An OpenTelemetry SDK
keeps 128 events a span by default and drops past that (Python, Go and JS the oldest), so
a long stream's event list may lack its first chunks: its first kept event is then no
first token.  docs/conventions.md ("The client side") and docs/buckets.md say what each
instrumentation gives.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span, list_attr
from tokentrace.instrumentation import semconv as sc

#: User-side token-time span events: OpenLLMetry (new and old names), one a chunk.
CHUNK_EVENTS = ("gen_ai.content.completion.chunk", "llm.content.completion.chunk")
#: OpenInference's first-token event.
FIRST_TOKEN_EVENT = "First Token Stream Event"


@dataclass(frozen=True, slots=True)
class ClientTimes:
    """A client span's token times, in ms from its start."""

    #: each chunk's arrival, in order; with `truncated`, only the chunks the SDK kept
    chunks_ms: list[float]
    #: the time to first token as the user saw it (TTFT (user)); None: not measured
    first_token_ms: float | None
    #: the SDK dropped events of the span: `chunks_ms` is not the whole stream
    truncated: bool


def read_client_times(client: Span, reader: ValueReader) -> ClientTimes:
    """Gives the token times `client` carries; `reader` gets the flags they call for."""
    truncated = False
    offsets_us = list_attr(client.attributes, sc.CLIENT_CHUNK_OFFSETS_US)
    if offsets_us:  # an attribute, never cut short by the event limit
        chunks = reader.times_ms(offsets_us, 1 / 1000)
    else:
        times = sorted(e.time_ns for e in client.events if e.name in CHUNK_EVENTS)
        # an event before the span's start is no token time the user saw
        chunks = reader.times_ms([t - client.start_ns for t in times], 1 / NS_PER_MS)
        truncated = client.dropped_events_count > 0
        if truncated:
            reader.flag(s.FLAG_CLIENT_EVENTS_DROPPED)
    if chunks and not truncated:
        return ClientTimes(chunks, chunks[0], truncated)
    return ClientTimes(chunks, _first_token_ms(client, reader), truncated)


def _first_token_ms(client: Span, reader: ValueReader) -> float | None:
    """Gives TTFT (user) from a first-token mark (an event, or an attribute), None without."""
    for e in client.events:
        if e.name == FIRST_TOKEN_EVENT:
            return reader.time_ms((e.time_ns - client.start_ns) / NS_PER_MS)
    ttfc_ns = reader.seconds_ns(client.attributes.get(sc.CLIENT_TTFC_S))
    return None if ttfc_ns is None else ttfc_ns / NS_PER_MS


def best_token_times(
    server_ms: Sequence[float], server_source: str, client: ClientTimes | None
) -> tuple[Sequence[float], str]:
    """Gives the token times a request's gaps are read from, and their source: the server's
    own (`server_source`: the adapter's word for `server_ms`), else the client's chunks.

    Only gaps are read from them, each the difference of two times on one clock, so a
    clock offset between the client's host and the server's does not matter.  A truncated
    chunk list still gives true gaps, of the stream's last chunks (or, from an SDK that
    drops the newest, its first): not the first token's."""
    if server_ms:
        return server_ms, server_source
    if client is not None and client.chunks_ms:
        return client.chunks_ms, s.TOKEN_TIMES_CLIENT
    return (), s.TOKEN_TIMES_NONE
