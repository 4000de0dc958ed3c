"""A trace's spans indexed for the adapters: by id, by parent, and the client side."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from tokentrace.analyzer.spans import KIND_CLIENT, Span
from tokentrace.instrumentation import semconv as sc

#: Tenant attribute keys, most specific first (docs/design.md §3).
TENANT_KEYS = ("tokentrace.tenant", "tenant.id", "user.id", "enduser.id")
TRAFFIC_CLASS_KEYS = (sc.TRAFFIC_CLASS,)
ENV_KEYS = ("deployment.environment.name", "deployment.environment")
INSTANCE_KEYS = ("service.instance.id", "process.pid", "vllm.process_id")
KeyGroups = tuple[tuple[str, ...], ...]
#: What a request takes from the spans around it when its own do not say (`inherited`).
CONTEXT_KEYS: KeyGroups = (TENANT_KEYS, TRAFFIC_CLASS_KEYS, ENV_KEYS)
#: OpenTelemetry's id of the process that sent a span (random at each start).
INSTANCE_ID = "service.instance.id"
#: vLLM's resource names its process by pid only (`init_otel_tracer`: `str(os.getpid())`);
#: the host, where a resource detector or OTEL_RESOURCE_ATTRIBUTES gives one, goes before it.
VLLM_PROCESS_ID = "vllm.process_id"
HOST_KEYS = ("host.name", "host.id")


def instance_of(attributes: Mapping[str, Any], resource: Mapping[str, Any]) -> tuple[str, str | None]:
    """Gives (instance, instance id) of a span with these attributes and resource: the
    process as a person names it, and OpenTelemetry's `service.instance.id` (None without).

    vLLM's process is its host and pid (`host-a pid 5092`, or `pid 5092` where no host is
    named), never the random `service.instance.id` it also carries; any other sender's
    instance is the first of `INSTANCE_KEYS` (docs/conventions.md)."""
    found = {**resource, **attributes}
    instance_id = found.get(INSTANCE_ID)
    pid = found.get(VLLM_PROCESS_ID)
    if pid is not None and str(pid).strip():
        host = next((str(found[k]) for k in HOST_KEYS if str(found.get(k) or "").strip()), "")
        instance = f"{host} pid {str(pid).strip()}" if host else f"pid {str(pid).strip()}"
    else:
        instance = str(next((found[k] for k in INSTANCE_KEYS if k in found), ""))
    return instance, None if instance_id is None else str(instance_id)


class TraceView:
    """The spans of one trace, with the look-ups every adapter needs."""

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = spans
        self.by_id: dict[str, Span] = {s.span_id: s for s in spans}
        self.children: dict[str, list[Span]] = defaultdict(list)
        #: the spans summarized as requests, in order (each adapter's roots)
        self.summarized: list[Span] = []
        for s in spans:
            if s.parent_span_id:
                self.children[s.parent_span_id].append(s)
        # by span id, of the spans `by_id` holds: the outermost ancestor (`top`) and the
        # nearest CLIENT ancestor (`client_span_of`), filled as they are asked for
        self._top: dict[str, Span] = {}
        self._client: dict[str, Span | None] = {}
        # by key groups, then span id: what `inherited` found above each span
        self._inherited: dict[KeyGroups, dict[str, tuple[Any, ...]]] = {}

    def descendants(self, span: Span, until: str | None = None) -> Iterator[Span]:
        """Gives the spans below `span`; `until`: a span of that name is neither given nor
        entered (a nested request's spans are its own)."""
        # a sender's parent ids may loop (a span its own parent): each span once
        seen = {span.span_id}
        stack = list(self.children.get(span.span_id, ()))
        while stack:
            s = stack.pop()
            if s.span_id in seen:
                continue
            seen.add(s.span_id)
            if s.name == until:
                continue
            yield s
            stack.extend(self.children.get(s.span_id, ()))

    def ancestors(self, span: Span) -> Iterable[Span]:
        seen = {span.span_id}  # a loop back to `span` ends the walk: no span is its own ancestor
        parent = self.by_id.get(span.parent_span_id)
        while parent is not None and parent.span_id not in seen:
            seen.add(parent.span_id)
            yield parent
            parent = self.by_id.get(parent.parent_span_id)

    def top(self, span: Span) -> Span:
        """Gives the last of `ancestors(span)`, `span` itself when it has none.  Remembered
        for every span on the way, so that asking it of each span of a trace costs the
        spans once (a chain of n requests would otherwise walk n^2/2 parents)."""
        if self.by_id.get(span.span_id) is not span:  # a repeated span id: not remembered
            above = list(self.ancestors(span))
            return above[-1] if above else span
        if span.span_id not in self._top:
            self._climb(span)
        return self._top[span.span_id]

    def client_span_of(self, server_span: Span) -> Span | None:
        """Gives the nearest CLIENT-kind ancestor (remembered as `top` is).  The user's
        side of a request is the outermost one it owns: `conventions/_sides.py`."""
        if self.by_id.get(server_span.span_id) is not server_span:
            return next((a for a in self.ancestors(server_span) if a.kind == KIND_CLIENT), None)
        if server_span.span_id not in self._client:
            self._climb(server_span)
        return self._client[server_span.span_id]

    def _climb(self, span: Span) -> None:
        """Fills `_top` and `_client` for `span` and each span its walk up passes, as
        `ancestors` walks: up to a span without a parent here, to a span filled before,
        or around a loop of parent ids (each span's walk ends where it would meet a span
        it has passed: in a loop, just before itself)."""
        tops, clients, by_id = self._top, self._client, self.by_id
        path: list[Span] = []
        at: dict[str, int] = {}
        s = span
        while True:
            at[s.span_id] = len(path)
            path.append(s)
            parent = by_id.get(s.parent_span_id)
            if parent is None or parent.span_id in tops or parent.span_id in at:
                break
            s = parent
        if parent is None:  # the walk ends at the last span of the path
            top, nearest, upto = path[-1], None, len(path)
        elif parent.span_id in tops:  # ... at a span filled before: its answers go on
            top = tops[parent.span_id]
            nearest = parent if parent.kind == KIND_CLIENT else clients[parent.span_id]
            upto = len(path)
        else:  # a loop: path[j:] goes round it, path[:j] leads into it
            j = at[parent.span_id]
            loop = path[j:]
            n = len(loop)
            nearest, nearest_at = None, -1
            for x in range(2 * n - 1, -1, -1):  # twice round: "after" wraps
                member = loop[x % n]
                if x < n:
                    # the nearest client after it, itself not counted
                    clients[member.span_id] = nearest if nearest_at < x + n else None
                    tops[member.span_id] = loop[x - 1]  # the one before it (x = 0: the last)
                if member.kind == KIND_CLIENT:
                    nearest, nearest_at = member, x
            # a span leading into the loop walks it once round, from its entry
            top = path[-1]
            nearest = next((x for x in loop if x.kind == KIND_CLIENT), None)
            upto = j
        for s in reversed(path[:upto]):
            tops[s.span_id] = top
            clients[s.span_id] = nearest
            if s.kind == KIND_CLIENT:
                nearest = s

    def inherited(self, span: Span, groups: KeyGroups = CONTEXT_KEYS) -> tuple[Any, ...]:
        """Gives, for each group of keys, the first of them on the ancestors of `span`,
        nearest first (each one's attributes, then its resource; an empty string is none),
        None where none has one: the request's context (tenant, traffic class,
        environment) that the application set on a span around the call
        (docs/conventions.md).

        Remembered for every span its walk passes, as `top` is: asked of each request of
        a chain of n, it costs the spans once, not n^2/2 (a hostile export).  In a loop of
        parent ids each member's answer is the first found going round from its parent.
        """
        memo = self._inherited.setdefault(groups, {})
        if self.by_id.get(span.span_id) is not span:  # a repeated span id: not remembered
            found = (None,) * len(groups)
            for above in reversed(list(self.ancestors(span))):
                found = _nearer(_own(above, groups), found)
            return found
        if span.span_id in memo:
            return memo[span.span_id]
        by_id = self.by_id
        path: list[Span] = []
        at: dict[str, int] = {}
        s = span
        while True:
            at[s.span_id] = len(path)
            path.append(s)
            parent = by_id.get(s.parent_span_id)
            if parent is None:
                found, upto = (None,) * len(groups), len(path)
                break
            if parent.span_id in memo:
                found, upto = _nearer(_own(parent, groups), memo[parent.span_id]), len(path)
                break
            if parent.span_id in at:  # a loop: path[j:] goes round it, path[:j] leads into it
                j = at[parent.span_id]
                loop = path[j:]
                _fill_loop(memo, loop, [_own(x, groups) for x in loop])
                found = (None,) * len(groups)  # entered at loop[0], walked once round
                for x in reversed(loop):
                    found = _nearer(_own(x, groups), found)
                upto = j
                break
            s = parent
        for s in reversed(path[:upto]):
            memo[s.span_id] = found
            found = _nearer(_own(s, groups), found)
        return memo[span.span_id]

    def first_attr(self, keys: Sequence[str], spans: Iterable[Span], default: Any = "") -> Any:
        """Gives the first of `keys` found on `spans` (attributes, then resource)."""
        spans = list(spans)
        for key in keys:
            for s in spans:
                if key in s.attributes:
                    return s.attributes[key]
            for s in spans:
                if key in s.resource:
                    return s.resource[key]
        return default


def _own(span: Span, groups: KeyGroups) -> tuple[Any, ...]:
    """Gives, for each group, the first of its keys that `span` holds (attributes, then
    resource), None where it holds none but empty ones."""
    return tuple(_first_of(span, keys) for keys in groups)


def _first_of(span: Span, keys: tuple[str, ...]) -> Any:
    for key in keys:
        for where in (span.attributes, span.resource):
            value = where.get(key)
            if value is not None and value != "":
                return value
    return None


def _nearer(near: tuple[Any, ...], far: tuple[Any, ...]) -> tuple[Any, ...]:
    """Gives `near`'s values, and `far`'s where `near` has none."""
    return tuple(f if n is None else n for n, f in zip(near, far, strict=True))


def _fill_loop(memo: dict[str, tuple[Any, ...]], loop: list[Span], owns: list[tuple[Any, ...]]) -> None:
    """Fills `memo` for the members of a loop of parent ids (each member's parent is the
    next, the last one's the first): for each group, the nearest value after the member
    going round, itself not counted."""
    n = len(loop)
    answers: list[list[Any]] = [[None] * len(owns[0]) for _ in loop]
    for g in range(len(owns[0])):
        nearest, nearest_at = None, -1
        for x in range(2 * n - 1, -1, -1):  # twice round: "after" wraps
            if x < n:
                answers[x][g] = nearest if nearest_at < x + n else None
            if owns[x % n][g] is not None:
                nearest, nearest_at = owns[x % n][g], x
    for member, answer in zip(loop, answers, strict=True):
        memo[member.span_id] = tuple(answer)
