"""Adapter for SGLang's request traces (0.5; docs/design.md §3).

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

With tensor parallelism every rank's scheduler records a thread span of its own
(`Scheduler [TP 1] (…)`, attribute `tp_rank`) with the whole set of slices: one rank's
count (`_one_rank`).  A request retracted (preempted) during decode is prefilled again
by a second `prefill_forward` inside the still open `decode_forward`: that is decode
time (first token → last token), and only a `prefill_forward` outside it is prefill.
SGLang aborts a request (`TraceReqContext.abort`) with an ERROR status on the thread
span, the root's finish reason reading `["abort"]`: both make it an error.
"""

from __future__ import annotations

from collections.abc import Collection

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.conventions._common import (
    agree,
    below_by_child,
    build_summary,
    inside_any,
    made_a_token,
)
from tokentrace.analyzer.conventions._sides import RequestSides, Sides
from tokentrace.analyzer.conventions._values import ValueReader
from tokentrace.analyzer.spans import STATUS_ERROR, Span, list_attr
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
FINISH_REASONS = "gen_ai.response.finish_reasons"
#: The finish reason of a request SGLang aborted (the `type` of its `FINISH_ABORT` reason).
FINISH_ABORT = "abort"
#: Root attributes set by `trace_req_start` (python/sglang/srt/observability/trace.py).
RID = "rid"
BOOTSTRAP_ROOM = "bootstrap_room"
ROOM_SPAN = "Bootstrap Room"
#: Whose attributes speak for a disaggregated request: the decode server's, which answers.
_ANSWERS = {ROLE_DECODE: 0, "": 1, ROLE_PREFILL: 2}
#: The thread spans' machine (`host_id`, the first 8 characters in their names).
HOST_ID = "host_id"
HOST_IN_NAME = "(host:"
HOST_RESOURCE_KEYS = ("host.id", "host.name")
#: Thread span attributes (python/sglang/srt/observability/trace.py `__create_thread_context`)
#: and the `[TP n]` / `[PP n]` its name carries for them.
THREAD_LABEL = "thread_label"
RANK_KEYS = (("tp_rank", "TP"), ("pp_rank", "PP"))


def summarize(trace: TraceView) -> list[s.RequestSummary]:
    nested = inside_any(trace, _is_root)
    roots = [x for x in trace.spans if _is_root(x) and not nested(x)]
    if not roots:
        return []
    # disaggregated prefill/decode roots of one request arrive in one trace: one summary
    pairs = _pairs_by_caller(trace, roots)
    by_key: dict[str, list[Span]] = {}
    for r in roots:
        by_key.setdefault(_group_key(trace, r, pairs), []).append(r)
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


def _pairs_by_caller(trace: TraceView, roots: list[Span]) -> set[str]:
    """Gives the parent span ids under which exactly one `prefill` and one `decode` root
    hang, neither with a bootstrap room: the load balancer sent the one request to both
    servers with its one traceparent (mini_lb.py, the model gateway's
    `inject_trace_context_http`), and their rids differ when the client sent none."""
    roles: dict[str, list[str]] = {}
    for r in roots:
        role = _role(r)
        if role and r.parent_span_id and _room(r.attributes.get(BOOTSTRAP_ROOM)) is None:
            roles.setdefault(r.parent_span_id, []).append(role)
    return {p for p, found in roles.items() if sorted(found) == [ROLE_DECODE, ROLE_PREFILL]}


