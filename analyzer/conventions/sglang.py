"""Adapter for SGLang's request traces (0.5; DESIGN.md §3).

The root span is `" Req <rid8>"` (leading space), or `prefill Req …` /
`decode Req …` when prefill and decode are disaggregated; older releases name
it `Req <rid8>` (python/sglang/srt/tracing/trace.py `trace_req_start`).  The
root carries the whole rid in its `rid` attribute and, when disaggregated, the
`bootstrap_room` that ties the prefill and decode roots of one request
together (their rids differ when the client sent none).  Under the root, one
span per thread (`Tokenizer (…)`, `Scheduler [TP 0] (…)`) holds the slices
`tokenize`, `prefill_waiting`, `prefill_forward`, `decode_waiting`,
`decode_forward` (`decode_loop` steps inside it; older releases have no
`decode_forward` and put the `decode_loop` steps directly under the thread).
SGLang's `time_in_model_prefill` attribute includes the queue wait, so the
queue comes from the `prefill_waiting` slice, and from `time_in_queue` only
when the slices are missing.  The mini load balancer's `router Req …` root
(and the `Bootstrap Room 0x…` span some releases put above the roots) is no
request of its own: it is not summarized.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary, inside_any
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "sglang"
#: `prefill Req …` / `decode Req …`: the roots when prefill and decode are disaggregated.
ROLES = ("prefill", "decode")
ROOT_WORD = "Req"
SLICE_TOKENIZE = "tokenize"
SLICE_PREFILL_WAIT = "prefill_waiting"
SLICE_PREFILL = "prefill_forward"
SLICE_DECODE_WAIT = "decode_waiting"
SLICE_DECODE = "decode_forward"
SLICE_DECODE_LOOP = "decode_loop"
#: The slices that mean the phases were traced (not only the attributes).
PHASE_SLICES = frozenset({SLICE_PREFILL, SLICE_DECODE, SLICE_DECODE_LOOP})
TTFT = "gen_ai.latency.time_to_first_token"
E2E = "gen_ai.latency.e2e"
QUEUE = "gen_ai.latency.time_in_queue"
PREFILL = "gen_ai.latency.time_in_model_prefill"
DECODE = "gen_ai.latency.time_in_model_decode"
PROMPT_TOKENS = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")
COMPLETION_TOKENS = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")
REQUEST_ID = "gen_ai.request.id"
#: Root attributes set by `trace_req_start` (python/sglang/srt/observability/trace.py).
RID = "rid"
BOOTSTRAP_ROOM = "bootstrap_room"
ROOM_SPAN = "Bootstrap Room"


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    nested = inside_any(trace, _is_root)
    roots = [x for x in trace.spans if _is_root(x) and not nested(x)]
    if not roots:
        return []
    # disaggregated prefill/decode roots of one request arrive in one trace: one summary
    by_key: dict[str, list[Span]] = {}
    for r in roots:
        by_key.setdefault(_group_key(trace, r), []).append(r)
    groups = list(by_key.values())
    for group in groups:
        group.sort(key=lambda x: x.start_ns)
    sides = RequestSides(trace, groups)
    return [_summarize(trace, group, sides.of(group[0])) for group in groups]


def _root_rid8(name: str) -> str | None:
    """Gives the rid8 of a root span's name ("" when it has none); None when `name`
    names no root.

    A root is named `" Req <rid8>"`, `prefill Req …` or `decode Req …`, spacing as
    senders vary it (blanks around and between the words); the rid8 is whatever the
    user's rid began with, on one line (any characters, even none).  Read by hand:
    the regular expression it replaces backtracked quadratically on a long run of
    blanks inside a name (a second for 16,000 characters, a hostile export).
    """
    rest = name.lstrip()
    for role in ROLES:
        if rest.startswith(role) and rest[len(role) : len(role) + 1].isspace():
            rest = rest[len(role) :].lstrip()
            break
    if not rest.startswith(ROOT_WORD):
        return None
    after = rest[len(ROOT_WORD) :]
    if after and not after[0].isspace():  # "Reqs": another word
        return None
    rid8 = after.strip()
    return None if "\n" in rid8 else rid8


def _is_root(span: Span) -> bool:
    return _root_rid8(span.name) is not None


def _rid8(root: Span) -> str:
    return _root_rid8(root.name) or ""


def _group_key(trace: TraceView, root: Span) -> str:
    """Gives what ties the roots of one request: the bootstrap room when there is
    one (prefill and decode servers each make their own rid when the client sent
    none), else the rid8 of the name, else the span itself.

    The room is on the root (`"0x…"`, python/sglang/srt/observability/trace.py
    `trace_req_start`), or, in releases that put a `Bootstrap Room 0x…` span
    above the roots, only on that parent.
    """
    room = _room(root.attributes.get(BOOTSTRAP_ROOM))
    parent = trace.by_id.get(root.parent_span_id)
    if room is None and parent is not None and parent.name.startswith(ROOM_SPAN):
        room = _room(parent.attributes.get(BOOTSTRAP_ROOM))
    if room is not None:
        return f"room:{room}"
    return f"rid:{_rid8(root)}" if _rid8(root) else f"span:{root.span_id}"


def _room(value: object) -> int | None:
    """Gives a bootstrap room: an int, or text as SGLang writes it (`"0x1f"` now,
    the decimal int or `"None"` in older releases); 0 and `"None"` are no room."""
    if value.__class__ is int:
        room = value
    elif isinstance(value, str):
        text = value.strip().lower()
        try:
            room = int(text, 16 if text.startswith("0x") else 10)
        except ValueError:
            return None
    else:
        return None
    return room or None


def _slice_ns(spans: list[Span], name: str) -> int:
    return sum(x.duration_ns for x in spans if x.name == name)


def _attr(roots: list[Span], key: str | tuple[str, ...]) -> object:
    keys = (key,) if isinstance(key, str) else key
    for k in keys:
        for r in roots:
            if k in r.attributes:
                return r.attributes[k]
    return None


def _summarize(trace: TraceView, roots: list[Span], sides: Sides) -> s.RequestSummary:
    slices = [d for r in roots for d in trace.descendants(r)]
    rd = ValueReader()
    flags: list[str] = []
    if sides.server is not None:  # an outer server span (a router's, an HTTP server's)
        server_ns = sides.server.duration_ns
    elif len(roots) == 1:
        server_ns = roots[0].duration_ns
    else:
        # different processes: add the durations, never subtract across clocks
        server_ns = sum(r.duration_ns for r in roots)
    e2e_ns = rd.seconds_ns(_attr(roots, E2E))
    if e2e_ns is not None and len(roots) == 1 and not agree(e2e_ns, roots[0].duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    names = {x.name for x in slices}
    if names & PHASE_SLICES:
        prefill_ns = _slice_ns(slices, SLICE_PREFILL)
        # decode_loop steps lie inside decode_forward where there is one: never both
        decode_slice = SLICE_DECODE if SLICE_DECODE in names else SLICE_DECODE_LOOP
        decode_ns: int | None = _slice_ns(slices, decode_slice) if decode_slice in names else None
        queue_wait_ns = _slice_ns(slices, SLICE_PREFILL_WAIT) + _slice_ns(slices, SLICE_DECODE_WAIT)
        attr_queue = rd.seconds_ns(_attr(roots, QUEUE))
        if attr_queue is not None and SLICE_PREFILL_WAIT in names and not agree(
            attr_queue, _slice_ns(slices, SLICE_PREFILL_WAIT)
        ):
            flags.append(s.FLAG_SOURCES_DISAGREE)
    else:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        queue_wait_ns = rd.seconds_ns(_attr(roots, QUEUE)) or 0
        # the prefill attribute includes the queue wait
        prefill_ns = max(0, (rd.seconds_ns(_attr(roots, PREFILL)) or 0) - queue_wait_ns)
        decode_ns = rd.seconds_ns(_attr(roots, DECODE))
    client = sides.client
    part = partition(
        server_ns=server_ns,
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=queue_wait_ns,
        tokenize_ns=_slice_ns(slices, SLICE_TOKENIZE),
    )
    ttft_ns = rd.seconds_ns(_attr(roots, TTFT))
    if ttft_ns is None:
        first_prefill = [x for x in slices if x.name == SLICE_PREFILL]
        if first_prefill and len(roots) == 1:
            ttft_ns = max(x.end_ns for x in first_prefill) - roots[0].start_ns
    return build_summary(
        trace,
        roots[0],
        part,
        source=NAME,
        request_id=str(_attr(roots, REQUEST_ID) or _attr(roots, RID) or _rid8(roots[0]) or roots[0].span_id),
        related=roots[1:],
        client=client,
        server=sides.server,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=rd.count(_attr(roots, PROMPT_TOKENS)),
        output_tokens=rd.count(_attr(roots, COMPLETION_TOKENS)),
        flags=flags,
        reader=rd,
        decode_measured=decode_ns is not None,
    )
