"""Request specs from real LLM traces, scaled down so a 2-core CPU can replay them.

A trace gives arrival times and prompt/output token counts (never text). Two
knobs make it fit a small machine without losing its shape:
- time compression: arrival offsets are divided by it (10 → ten times faster);
- token scaling: token counts are multiplied and clamped, so a 1,000-token
  prompt becomes ~100 tokens, and the long/short mix survives.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

WORKLOAD_DIR = Path(__file__).resolve().parent.parent / "data" / "workloads"

AZURE_CONV = "azure_conv"
AZURE_CODE = "azure_code"
MOONCAKE_CONVERSATION = "mooncake_conversation"
TRACE_FILES = {
    AZURE_CONV: WORKLOAD_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv",
    AZURE_CODE: WORKLOAD_DIR / "azure_llm_2023" / "AzureLLMInferenceTrace_code.csv",
    MOONCAKE_CONVERSATION: WORKLOAD_DIR / "mooncake_fast25" / "conversation_trace.jsonl",
}


@dataclass(frozen=True)
class TraceRecord:
    """One request as the trace has it: seconds since the trace's first request, token counts."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class RequestSpec:
    """One request to replay: when (seconds after the run starts), how big, who and what kind."""

    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tenant: str = "default"
    traffic_class: str = "interactive"
    source: str = ""
    index: int = 0  # position in the source trace


@dataclass(frozen=True)
class Scaling:
    """How a trace is shrunk to fit the machine."""

    time_compression: float = 1.0
    prompt_scale: float = 0.1
    output_scale: float = 0.5
    min_prompt_tokens: int = 8
    max_prompt_tokens: int = 400
    min_output_tokens: int = 2
    max_output_tokens: int = 128

    def __post_init__(self) -> None:
        if self.time_compression <= 0:
            raise ValueError(f"time_compression must be > 0, got {self.time_compression}")
        if self.prompt_scale <= 0 or self.output_scale <= 0:
            raise ValueError("token scales must be > 0")
        if not 1 <= self.min_prompt_tokens <= self.max_prompt_tokens:
            raise ValueError("need 1 <= min_prompt_tokens <= max_prompt_tokens")
        if not 1 <= self.min_output_tokens <= self.max_output_tokens:
            raise ValueError("need 1 <= min_output_tokens <= max_output_tokens")

    def prompt(self, tokens: int) -> int:
        return _clamp(
            round(tokens * self.prompt_scale), self.min_prompt_tokens, self.max_prompt_tokens
        )

    def output(self, tokens: int) -> int:
        return _clamp(
            round(tokens * self.output_scale), self.min_output_tokens, self.max_output_tokens
        )


# Mooncake prompts are ~12k tokens on average: a smaller scale keeps their spread under the cap.
DEFAULT_SCALING = {
    AZURE_CONV: Scaling(prompt_scale=0.1, output_scale=0.3),
    AZURE_CODE: Scaling(prompt_scale=0.08, output_scale=1.0),
    MOONCAKE_CONVERSATION: Scaling(prompt_scale=0.015, output_scale=0.2),
}


def _clamp(value: int, low: int, high: int) -> int:
    return max(low, min(high, value))


def available_traces() -> list[str]:
    """Return the names of the shipped trace samples."""
    return sorted(TRACE_FILES)


def _parse_azure_time(text: str) -> datetime:
    # Seven fractional digits ("18:15:46.6805900") are more than strptime's %f takes.
    whole, _, fraction = text.strip().partition(".")
    stamp = datetime.strptime(whole, "%Y-%m-%d %H:%M:%S")
    return stamp.replace(microsecond=int((fraction + "000000")[:6]) if fraction else 0)


def _read_azure(path: Path, limit: int | None) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    first: datetime | None = None
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            stamp = _parse_azure_time(row["TIMESTAMP"])
            first = first or stamp
            records.append(
                TraceRecord(
                    arrival_s=(stamp - first).total_seconds(),
                    prompt_tokens=int(row["ContextTokens"]),
                    output_tokens=int(row["GeneratedTokens"]),
                )
            )
            if limit is not None and len(records) >= limit:
                break
    return records


def _read_mooncake(path: Path, limit: int | None) -> list[TraceRecord]:
    records: list[TraceRecord] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            records.append(
                TraceRecord(
                    arrival_s=float(row["timestamp"]) / 1000.0,
                    prompt_tokens=int(row["input_length"]),
                    output_tokens=int(row["output_length"]),
                )
            )
            if limit is not None and len(records) >= limit:
                break
    base = min((r.arrival_s for r in records), default=0.0)
    return sorted(
        (dataclasses.replace(r, arrival_s=r.arrival_s - base) for r in records),
        key=lambda r: r.arrival_s,
    )


