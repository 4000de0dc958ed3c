"""Adapter for SGLang's request traces (0.5; DESIGN.md §3).

The root span is `" Req <rid8>"` (leading space), or `prefill Req …` /
`decode Req …` when prefill and decode are disaggregated; older releases name
it `Req <rid8>` (python/sglang/srt/tracing/trace.py `trace_req_start`).  The
root carries the whole rid in its `rid` attribute and, when disaggregated, the
`bootstrap_room` that ties the prefill and decode roots of one request
together (their rids differ when the client sent none).  Under the root, one
span per thread (`Tokenizer(host:… | pid:…)`, `Scheduler [TP 0] (host:… | pid:…)`)
holds the slices (python/sglang/srt/observability/req_time_stats.py `RequestStage`):
`tokenize`, `dispatch`, `request_process`, `prefill_waiting`, `prefill_forward`
(`chunked_prefill` inside), `decode_waiting`, `decode_forward` (`decode_loop` steps
inside it; older releases have no `decode_forward` and put the `decode_loop` steps
directly under the thread).

`decode_waiting` means two things.  Unified, it runs from the first token (prefill
finished) to the first decode batch (`set_last_scheduled_time`): decode time, since
decode is first token → last token.  On a disaggregated decode server it runs from
the request's entry into the wait queue to its first forward (`set_forward_entry_time`):
a queue wait.  SGLang's `time_in_model_prefill` attribute includes the queue wait
(first token − dispatch), so the queue comes from the `prefill_waiting` slice, and
from a `time_in_queue` attribute (which SGLang itself does not send) only when the
slices are missing.  The mini load balancer's `router Req …` root (and the
`Bootstrap Room 0x…` span some releases put above the roots) is no request of its
own: it is not summarized.
"""

from __future__ import annotations

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import agree, build_summary, inside_any, made_a_token
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import Span
from tokentrace.analyzer.trace_view import TraceView

NAME = "sglang"
#: `prefill Req …` / `decode Req …`: the roots when prefill and decode are disaggregated.
ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"
ROLES = (ROLE_PREFILL, ROLE_DECODE)
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
#: The thread spans' machine (`host_id`, the first 8 characters in their names).
HOST_ID = "host_id"
HOST_IN_NAME = "(host:"
HOST_RESOURCE_KEYS = ("host.id", "host.name")


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


def _parse_root(name: str) -> tuple[str, str] | None:
    """Gives (role, rid8) of a root span's name (role "" when unified, rid8 "" when it
    has none); None when `name` names no root.

    A root is named `" Req <rid8>"`, `prefill Req …` or `decode Req …`, spacing as
    senders vary it (blanks around and between the words); the rid8 is whatever the
    user's rid began with, on one line (any characters, even none).  Read by hand:
    the regular expression it replaces backtracked quadratically on a long run of
    blanks inside a name (a second for 16,000 characters, a hostile export).
    """
    rest = name.lstrip()
    role = ""
    for word in ROLES:
        if rest.startswith(word) and rest[len(word) : len(word) + 1].isspace():
            rest, role = rest[len(word) :].lstrip(), word
            break
    if not rest.startswith(ROOT_WORD):
        return None
    after = rest[len(ROOT_WORD) :]
    if after and not after[0].isspace():  # "Reqs": another word
        return None
    rid8 = after.strip()
    return None if "\n" in rid8 else (role, rid8)


def _root_rid8(name: str) -> str | None:
    """Gives the rid8 of a root span's name ("" when it has none); None when `name`
    names no root."""
    parsed = _parse_root(name)
    return None if parsed is None else parsed[1]


def _is_root(span: Span) -> bool:
    return _parse_root(span.name) is not None


def _rid8(root: Span) -> str:
    return _root_rid8(root.name) or ""


