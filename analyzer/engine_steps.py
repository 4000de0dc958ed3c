"""Engine steps: continuous-batching scheduler iterations, unpacked from step batches."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analyzer.spans import Span, _warned, list_attr, logger
from tokentrace.analyzer.trace_view import instance_of
from tokentrace.instrumentation import semconv as sc


@dataclass(slots=True)
class EngineStep:
    """One scheduler step.  A count its engine does not give (TGI's prefill tokens and
    queue depth, a step the SDK was told no queue depth for) is None, never 0: unknown
    is not zero, and the queries skip it (docs/conventions.md)."""

    service: str
    instance: str
    start_ns: int
    duration_us: int
    prefill_tokens: int | None
    decode_seqs: int | None
    batch_size: int | None
    queue_depth: int | None
    kv_usage: float | None = None
    gpu_us: int | None = None
    request_ids: list[str] = field(default_factory=list)
    #: host time of the step's timed forward passes (`instrument_model`): its gap to
    #: `gpu_us` is launch / sync overhead; None when the step timed none
    forward_host_us: int | None = None


def _unescaped_id(request_id: str) -> str:
    """A request id from a step's id list: the SDK percent-encodes a "," in an id (the
    list's separator) and every "%" (instrumentation/_steps.py `_escaped_id`)."""
    if "%" not in request_id:
        return request_id
    return request_id.replace("%2C", ",").replace("%25", "%")


def _at(values: Any, i: int, default: Any) -> Any:
    try:
        return values[i]
    except (IndexError, TypeError, KeyError):
        return default


#: The store's BIGINT (times, durations) and INTEGER (counts) columns: a value beyond
#: them is no measurement (and would make DuckDB refuse the step's row).
_BIGINT = 2**63
_MAX_COUNT = 2**31 - 1


def _int(value: Any, default: int) -> int:
    """Gives a list element as an int, `default` when it is none (a string, NaN, null,
    beyond a BIGINT)."""
    if value.__class__ is not int:
        try:
            value = int(value)
        except (TypeError, ValueError, OverflowError):
            return default
    return value if -_BIGINT <= value < _BIGINT else default  # type: ignore[no-any-return]


def _count(value: Any) -> int | None:
    """Gives a count element (tokens, sequences, queue depth): None, not measured, when
    it is none, below zero (the SDK sends -1 for unknown) or beyond the INTEGER column
    (like FLAG_IMPOSSIBLE_COUNT)."""
    number = _int(value, -1)
    return number if 0 <= number <= _MAX_COUNT else None


