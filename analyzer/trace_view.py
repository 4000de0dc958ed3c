"""A trace's spans indexed for the adapters: by id, by parent, and the client side."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

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
A = TypeVar("A")
T = TypeVar("T")


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
        self._top: dict[str, Span | None] = {}
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
        found = self.fold_ancestors(span, self._top, _farther, None, _tops_round)
        return span if found is None else found

    def client_span_of(self, server_span: Span) -> Span | None:
        """Gives the nearest CLIENT-kind ancestor (remembered as `top` is).  The user's
        side of a request is the outermost one it owns: `conventions/_sides.py`."""
        return self.fold_ancestors(server_span, self._client, _client_or, None, _clients_round)

    def inherited(self, span: Span, groups: KeyGroups = CONTEXT_KEYS) -> tuple[Any, ...]:
        """Gives, for each group of keys, the first of them on the ancestors of `span`,
        nearest first (each one's attributes, then its resource; an empty string is none),
        None where none has one: the request's context (tenant, traffic class,
        environment) that the application set on a span around the call
        (docs/conventions.md).  Remembered as `top` is.
        """
        return self.fold_ancestors(
            span,
            self._inherited.setdefault(groups, {}),
            lambda above, found: _nearer(_own(above, groups), found),
            (None,) * len(groups),
            lambda loop: _owns_round([_own(x, groups) for x in loop]),
        )

    def fold_ancestors(
        self,
        span: Span,
        memo: dict[str, A],
        step: Callable[[Span, A], A],
        init: A,
        round_loop: Callable[[list[Span]], list[A]],
    ) -> A:
        """Gives `step` folded over `ancestors(span)` from `init`, the farthest first
        (`step(parent, answer of the parent)` is a span's answer).

        Remembered in `memo` (by span id, of the spans `by_id` holds) for every span its
        walk up passes: asked of each span of a chain of n, it costs the spans once, not
        n^2/2 (a hostile export).  In a loop of parent ids (each member's parent the next,
        the last one's the first) `round_loop` gives each member's answer, the fold going
        round from its parent, itself not counted, in one pass round the loop.
        """
        if self.by_id.get(span.span_id) is not span:  # a repeated span id: not remembered
            found = init
            for above in reversed(list(self.ancestors(span))):
                found = step(above, found)
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
            if parent is None:  # the walk ends at the last span of the path
                found, upto = init, len(path)
                break
            if parent.span_id in memo:  # a span answered before: the way up goes on so
                # (the spans above it were answered with it, so the path is none of
                # them: the parent's answer holds for the path even in a loop)
                found, upto = step(parent, memo[parent.span_id]), len(path)
                break
            if parent.span_id in at:  # a loop: path[j:] goes round it, path[:j] leads into it
                j = at[parent.span_id]
                loop = path[j:]
                for member, answer in zip(loop, round_loop(loop), strict=True):
                    memo[member.span_id] = answer
                found = init  # a span leading in is entered at loop[0], walks it once round
                for x in reversed(loop):
                    found = step(x, found)
                upto = j
                break
            s = parent
        for s in reversed(path[:upto]):
            memo[s.span_id] = found
            found = step(s, found)
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


def _farther(above: Span, found: Span | None) -> Span | None:
    return above if found is None else found


def _client_or(above: Span, found: Span | None) -> Span | None:
    return above if above.kind == KIND_CLIENT else found


def _tops_round(loop: list[Span]) -> list[Span | None]:
    """Gives each loop member's farthest ancestor: the member before it (of the first,
    the last)."""
    return [loop[x - 1] for x in range(len(loop))]


def _clients_round(loop: list[Span]) -> list[Span | None]:
    return _nearest_round([x if x.kind == KIND_CLIENT else None for x in loop])


def _owns_round(owns: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Gives, for each loop member and each group, the nearest value after it going
    round, itself not counted."""
    per_group = [_nearest_round([own[g] for own in owns]) for g in range(len(owns[0]))]
    return [tuple(answer) for answer in zip(*per_group, strict=True)]


def _nearest_round(values: Sequence[T | None]) -> list[T | None]:
    """Gives, for each place of a loop, the first value that is not None after it going
    round (the last's next is the first), its own not counted."""
    n = len(values)
    answers: list[T | None] = [None] * n
    nearest, nearest_at = None, -1
    for x in range(2 * n - 1, -1, -1):  # twice round: "after" wraps
        if x < n:
            answers[x] = nearest if nearest_at < x + n else None
        if values[x % n] is not None:
            nearest, nearest_at = values[x % n], x
    return answers
