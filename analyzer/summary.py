"""The request summary (docs/design.md §2): one row per request, kept or not.

Field names are the column names of the `requests` table and of
`tokentrace requests` output; times are milliseconds unless the name says
otherwise.  `None` means "not measured", never zero.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

# Flags set when attribution had to clamp or reconcile (docs/design.md §2).
FLAG_NEGATIVE_NETWORK = "negative_network"
FLAG_BUCKET_EXCEEDS_E2E = "bucket_exceeds_e2e"
FLAG_SOURCES_DISAGREE = "sources_disagree"
FLAG_NO_TOKEN_TIMES = "no_token_times"
FLAG_ROOT_MISSING = "root_missing"
#: Only the client side was traced: the wait before the first token is not split.
FLAG_SERVER_UNSEEN = "server_unseen"
#: Token times but no prefill phase (tokentrace SDK): the wait before the first token
#: cannot be split, and all of it is counted as queue (`other`), prefill as 0.
FLAG_PREFILL_UNMARKED = "prefill_unmarked"
#: A reported count could not be one (below zero, or beyond what the store holds): dropped.
FLAG_IMPOSSIBLE_COUNT = "impossible_count"
#: A reported time could not be one (NaN, ±inf, negative, beyond 2^63−1 ns; a span or
#: token time before its request's start; token times out of order): dropped or sorted.
FLAG_IMPOSSIBLE_VALUE = "impossible_value"
#: The server answered without running the model (TGI: 429 overloaded, 422 validation
#: error, a client gone while queued): only its time is known, no prefill, decode or TTFT.
FLAG_NO_INFERENCE = "no_inference"
#: No span named the model (vLLM's V1 engine and TGI never send one): `model` holds the
#: service name.
FLAG_MODEL_UNNAMED = "model_unnamed"
#: The client span's SDK dropped events past its limit (128 by default, the oldest first
#: in Python, Go and JS): its chunk times are not the whole stream, and its first kept
#: chunk is not the first token.
FLAG_CLIENT_EVENTS_DROPPED = "client_events_dropped"
#: Seen only by its client, a stream that ended without a finish reason (the client closed
#: it, or the connection dropped): the answer was cut short, so the request is an error.
FLAG_STREAM_ABORTED = "stream_aborted"
#: Token counts are INTEGER columns (the `requests` table).
MAX_TOKEN_COUNT = 2**31 - 1

# Where a request's token times (ITL, stalls) came from (docs/buckets.md): the server's own
# (the SDK's token offsets, an engine's steps), else the client span's chunks, else none.
TOKEN_TIMES_SERVER = "server"
TOKEN_TIMES_CLIENT = "client"
TOKEN_TIMES_NONE = "none"


@dataclass(slots=True)
class RequestSummary:
    trace_id: str
    request_id: str
    start_ns: int
    e2e_ms: float
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    network_ms: float | None = None
    server_ms: float = 0.0
    # queue sub-parts (they add up to queue_ms)
    queue_wait_ms: float = 0.0
    tokenize_ms: float = 0.0
    other_ms: float = 0.0
    ttft_ms: float | None = None  # as the server saw it
    ttft_client_ms: float | None = None  # as the user saw it
    tpot_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p95_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_max_ms: float | None = None
    stall_count: int | None = None
    token_times_source: str = TOKEN_TIMES_NONE  # what the gaps above were read from
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    model: str = ""
    tenant: str = ""
    traffic_class: str = "interactive"
    service: str = ""
    instance: str = ""  # the process as a person names it (vLLM: host and pid)
    instance_id: str | None = None  # OpenTelemetry's service.instance.id, None without
    environment: str = ""
    route: str = ""
    cold_start: bool = False
    error: bool = False
    gpu_util_mean: float | None = None
    gpu_mem_max_bytes: int | None = None
    source: str = ""  # the span convention it came from: tokentrace, vllm, sglang, tgi, genai_client
    flags: list[str] = field(default_factory=list)
    # filled by the collector at decision time
    kept: bool = False
    sample_reason: str = ""
    sample_weight: float = 1.0
    #: inter-token gaps in ms (not stored as a column; used for ITL percentiles)
    itl_gaps_ms: list[float] = field(default_factory=list)

    def as_row(self) -> dict[str, Any]:
        row = asdict(self)
        row.pop("itl_gaps_ms")
        return row


#: Column order of the `requests` table and of `tokentrace requests` output.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(RequestSummary) if f.name != "itl_gaps_ms")
