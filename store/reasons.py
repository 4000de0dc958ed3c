"""Why a trace was kept or dropped: the values of `requests.sample_reason` and `traces.reason`.

The sampler writes them (collector/sampling.py) and the explorer explains them
(web/_trace.py); both read the names from here, so neither imports the other.
Plain strings, no imports: docs/collector.md lists what each one means.
"""

from __future__ import annotations

REASON_ERROR = "error"
REASON_SLO = "slo"
REASON_RULE = "rule"
REASON_BASELINE = "baseline"
REASON_DROPPED = "dropped"
#: Kept because one measure was above the running p99 of its service/model/route.
REASON_P99_TTFT = "p99_ttft"
REASON_P99_E2E = "p99_e2e"
REASON_P99_QUEUE = "p99_queue"
REASON_P99_PREFILL = "p99_prefill"
REASON_P99_DECODE = "p99_decode"
REASON_P99_NETWORK = "p99_network"
REASON_P99_ITL = "p99_itl"
#: Kept because its service/model/route was warming up: one of its first requests (since
#: start, or since a whole window without one), before it has a p99.
REASON_P99_WARMUP = "p99_warmup"
#: Kept whole because the analyzer or the sampler failed on it (the pipeline's fallback).
REASON_UNSUMMARIZED = "unsummarized"
#: Kept whole because it is an engine's start-up (vLLM's: loading weights, allocating the KV
#: cache), the cold-start evidence; it yields no request, and an `engine_starts` row.
REASON_ENGINE_START = "engine_start"

#: The request-summary field watched by each p99 reason.
P99_MEASURES: tuple[tuple[str, str], ...] = (
    ("ttft_ms", REASON_P99_TTFT),
    ("e2e_ms", REASON_P99_E2E),
    ("queue_ms", REASON_P99_QUEUE),
    ("prefill_ms", REASON_P99_PREFILL),
    ("decode_ms", REASON_P99_DECODE),
    ("network_ms", REASON_P99_NETWORK),
    ("itl_max_ms", REASON_P99_ITL),
)
#: Every reason the sampler decides (PIPELINE_REASONS are the pipeline's, not a policy's).
ALL_REASONS: tuple[str, ...] = (
    REASON_ERROR, REASON_SLO, *(r for _, r in P99_MEASURES), REASON_RULE, REASON_P99_WARMUP,
    REASON_BASELINE, REASON_DROPPED,
)  # fmt: skip
#: The reasons the pipeline keeps a trace for before or instead of asking the sampler.
PIPELINE_REASONS: tuple[str, ...] = (REASON_UNSUMMARIZED, REASON_ENGINE_START)