def _role(root: Span) -> str:
    parsed = _parse_root(root.name)
    return parsed[0] if parsed else ""


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
    # each root's slices with its role: a decode server's decode_waiting is a queue wait
    by_role: dict[str, list[Span]] = {}
    for r in roots:
        by_role.setdefault(_role(r), []).extend(trace.descendants(r))
    slices = [x for found in by_role.values() for x in found]
    rd = ValueReader()
    flags: list[str] = []
    e2e_ns = rd.seconds_ns(_attr(roots, E2E))
    if e2e_ns is not None and len(roots) == 1 and not agree(e2e_ns, roots[0].duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    names = {x.name for x in slices}
    if names & PHASE_SLICES:
        prefill_ns = _slice_ns(slices, SLICE_PREFILL)
        # decode_loop steps lie inside decode_forward where there is one: never both
        decode_slice = SLICE_DECODE if SLICE_DECODE in names else SLICE_DECODE_LOOP
        decode_ns: int | None = _slice_ns(slices, decode_slice) if decode_slice in names else None
        # unified, decode_waiting runs from the first token to the first decode batch:
        # decode time (first token → last token), not queue
        first_token_side = [x for role, got in by_role.items() if role != ROLE_DECODE for x in got]
        if any(x.name == SLICE_DECODE_WAIT for x in first_token_side):
            decode_ns = (decode_ns or 0) + _slice_ns(first_token_side, SLICE_DECODE_WAIT)
        queue_wait_ns = _slice_ns(slices, SLICE_PREFILL_WAIT) + _slice_ns(
            by_role.get(ROLE_DECODE, []), SLICE_DECODE_WAIT
        )
        attr_queue = rd.seconds_ns(_attr(roots, QUEUE))
        if attr_queue is not None and SLICE_PREFILL_WAIT in names and not agree(
            attr_queue, _slice_ns(slices, SLICE_PREFILL_WAIT)
        ):
            flags.append(s.FLAG_SOURCES_DISAGREE)
    else:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        queue_wait_ns = rd.seconds_ns(_attr(roots, QUEUE)) or 0
        # the prefill attribute includes the queue wait (SGLang sends no time_in_queue:
        # then the wait cannot be told from the prefill, and reads as prefill)
        prefill_ns = max(0, (rd.seconds_ns(_attr(roots, PREFILL)) or 0) - queue_wait_ns)
        decode_ns = rd.seconds_ns(_attr(roots, DECODE))
    client = sides.client
    part = partition(
        # an outer server span (a router's, an HTTP server's) where it holds the request
        server_ns=sides.server_ns(_roots_ns(trace, roots)),
        client_ns=client.duration_ns if client is not None else None,
        prefill_ns=prefill_ns,
        decode_ns=decode_ns or 0,
        queue_wait_ns=queue_wait_ns,
        tokenize_ns=_slice_ns(slices, SLICE_TOKENIZE),
    )
    output_tokens = rd.count(_attr(roots, COMPLETION_TOKENS))
    ttft_ns = rd.seconds_ns(_attr(roots, TTFT))
    if ttft_ns is None and len(roots) == 1:
        first_prefill = [x for x in slices if x.name == SLICE_PREFILL]
        if first_prefill and made_a_token([*roots, *slices], output_tokens):
            # the end of prefill stands in for the first token, of a request that made one
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
        output_tokens=output_tokens,
        flags=flags,
        reader=rd,
        decode_measured=decode_ns is not None,
    )


def _roots_ns(trace: TraceView, roots: list[Span]) -> int:
    """Gives the server's time of a request's roots: one root's duration, or, when
    disaggregated, what the prefill and decode roots cover together.

    The mini load balancer posts a request to the prefill and the decode server at once
    (python/sglang/srt/disaggregation/mini_lb.py: `asyncio.gather` of both posts), so
    their roots overlap: their durations must not be added.  On one machine the roots
    share its wall clock, and their union is the server's time.  Across machines the
    clocks differ by their skew, so where one root lies in the other's time cannot be
    known: the longest root stands for the request (the decode server's, which is sent
    the request with the prefill server and answers last), never a union or a sum that
    would count the skew.
    """
    if len(roots) == 1:
        return roots[0].duration_ns
    hosts = {_host(trace, r) for r in roots}
    if len(hosts) != 1 or "" in hosts:
        return max(r.duration_ns for r in roots)
    total = 0
    covered_to: int | None = None
    for start, end in sorted((r.start_ns, r.start_ns + r.duration_ns) for r in roots):
        if covered_to is None or start > covered_to:
            total += end - start
            covered_to = end
        elif end > covered_to:
            total += end - covered_to
            covered_to = end
    return total


def _host(trace: TraceView, root: Span) -> str:
    """Gives the machine a root's spans were made on ("" when unknown): its thread spans'
    `host_id` (the machine id, whose first 8 characters their names carry as
    `(host:xxxxxxxx | pid:N)`), else its resource's `host.id` / `host.name`."""
    for thread in trace.children.get(root.span_id, ()):
        host = thread.attributes.get(HOST_ID)
        if isinstance(host, str) and host:
            return host[:8]
        at = thread.name.find(HOST_IN_NAME)
        if at >= 0:
            host = thread.name[at + len(HOST_IN_NAME) :].split("|", 1)[0].strip()
            if host:
                return host[:8]
    for key in HOST_RESOURCE_KEYS:
        value = root.resource.get(key)
        if isinstance(value, str) and value:
            return f"{key}={value}"
    return ""