def load_trace(name: str, limit: int | None = None, path: Path | None = None) -> list[TraceRecord]:
    """Return the raw records of a shipped trace (or of `path` in that trace's format)."""
    if name not in TRACE_FILES:
        raise ValueError(f"unknown trace {name!r}; available: {available_traces()}")
    source = path or TRACE_FILES[name]
    if name == MOONCAKE_CONVERSATION:
        return _read_mooncake(source, limit)
    return _read_azure(source, limit)


def scale_records(
    records: Iterable[TraceRecord], scaling: Scaling, source: str = "", start_s: float = 0.0
) -> list[RequestSpec]:
    """Return specs with arrival times compressed and token counts scaled and clamped.

    Records before `start_s` (trace time) are skipped; arrival times count from `start_s`.
    """
    specs: list[RequestSpec] = []
    for index, record in enumerate(records):
        if record.arrival_s < start_s:
            continue
        specs.append(
            RequestSpec(
                arrival_s=(record.arrival_s - start_s) / scaling.time_compression,
                prompt_tokens=scaling.prompt(record.prompt_tokens),
                output_tokens=scaling.output(record.output_tokens),
                source=source,
                index=index,
            )
        )
    return specs


def load_workload(
    name: str,
    *,
    scaling: Scaling | None = None,
    limit: int | None = None,
    start_s: float = 0.0,
    duration_s: float | None = None,
) -> list[RequestSpec]:
    """Return replayable specs from a shipped trace.

    `duration_s` keeps only requests arriving within that many seconds of the
    replay (after compression); `limit` caps how many trace rows are read.
    """
    chosen = scaling or DEFAULT_SCALING.get(name, Scaling())
    specs = scale_records(load_trace(name, limit=limit), chosen, source=name, start_s=start_s)
    if duration_s is not None:
        specs = [s for s in specs if s.arrival_s <= duration_s]
    return specs


def with_poisson_arrivals(
    specs: Sequence[RequestSpec], rate_per_s: float, seed: int = 0
) -> list[RequestSpec]:
    """Return the same requests arriving as a Poisson process at `rate_per_s`."""
    if rate_per_s <= 0:
        raise ValueError(f"rate_per_s must be > 0, got {rate_per_s}")
    rng = random.Random(seed)
    now = 0.0
    out: list[RequestSpec] = []
    for spec in specs:
        out.append(dataclasses.replace(spec, arrival_s=now))
        now += rng.expovariate(rate_per_s)
    return out


def with_peak_window(
    specs: Sequence[RequestSpec],
    base_rate_per_s: float,
    peak_rate_per_s: float,
    peak_start_s: float,
    peak_duration_s: float,
    seed: int = 0,
) -> list[RequestSpec]:
    """Return the requests arriving at `base_rate_per_s`, and at `peak_rate_per_s` inside the window."""
    if base_rate_per_s <= 0 or peak_rate_per_s <= 0:
        raise ValueError("rates must be > 0")
    rng = random.Random(seed)
    now = 0.0
    out: list[RequestSpec] = []
    peak_end = peak_start_s + peak_duration_s
    for spec in specs:
        out.append(dataclasses.replace(spec, arrival_s=now))
        rate = peak_rate_per_s if peak_start_s <= now < peak_end else base_rate_per_s
        gap = rng.expovariate(rate)
        if now < peak_start_s < now + gap:
            gap = peak_start_s - now  # do not jump over the start of the peak
        now += gap
    return out


def with_bursts(
    specs: Sequence[RequestSpec], burst_size: int, interval_s: float
) -> list[RequestSpec]:
    """Return the requests arriving in groups of `burst_size`, one group every `interval_s`."""
    if burst_size < 1 or interval_s < 0:
        raise ValueError("burst_size must be >= 1 and interval_s >= 0")
    return [
        dataclasses.replace(s, arrival_s=(i // burst_size) * interval_s)
        for i, s in enumerate(specs)
    ]


def assign_tenants(
    specs: Sequence[RequestSpec], weights: dict[str, float], seed: int = 0
) -> list[RequestSpec]:
    """Return the specs with tenants drawn by weight (e.g. {"acme": 0.7, "small-co": 0.3})."""
    if not weights or any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError("weights must be non-negative with a positive sum")
    rng = random.Random(seed)
    names, values = list(weights), list(weights.values())
    return [dataclasses.replace(s, tenant=rng.choices(names, values)[0]) for s in specs]


def assign_traffic_class(
    specs: Sequence[RequestSpec],
    *,
    batch_fraction: float = 0.0,
    batch_tenants: Iterable[str] = (),
    seed: int = 0,
) -> list[RequestSpec]:
    """Return the specs marked `batch` for the given tenants and a random `batch_fraction` of the rest."""
    if not 0.0 <= batch_fraction <= 1.0:
        raise ValueError(f"batch_fraction must be in [0, 1], got {batch_fraction}")
    rng = random.Random(seed)
    batch_set = set(batch_tenants)
    out = []
    for spec in specs:
        is_batch = spec.tenant in batch_set or rng.random() < batch_fraction
        out.append(dataclasses.replace(spec, traffic_class="batch" if is_batch else "interactive"))
    return out
