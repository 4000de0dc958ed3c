"""Engine steps: continuous-batching scheduler iterations, unpacked from step batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import INSTANCE_KEYS
from tokentrace.instrumentation import semconv as sc


@dataclass(slots=True)
class EngineStep:
    service: str
    instance: str
    start_ns: int
    duration_us: int
    prefill_tokens: int
    decode_seqs: int
    batch_size: int
    queue_depth: int
    kv_usage: float | None = None
    gpu_us: int | None = None
    request_ids: list[str] = field(default_factory=list)


def _at(values: Any, i: int, default: Any) -> Any:
    try:
        return values[i]
    except (IndexError, TypeError, KeyError):
        return default


#: TGI's batch traces: a root `batch` span (`batch_size`) whose `prefill` / `decode`
#: children are the forward steps of that batch (`size` = sequences in it).
TGI_BATCH = "batch"
TGI_STEPS = ("prefill", "decode")


def _tgi_batch_steps(spans: Sequence[Span]) -> list[EngineStep]:
    batches = {s.span_id for s in spans if s.name == TGI_BATCH and "batch_size" in s.attributes}
    steps = []
    for s in spans:
        if s.name not in TGI_STEPS or s.parent_span_id not in batches:
            continue
        size = s.attributes.get("size", s.attributes.get("batch_size", 0))
        try:
            size = int(size)
        except (TypeError, ValueError):
            size = 0
        steps.append(
            EngineStep(
                service=s.service_name,
                instance=next((str(s.resource[k]) for k in INSTANCE_KEYS if k in s.resource), ""),
                start_ns=s.start_ns,
                duration_us=s.duration_ns // 1000,
                # TGI does not record prefill token counts; the step kind is still known
                prefill_tokens=0,
                decode_seqs=size if s.name == "decode" else 0,
                batch_size=size,
                queue_depth=0,
            )
        )
    return steps


def extract_engine_steps(spans: Sequence[Span]) -> list[EngineStep]:
    """Gives every engine step carried by `tokentrace.engine.steps` spans or TGI batch traces."""
    steps: list[EngineStep] = _tgi_batch_steps(spans)
    for span in spans:
        if span.name != sc.SPAN_ENGINE_STEPS:
            continue
        a = span.attributes
        starts = a.get(sc.STEP_START_NS) or []
        instance = next((str(span.resource[k]) for k in INSTANCE_KEYS if k in span.resource), "")
        for i, start in enumerate(starts):
            kv = _at(a.get(sc.STEP_KV_USAGE), i, -1)
            gpu = _at(a.get(sc.STEP_GPU_US), i, -1)
            ids = _at(a.get(sc.STEP_REQUEST_IDS), i, "")
            steps.append(
                EngineStep(
                    service=span.service_name,
                    instance=instance,
                    start_ns=int(start),
                    duration_us=int(_at(a.get(sc.STEP_DURATION_US), i, 0)),
                    prefill_tokens=int(_at(a.get(sc.STEP_PREFILL_TOKENS), i, 0)),
                    decode_seqs=int(_at(a.get(sc.STEP_DECODE_SEQS), i, 0)),
                    batch_size=int(_at(a.get(sc.STEP_BATCH_SIZE), i, 0)),
                    queue_depth=int(_at(a.get(sc.STEP_QUEUE_DEPTH), i, 0)),
                    kv_usage=None if kv is None or kv < 0 else float(kv),
                    gpu_us=None if gpu is None or gpu < 0 else int(gpu),
                    request_ids=[r for r in str(ids).split(",") if r],
                )
            )
    return steps