def _known(value: Any) -> float | None:
    """Gives a KV usage or GPU time element as a number, None when unknown (< 0, or none)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    return number if 0 <= number < _BIGINT else None  # NaN and inf fail the comparison too


#: TGI's batch traces (backends/v3/src/queue.rs `next_batch`, backend.rs `batching_task`):
#: a root `batch` span (`batch_size`: the sequences in it) holds one step, the backend's
#: `prefill` or `decode` (no fields of its own), below which the sharded client's
#: `prefill` / `decode` (and each shard's) carry `size`.  Older routers put `size` on the
#: step itself.
TGI_BATCH = "batch"
TGI_BATCH_SIZE = "batch_size"
TGI_SIZE = "size"
TGI_PREFILL = "prefill"
TGI_DECODE = "decode"
TGI_STEPS = (TGI_PREFILL, TGI_DECODE)


def _tgi_batch_steps(spans: Sequence[Span]) -> list[EngineStep]:
    batches = {
        s.span_id: s
        for s in spans
        if s.name == TGI_BATCH and (TGI_BATCH_SIZE in s.attributes or not s.parent_span_id)
    }
    if not batches:
        return []
    children: dict[str, list[Span]] = {}
    for s in spans:
        if s.name in TGI_STEPS:
            children.setdefault(s.parent_span_id, []).append(s)
    steps = []
    for batch_id, batch in batches.items():
        for s in children.get(batch_id, ()):
            size = _tgi_size(s, children, batch)
            steps.append(
                EngineStep(
                    service=s.service_name,
                    instance=instance_of({}, s.resource)[0],
                    start_ns=s.start_ns,
                    duration_us=s.duration_ns // 1000,
                    # a decode step prefills nothing; TGI counts no prefill tokens nor
                    # queue depth, and a prefill step of a model that chunks also decodes
                    # the running batch (how many: unknown)
                    prefill_tokens=0 if s.name == TGI_DECODE else None,
                    decode_seqs=size if s.name == TGI_DECODE else None,
                    batch_size=size,
                    queue_depth=None,
                )
            )
    return steps


def _tgi_size(step: Span, children: Mapping[str, list[Span]], batch: Span) -> int | None:
    """Gives the sequences in a TGI step: its own `size`, else the sharded client's span
    below it (the first of its kind that has one, the nearest first), else the batch's
    `batch_size`; None when none says (a count is never read as 0 for want of one)."""
    if TGI_SIZE in step.attributes:
        return _count(step.attributes[TGI_SIZE])
    seen = {step.span_id}
    level = [c for c in children.get(step.span_id, ()) if c.name == step.name]
    while level:
        for c in level:
            if TGI_SIZE in c.attributes:
                return _count(c.attributes[TGI_SIZE])
        seen.update(c.span_id for c in level)
        level = [
            g for c in level for g in children.get(c.span_id, ())
            if g.name == step.name and g.span_id not in seen
        ]  # fmt: skip
    return _count(batch.attributes.get(TGI_BATCH_SIZE))


#: The most steps read from one `tokentrace.engine.steps` span.  The SDK sends at most
#: 512 (instrumentation/_steps.py MAX_STEPS_PER_SPAN); any sender may write more, and a
#: packed list is cheap to send: an 8 KB gzip export held 4,000,000 steps (~1.2 GB of
#: `EngineStep`s and as many rows).  The rest are dropped, counted and logged once.
MAX_STEPS_PER_SPAN = 4096
#: The most steps read from one trace's batch spans (the SDK makes each batch span a
#: trace of its own): what one trace hands the writer stays bounded however many
#: batch spans it holds.
MAX_STEPS_PER_TRACE = 65_536
#: A packed list string up to this long is parsed whole (a list of 4096 numbers takes
#: ~82 KB); a longer one only as far as the steps read (`_packed_head`): parsing it
#: whole would build every element first.
_PARSE_WHOLE_CHARS = 128 * 1024


class _StepCap:
    """What the caps above dropped in this process (`dropped_steps()`), and whether it
    was logged."""

    dropped = 0
    logged = False


def dropped_steps() -> int:
    """Gives how many engine steps the caps (MAX_STEPS_PER_SPAN / _PER_TRACE) dropped
    in this process."""
    return _StepCap.dropped


_decode_one = json.JSONDecoder().raw_decode
_spaces = re.compile(r"[ \t\n\r]*")


def _skip(text: str, i: int) -> int:
    """Gives the index of the first character at or after `i` that is no JSON space."""
    found = _spaces.match(text, i)
    return i if found is None else found.end()


def _packed_head(value: str, limit: int) -> tuple[list[Any], int]:
    """Gives the first `limit` elements of the JSON array string `value`, parsing no
    further, and how many it holds (those not read counted by their commas: exact
    for numbers).  Raises ValueError when `value` is no JSON array."""
    i = _skip(value, 0)
    if not value.startswith("[", i):
        raise ValueError(f"not a JSON list ({len(value)} characters)")
    i = _skip(value, i + 1)
    items: list[Any] = []
    if value.startswith("]", i):
        return items, 0
    while len(items) < limit:
        item, i = _decode_one(value, i)
        items.append(item)
        i = _skip(value, i)
        if value.startswith("]", i):
            return items, len(items)
        if not value.startswith(",", i):
            raise ValueError(f"not a JSON list: no ',' or ']' at character {i} of {len(value)}")
        i = _skip(value, i + 1)
    return items, limit + 1 + value.count(",", i)  # one follows at i, one more a comma


def _head_list(attributes: Mapping[str, Any], key: str, limit: int) -> tuple[list[Any], int]:
    """Gives the first `limit` elements of the list attribute `key` (packed or an OTLP
    array; [] when absent or unreadable, as `list_attr`) and how many it holds."""
    value = attributes.get(key)
    try:
        if value.__class__ not in (str, bytes) or len(value) <= _PARSE_WHOLE_CHARS:
            items = list_attr(attributes, key)  # small, or decoded already
            return items[:limit], len(items)
        text = value.decode() if isinstance(value, bytes) else value
        return _packed_head(text, limit)
    except (ValueError, RecursionError) as exc:  # as list_attr does (RecursionError: nesting)
        if key not in _warned:
            _warned.add(key)
            logger.warning("span attribute %s is unreadable and is ignored: %s", key, exc)
        return [], 0


def _dropped(span: Span, carried: int, read: int) -> None:
    """Counts the steps of `span` beyond the caps; logs the first time."""
    _StepCap.dropped += carried - read
    if not _StepCap.logged:
        _StepCap.logged = True
        logger.warning(
            "an engine-step batch span of service %r carries %d steps, of which %d are read "
            "(at most %d a span and %d a trace; the tokentrace SDK sends at most 512 a span): "
            "the rest are dropped; further ones are dropped without a word",
            span.service_name, carried, read, MAX_STEPS_PER_SPAN, MAX_STEPS_PER_TRACE,
        )  # fmt: skip


def extract_engine_steps(spans: Sequence[Span]) -> list[EngineStep]:
    """Gives every engine step carried by `tokentrace.engine.steps` spans or TGI batch
    traces; of the former at most MAX_STEPS_PER_SPAN a span, MAX_STEPS_PER_TRACE in all."""
    steps: list[EngineStep] = _tgi_batch_steps(spans)
    left = MAX_STEPS_PER_TRACE  # steps the trace's batch spans may still give
    for span in spans:
        if span.name != sc.SPAN_ENGINE_STEPS:
            continue
        a = span.attributes
        starts, carried = _head_list(a, sc.STEP_START_NS, min(MAX_STEPS_PER_SPAN, left))
        if carried > len(starts):
            _dropped(span, carried, len(starts))
        if not starts:
            continue
        left -= len(starts)
        n = len(starts)
        # every list is read once per span (packed lists are JSON strings), as far as
        # the steps read
        kvs, gpus, hosts, ids_per_step, durations, prefills, decodes, sizes, queues = (
            _head_list(a, key, n)[0]
            for key in (
                sc.STEP_KV_USAGE,
                sc.STEP_GPU_US,
                sc.STEP_FORWARD_HOST_US,
                sc.STEP_REQUEST_IDS,
                sc.STEP_DURATION_US,
                sc.STEP_PREFILL_TOKENS,
                sc.STEP_DECODE_SEQS,
                sc.STEP_BATCH_SIZE,
                sc.STEP_QUEUE_DEPTH,
            )
        )
        instance = instance_of({}, span.resource)[0]
        unplaced = 0
        for i, start in enumerate(starts):
            # Any sender may write these lists: a value that is no number loses its
            # field (a step without a start, the step), never the span's other steps.
            start_ns = _int(start, -1)
            if start_ns < 0:
                unplaced += 1
                continue
            gpu = _known(_at(gpus, i, -1))
            host = _known(_at(hosts, i, -1))
            ids = _at(ids_per_step, i, "")
            steps.append(
                EngineStep(
                    service=span.service_name,
                    instance=instance,
                    start_ns=start_ns,
                    duration_us=_int(_at(durations, i, 0), 0),
                    # a list that is short or absent: that count is unknown, not 0
                    prefill_tokens=_count(_at(prefills, i, None)),
                    decode_seqs=_count(_at(decodes, i, None)),
                    batch_size=_count(_at(sizes, i, None)),
                    queue_depth=_count(_at(queues, i, None)),
                    kv_usage=_known(_at(kvs, i, -1)),
                    gpu_us=None if gpu is None else int(gpu),
                    request_ids=[_unescaped_id(r) for r in str(ids).split(",") if r],
                    forward_host_us=None if host is None else int(host),
                )
            )
        if unplaced and sc.STEP_START_NS not in _warned:
            _warned.add(sc.STEP_START_NS)
            logger.warning(
                "%d engine step(s) of service %r have no usable %s and are ignored (%r)",
                unplaced, span.service_name, sc.STEP_START_NS, starts[:3],
            )  # fmt: skip
    return steps
