"""Engine steps: continuous-batching scheduler iterations, unpacked from step batches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analyzer.spans import Span, _warned, list_attr, logger
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


_INF = float("inf")


def _int(value: Any, default: int) -> int:
    """Gives a list element as an int, `default` when it is none (a string, NaN, null)."""
    if value.__class__ is int:
        return value  # type: ignore[no-any-return]
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return default


def _known(value: Any) -> float | None:
    """Gives a KV usage or GPU time element as a number, None when unknown (< 0, or none)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0 <= number < _INF else None  # NaN fails the comparison too


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
        starts = list_attr(a, sc.STEP_START_NS)
        # every list is read once per span (packed lists are JSON strings)
        kvs, gpus, ids_per_step, durations, prefills, decodes, sizes, queues = (
            list_attr(a, key)
            for key in (
                sc.STEP_KV_USAGE,
                sc.STEP_GPU_US,
                sc.STEP_REQUEST_IDS,
                sc.STEP_DURATION_US,
                sc.STEP_PREFILL_TOKENS,
                sc.STEP_DECODE_SEQS,
                sc.STEP_BATCH_SIZE,
                sc.STEP_QUEUE_DEPTH,
            )
        )
        instance = next((str(span.resource[k]) for k in INSTANCE_KEYS if k in span.resource), "")
        unplaced = 0
        for i, start in enumerate(starts):
            # Any sender may write these lists: a value that is no number loses its
            # field (a step without a start, the step), never the span's other steps.
            start_ns = _int(start, -1)
            if start_ns < 0:
                unplaced += 1
                continue
            gpu = _known(_at(gpus, i, -1))
            ids = _at(ids_per_step, i, "")
            steps.append(
                EngineStep(
                    service=span.service_name,
                    instance=instance,
                    start_ns=start_ns,
                    duration_us=_int(_at(durations, i, 0), 0),
                    prefill_tokens=_int(_at(prefills, i, 0), 0),
                    decode_seqs=_int(_at(decodes, i, 0), 0),
                    batch_size=_int(_at(sizes, i, 0), 0),
                    queue_depth=_int(_at(queues, i, 0), 0),
                    kv_usage=_known(_at(kvs, i, -1)),
                    gpu_us=None if gpu is None else int(gpu),
                    request_ids=[r for r in str(ids).split(",") if r],
                )
            )
        if unplaced and sc.STEP_START_NS not in _warned:
            _warned.add(sc.STEP_START_NS)
            logger.warning(
                "%d engine step(s) of service %r have no usable %s and are ignored (%r)",
                unplaced, span.service_name, sc.STEP_START_NS, starts[:3],
            )  # fmt: skip
    return steps
