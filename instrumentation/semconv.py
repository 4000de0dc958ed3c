"""tokentrace's span and attribute names: defined once, here, and documented.

The SDK emits these; the analyzer's `tokentrace` adapter reads them.  Anything
that is also an OpenTelemetry GenAI semantic convention uses the OTel name, so
other tools understand our spans too.

Span tree of one request, as the SDK emits it::

    tokentrace.request            kind SERVER (the outermost server span)
    ├── tokentrace.tokenize       host time turning the prompt into ids
    ├── tokentrace.queue          waiting in the scheduler before the first step
    ├── tokentrace.prefill        first prefill step start → first output token
    ├── tokentrace.decode         first output token → last output token
    └── tokentrace.detokenize     ids → text (may repeat per chunk; summed)

A phase a request runs more than a few times (a streaming server detokenizes
once per token) gets no span per call: the request span carries its number of
calls and their summed time, ``<its span name>.calls`` and ``.total_us``
(``tokentrace.detokenize.calls``, ``tokentrace.detokenize.total_us``).  The
scheduler's stages (queue, prefill, decode) always stay spans.

Token times travel as one compact attribute on the request span
(``tokentrace.token.offsets_us``): a list of ints, each the time of one
output token in microseconds after the request span's start.  One attribute
per request, not one event per token, keeps recording a token an append.

Engine steps (continuous-batching scheduler iterations) travel as spans named
``tokentrace.engine.steps``, each carrying a *batch* of steps as parallel
lists (see ``STEP_*``); they are not part of any request trace.

Those lists (``PACKED_LISTS``) are sent *packed*: one string attribute holding
the list as JSON (``"[1250,1890,2433]"``), not an OTLP array.  OpenTelemetry
checks, and the OTLP encoder wraps, every element of an array one by one: for
a 512-step span that is ~11 µs a step on the exporting thread, beside the
model; one JSON string costs ~1 µs a step.  Readers take both forms
(``unpack_list``): OTLP arrays from older SDKs and other senders still work.

The client wrapper emits ``tokentrace.client`` (kind CLIENT) with its own
chunk times (``tokentrace.client.chunk_offsets_us``) and injects `traceparent`,
so the server's request span is its child.
"""

from __future__ import annotations

import json
from typing import Any, Final

# ---- span names -------------------------------------------------------------
SPAN_REQUEST: Final = "tokentrace.request"
SPAN_TOKENIZE: Final = "tokentrace.tokenize"
SPAN_QUEUE: Final = "tokentrace.queue"
SPAN_PREFILL: Final = "tokentrace.prefill"
SPAN_DECODE: Final = "tokentrace.decode"
SPAN_DETOKENIZE: Final = "tokentrace.detokenize"
SPAN_FORWARD: Final = "tokentrace.forward"
SPAN_CLIENT: Final = "tokentrace.client"
SPAN_ENGINE_STEPS: Final = "tokentrace.engine.steps"

#: Phase names as the SDK's ``phase()`` API takes them, mapped to span names.
PHASES: Final[dict[str, str]] = {
    "tokenize": SPAN_TOKENIZE,
    "queue": SPAN_QUEUE,
    "prefill": SPAN_PREFILL,
    "decode": SPAN_DECODE,
    "detokenize": SPAN_DETOKENIZE,
}

# ---- request attributes -----------------------------------------------------
REQUEST_ID: Final = "tokentrace.request.id"
#: bool: the client (or the stream's consumer) went away before the answer's end; not a
#: server error, so the span status is left unset.
REQUEST_DISCONNECTED: Final = "tokentrace.request.disconnected"
#: int[] (packed): each output token's time, µs after the request span's start.
TOKEN_OFFSETS_US: Final = "tokentrace.token.offsets_us"
#: int: output tokens (also OTel's gen_ai.usage.output_tokens)
PROMPT_TOKENS: Final = "gen_ai.usage.input_tokens"
OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
REQUEST_MODEL: Final = "gen_ai.request.model"
RESPONSE_MODEL: Final = "gen_ai.response.model"
OPERATION_NAME: Final = "gen_ai.operation.name"
TENANT: Final = "tokentrace.tenant"
TRAFFIC_CLASS: Final = "tokentrace.traffic_class"
TRAFFIC_INTERACTIVE: Final = "interactive"
TRAFFIC_BATCH: Final = "batch"
ROUTE: Final = "http.route"
#: bool: first request(s) after process start or a long idle gap.
COLD_START: Final = "tokentrace.cold_start"
#: str: prompt / completion text, recorded only when the user opts in.
PROMPT_TEXT: Final = "tokentrace.prompt"
COMPLETION_TEXT: Final = "tokentrace.completion"
#: GPU summary over the request's lifetime (from the NVML sampler).
GPU_UTIL_MEAN: Final = "tokentrace.gpu.utilization_mean"
GPU_MEM_MAX_BYTES: Final = "tokentrace.gpu.memory_used_max_bytes"

#: A phase summarized on the request span (see above): ``<span name>`` + these suffixes.
#: int: its calls in the request
PHASE_CALLS_SUFFIX: Final = ".calls"
#: int: their summed time, µs
PHASE_TOTAL_US_SUFFIX: Final = ".total_us"
#: the tokenizer's phases summarized (``wrap_tokenizer``): tokenize's time is part of the
#: queue bucket (the analyzer reads it from the spans, or from ``TOKENIZE_TOTAL_US``)
TOKENIZE_CALLS: Final = "tokentrace.tokenize.calls"
TOKENIZE_TOTAL_US: Final = "tokentrace.tokenize.total_us"
DETOKENIZE_CALLS: Final = "tokentrace.detokenize.calls"
DETOKENIZE_TOTAL_US: Final = "tokentrace.detokenize.total_us"