def _group_key(trace: TraceView, root: Span, pairs: Collection[str] = ()) -> str:
    """Gives what ties the roots of one request: the bootstrap room when there is
    one (prefill and decode servers each make their own rid when the client sent
    none), else the rid8 of the name when the roots share it, else their caller's
    span where it holds one prefill and one decode root (`pairs`), else the span.

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
    if _role(root) and root.parent_span_id in pairs:
        return f"caller:{root.parent_span_id}"
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
    # each root's slices with its role: a decode server's decode_waiting is a queue wait;
    # of each scheduler role, one rank's (every tensor-parallel rank records them all)
    by_role: dict[str, list[Span]] = {}
    below: list[Span] = []
    for r in roots:
        branches = below_by_child(trace, r)
        below.extend(x for branch in branches for x in branch)
        by_role.setdefault(_role(r), []).extend(x for branch in _one_rank(branches) for x in branch)
    slices = [x for found in by_role.values() for x in found]
    # a retracted (preempted) request is prefilled again inside the still open
    # decode_forward (req_time_stats.py `set_prefill_finished_time`, its retract branch):
    # decode time, as decode runs first token → last token; prefill is the first one only
    decoding = {x.span_id for x in slices if x.name == SLICE_DECODE}
    prefills = [x for x in slices if x.name == SLICE_PREFILL and x.parent_span_id not in decoding]
    rd = ValueReader()
    flags: list[str] = []
    # what the request's attributes say (TTFT, tokens, ids) is the decode server's first:
    # it answers the user; the prefill server made one token, which the user never saw
    told = sorted(roots, key=lambda r: _ANSWERS.get(_role(r), 1))
    e2e_ns = rd.seconds_ns(_attr(told, E2E))
    if e2e_ns is not None and len(roots) == 1 and not agree(e2e_ns, roots[0].duration_ns):
        flags.append(s.FLAG_SOURCES_DISAGREE)
    names = {x.name for x in slices}
    if names & PHASE_SLICES:
        prefill_ns = sum(x.duration_ns for x in prefills)
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
        attr_queue = rd.seconds_ns(_attr(told, QUEUE))
        if attr_queue is not None and SLICE_PREFILL_WAIT in names and not agree(
            attr_queue, _slice_ns(slices, SLICE_PREFILL_WAIT)
        ):
            flags.append(s.FLAG_SOURCES_DISAGREE)
    else:
        flags.append(s.FLAG_NO_TOKEN_TIMES)
        queue_wait_ns = rd.seconds_ns(_attr(told, QUEUE)) or 0
        # the prefill attribute includes the queue wait (SGLang sends no time_in_queue:
        # then the wait cannot be told from the prefill, and reads as prefill)
        prefill_ns = max(0, (rd.seconds_ns(_attr(told, PREFILL)) or 0) - queue_wait_ns)
        decode_ns = rd.seconds_ns(_attr(told, DECODE))
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
    output_tokens = rd.count(_attr(told, COMPLETION_TOKENS))
    ttft_ns = rd.seconds_ns(_attr(told, TTFT))
    if ttft_ns is not None and len(roots) > 1 and TTFT in told[0].attributes:
        # the decode root's TTFT runs from its own start: from the request's (the first
        # root's) where both share a clock; across machines the skew is not known
        hosts = {_host(trace, r) for r in roots}
        if len(hosts) == 1 and "" not in hosts:
            ttft_ns += told[0].start_ns - roots[0].start_ns
    if ttft_ns is None and len(roots) == 1:
        if prefills and made_a_token([*roots, *below], output_tokens):
            # the end of prefill stands in for the first token, of a request that made one
            ttft_ns = max(x.end_ns for x in prefills) - roots[0].start_ns
    return build_summary(
        trace,
        roots[0],
        part,
        source=NAME,
        request_id=str(_attr(told, REQUEST_ID) or _attr(told, RID) or _rid8(told[0]) or told[0].span_id),
        related=roots[1:],
        client=client,
        server=sides.server,
        ttft_ms=None if ttft_ns is None else ttft_ns / NS_PER_MS,
        prompt_tokens=rd.count(_attr(told, PROMPT_TOKENS)),
        output_tokens=output_tokens,
        flags=flags,
        reader=rd,
        decode_measured=decode_ns is not None,
        error=_failed(roots, below),
    )


def _failed(roots: list[Span], below: list[Span]) -> bool:
    """True when SGLang aborted the request: `TraceReqContext.abort(abort_info=…)` sets the
    ERROR status (and the abort's `type`, `status_code`, `message`) on the *thread* span
    it was in, not on the root, whose finish reason reads `["abort"]` (the tokenizer
    manager's `gen_ai.response.finish_reasons`, a JSON list of finish reason types).

    Not an error: the abort `TraceReqContext.__del__` makes of a context collected with a
    span still open (`reason` or, in older releases, `abort_info` reading
    `AUTO_CLOSED`): tracing's own bookkeeping, not a request the user saw fail."""
    return any(x.status_code == STATUS_ERROR and not _auto_closed(x) for x in below) or any(
        FINISH_ABORT in list_attr(r.attributes, FINISH_REASONS) for r in roots
    )


#: the abort reason SGLang's `TraceReqContext.__del__` gives a span it closes itself
AUTO_CLOSED = "have unclosed span, auto closed"


def _auto_closed(span: Span) -> bool:
    attrs = span.attributes
    return attrs.get("reason") == AUTO_CLOSED or attrs.get("abort_info") == AUTO_CLOSED


def _one_rank(threads: list[list[Span]]) -> list[list[Span]]:
    """Gives the threads (each a thread span, then its slices) whose slices count: of each
    thread role (`thread_label`) one rank's.

    With tensor (or pipeline) parallelism every rank's scheduler process rebuilds the
    request's trace context and records its own thread span, `Scheduler [TP n] (…)`,
    with the whole set of slices (trace.py `__create_thread_context`; PR
    sgl-project/sglang#9962): summed over the ranks, each phase would count once per
    rank.  Rank 0 counts, else (its spans lost) the lowest rank there; a thread of no
    rank (the tokenizer's) counts as it is.
    """
    lowest: dict[str, tuple[int, ...]] = {}
    for branch in threads:
        rank = _rank(branch[0])
        label = _thread_label(branch[0])
        if rank is not None and (label not in lowest or rank < lowest[label]):
            lowest[label] = rank
    if not lowest:
        return threads
    return [
        b for b in threads if (rank := _rank(b[0])) is None or rank == lowest[_thread_label(b[0])]
    ]


def _thread_label(thread: Span) -> str:
    """Gives a thread span's role: its `thread_label`, else its name before the ranks."""
    label = thread.attributes.get(THREAD_LABEL)
    if isinstance(label, str):
        return label
    return thread.name.split("[", 1)[0].split("(", 1)[0].strip()


def _rank(thread: Span) -> tuple[int, ...] | None:
    """Gives a thread span's (tensor, pipeline) parallel rank, from its `tp_rank` /
    `pp_rank` attributes, else the `[TP n]` / `[PP n]` in its name; None when it has none."""
    found = [_rank_of(thread, key, word) for key, word in RANK_KEYS]
    if all(x is None for x in found):
        return None
    return tuple(x or 0 for x in found)


def _rank_of(thread: Span, key: str, word: str) -> int | None:
    value = thread.attributes.get(key)
    if value.__class__ is int:
        return value  # type: ignore[return-value]
    text = value if isinstance(value, str) else _in_brackets(thread.name, word)
    text = text.strip() if text else ""
    return int(text) if text.isdecimal() and text.isascii() else None


def _in_brackets(name: str, word: str) -> str | None:
    """Gives what follows `[word ` in `name` up to the `]` (`"[TP 3]"` → `"3"`)."""
    at = name.find(f"[{word} ")
    if at < 0:
        return None
    end = name.find("]", at)
    return name[at + len(word) + 2 : end] if end >= 0 else None


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