# ---- forward-pass attributes (SPAN_FORWARD or engine steps) -----------------
FORWARD_HOST_US: Final = "tokentrace.forward.host_us"
FORWARD_GPU_US: Final = "tokentrace.forward.gpu_us"

# ---- client attributes ------------------------------------------------------
#: int[] (packed): each streamed chunk's arrival, µs after the client span's start.
CLIENT_CHUNK_OFFSETS_US: Final = "tokentrace.client.chunk_offsets_us"
#: float seconds, the OTel GenAI name for the user-side time to first chunk.
CLIENT_TTFC_S: Final = "gen_ai.response.time_to_first_chunk"

# ---- engine-step batches (parallel lists, one entry per step; packed) ---------
STEP_START_NS: Final = "tokentrace.step.start_ns"  # int[] absolute unix ns
STEP_DURATION_US: Final = "tokentrace.step.duration_us"  # int[]
STEP_PREFILL_TOKENS: Final = "tokentrace.step.prefill_tokens"  # int[]
STEP_DECODE_SEQS: Final = "tokentrace.step.decode_seqs"  # int[]
STEP_BATCH_SIZE: Final = "tokentrace.step.batch_size"  # int[]
STEP_QUEUE_DEPTH: Final = "tokentrace.step.queue_depth"  # int[]
STEP_KV_USAGE: Final = "tokentrace.step.kv_usage"  # float[] 0..1, -1 when unknown
STEP_GPU_US: Final = "tokentrace.step.gpu_us"  # int[] -1 when unknown
#: str[]: per step, the ids of the requests it served, joined by ",".
STEP_REQUEST_IDS: Final = "tokentrace.step.request_ids"

# ---- resource attributes ----------------------------------------------------
SERVICE_NAME: Final = "service.name"
SERVICE_INSTANCE: Final = "service.instance.id"
DEPLOYMENT_ENV: Final = "deployment.environment.name"
DEPLOYMENT_ENV_OLD: Final = "deployment.environment"
PROCESS_PID: Final = "process.pid"

# ---- GPU samples (OTLP metrics; the collector stores them in gpu_samples) -----
METRIC_GPU_UTIL: Final = "tokentrace.gpu.utilization"  # gauge, percent
METRIC_GPU_MEM_USED: Final = "tokentrace.gpu.memory.used"  # gauge, bytes
METRIC_GPU_MEM_TOTAL: Final = "tokentrace.gpu.memory.total"  # gauge, bytes
METRIC_GPU_SM_CLOCK: Final = "tokentrace.gpu.sm_clock"  # gauge, MHz
METRIC_GPU_POWER: Final = "tokentrace.gpu.power"  # gauge, watts
#: data-point attribute naming the GPU
GPU_INDEX: Final = "gpu.index"

# ---- added by the SDK (issue 3) ------------------------------------------------
#: int: forward passes timed inside the request (outside engine steps).
FORWARD_COUNT: Final = "tokentrace.forward.count"
#: int: number of steps carried by one ``tokentrace.engine.steps`` span.
STEP_COUNT: Final = "tokentrace.step.count"
#: int: steps dropped because the bounded step buffer was full.
STEP_DROPPED: Final = "tokentrace.step.dropped"
#: int: streamed chunks the client received.
CLIENT_CHUNKS: Final = "tokentrace.client.chunks"
HTTP_METHOD: Final = "http.request.method"
HTTP_STATUS: Final = "http.response.status_code"
URL_FULL: Final = "url.full"
URL_PATH: Final = "url.path"
SERVER_ADDRESS: Final = "server.address"
#: int[]: per step, host time of the forward passes run inside it (µs, -1 when none).
STEP_FORWARD_HOST_US: Final = "tokentrace.step.forward_host_us"

#: Attributes whose list value the SDK sends packed as one JSON string (see above).
PACKED_LISTS: Final = frozenset(
    (
        TOKEN_OFFSETS_US,
        CLIENT_CHUNK_OFFSETS_US,
        STEP_START_NS,
        STEP_DURATION_US,
        STEP_PREFILL_TOKENS,
        STEP_DECODE_SEQS,
        STEP_BATCH_SIZE,
        STEP_QUEUE_DEPTH,
        STEP_KV_USAGE,
        STEP_GPU_US,
        STEP_REQUEST_IDS,
        STEP_FORWARD_HOST_US,
    )
)

# one encoder, built once: `json.dumps` with separators would build one per call
_encode = json.JSONEncoder(separators=(",", ":")).encode


def pack_list(values: list[Any]) -> str:
    """Gives `values` (ints, floats or strings) as one compact JSON array string."""
    return _encode(values)


def unpack_list(value: Any) -> list[Any]:
    """Gives the list a packed (JSON string) or plain (OTLP array) attribute carries.

    Raises ValueError when `value` is neither, e.g. a packed string cut short
    by an attribute length limit.
    """
    if isinstance(value, list):
        return value
    if isinstance(value, (str, bytes)):
        try:
            out = json.loads(value)
        except ValueError as exc:
            raise ValueError(f"not a JSON list ({len(value)} characters): {exc}") from None
        if isinstance(out, list):
            return out
    raise ValueError(f"expected a list or a JSON list string, got {type(value).__name__}")
