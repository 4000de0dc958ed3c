"""When a buffered trace is ready to decide: the wait queues.  Oldest first:

- a trace whose root came `grace` ago.  The root is the span without a parent, or a
  SERVER span whose parent is not in the trace (a `traceparent` from an uninstrumented
  client, or vLLM's `llm_request` under a gateway);
- a trace rooted in an LLM client span whose server side has not come: `server_wait`
  after the root, or `grace` after the server's spans come.  The client and the server
  are two processes that export on their own schedules: tokentrace's SDK every 0.5 s,
  vLLM's (OpenTelemetry's default) every 5 s, so the user's client span often comes
  seconds before the engine's; decided at `grace`, the request would read as
  client-only and the engine's spans would come too late to count;
- a trace rooted in a SERVER span whose parent (the client's span, from its
  `traceparent`) has not come: `client_wait` after the root, or `grace` after the
  parent comes.  The reverse of the above: a client that exports on OpenTelemetry's
  default schedule (every 5 s) sends its span after the server's, and decided at
  `grace` the request would lose its network and the user's TTFT.  A parent that
  comes under a span still to come is the client's HTTP span under its LLM call's
  (httpx's `POST` under OpenInference's `ChatCompletion`): the HTTP span ends at the
  response headers, the call's span at the stream's end and later in its export, so
  the trace is then left to its root's `grace`, or `decision_wait`, as one whose HTTP
  span came before the server's; decided at `client_wait`, the headers' time would
  pass for the user's;
- a trace that waited `decision_wait` (its root never came);
- when the buffer passes its high-water mark, the oldest traces, early
  (`TraceBuffer.overflow`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from tokentrace.analyzer.conventions.genai_client import is_llm_client
from tokentrace.analyzer.spans import KIND_SERVER
from tokentrace.analyzer.summary import FLAG_SERVER_UNSEEN
from tokentrace.collector.trace_buffer import PendingTrace, TraceBuffer

#: Traces taken from the buffer to decide, with their trace ids, in the order decided.
Ready = list[tuple[str, PendingTrace]]


class WaitQueue:
    """Traces held past their grace for the other side of the request: (receive time
    of the root, trace id) in receive order, so the due ones are at the front, and
    the ids of those not decided yet."""

    __slots__ = ("ids", "queue", "wait_ns")

    def __init__(self, wait_s: float) -> None:
        self.wait_ns = int(wait_s * 1e9)
        self.queue: deque[tuple[int, str]] = deque()
        self.ids: set[str] = set()

    def add(self, received: int, trace_id: str) -> None:
        """Holds the trace from `received` on (a trace already held keeps its first time)."""
        if trace_id not in self.ids:
            self.queue.append((received, trace_id))
            self.ids.add(trace_id)

    def due(self, now: int) -> Iterator[str]:
        """Gives the held traces whose wait is over (each leaves the queue)."""
        queue, ids = self.queue, self.ids
        while queue and now - queue[0][0] >= self.wait_ns:
            trace_id = queue.popleft()[1]
            if trace_id in ids:  # (else decided already)
                yield trace_id


def awaits_server(p: PendingTrace) -> bool:
    """Gives whether the trace holds an LLM client span with no SERVER span below it: a
    request whose server side has not come (yet, or ever: an uninstrumented server)."""
    packed = p.packed
    if packed is not None and packed.pre is not None:
        # the decode worker's summary says it, without unpacking the spans; spans
        # that came since are the server's when one of them is a SERVER span
        if any(s.kind == KIND_SERVER for s in p.spans):
            return False
        return any(FLAG_SERVER_UNSEEN in r.flags for r in packed.pre.requests)
    spans = p.all_spans()
    by_id = {s.span_id: s for s in spans}
    served: set[str] = set()  # spans with a SERVER span below them
    for s in spans:
        if s.kind == KIND_SERVER:
            parent = s.parent_span_id
            # each span marked once: linear, and a loop of parent ids ends at a marked one
            while parent and parent not in served and parent in by_id:
                served.add(parent)
                parent = by_id[parent].parent_span_id
    return any(s.span_id not in served and is_llm_client(s) for s in spans)


def _held_ids(p: PendingTrace) -> set[str]:
    """Gives the span ids of the pending trace that a root candidate's parent may be among."""
    if p.packed is not None and not p.spans:
        # one worker's spans only, and it listed no root candidate whose parent
        # is among them
        return set()
    return {s.span_id for s in p.all_spans()}


class DecisionWaits:
    """The root candidates of the buffered traces and the traces held for the other
    side of their request; gives the traces that are ready.  Not thread-safe: the
    pipeline's lock guards it."""

    def __init__(
        self, grace_s: float, server_wait_s: float, client_wait_s: float, decision_wait_s: float
    ) -> None:
        self.grace_ns = int(grace_s * 1e9)
        self.decision_wait_ns = int(decision_wait_s * 1e9)
        # (receive time, trace id, parent span id or "" for a parentless root),
        # in receive order, so the ready ones are always at the front
        self.roots: deque[tuple[int, str, str]] = deque()
        #: traces rooted in an LLM client span waiting for their server side (`awaits_server`)
        self.for_server = WaitQueue(server_wait_s)
        #: traces rooted in a SERVER span waiting for its parent, the client's span
        self.for_client = WaitQueue(client_wait_s)
        #: the span each trace in `for_client` waits for: the parent its latest SERVER
        #: root names (a gateway's SERVER span that came names the client's span above it)
        self.awaited: dict[str, str] = {}

    def _take(self, buffer: TraceBuffer, trace_id: str, out: Ready) -> None:
        out.append((trace_id, buffer.take(trace_id)))
        self.for_server.ids.discard(trace_id)
        self.for_client.ids.discard(trace_id)
        self.awaited.pop(trace_id, None)

    def take_all(self, buffer: TraceBuffer) -> Ready:
        """Gives every buffered trace, oldest first (a forced round: shutdown, import)."""
        ready: Ready = []
        for trace_id in list(buffer.pending):
            self._take(buffer, trace_id, ready)
        self.roots.clear()
        self.for_server.queue.clear()
        self.for_client.queue.clear()
        self.awaited.clear()
        return ready

    def take_ready(self, now: int, buffer: TraceBuffer) -> tuple[Ready, int]:
        """Gives the traces ready at `now`, taken from the buffer, and how many of them
        were evicted early (the buffer past its high-water mark)."""
        ready: Ready = []
        pending = buffer.pending
        roots = self.roots
        grace = self.grace_ns
        for_server, for_client = self.for_server, self.for_client
        # the span ids of each trace looked into, once a round: a trace of n SERVER
        # spans has n root candidates, and each scanning its spans is n^2 under the lock
        held: dict[str, set[str]] = {}
        while roots and now - roots[0][0] >= grace:
            received, trace_id, parent = roots.popleft()
            p = pending.get(trace_id)
            if p is None:
                continue  # decided already
            if parent:
                ids = held.get(trace_id)
                if ids is None:
                    ids = held[trace_id] = _held_ids(p)
                if parent in ids and trace_id not in for_server.ids:
                    continue  # a SERVER span under a span we have: not the root
                # (under the client span that waited for it: the server side came)
                if parent not in ids and for_client.wait_ns > grace:
                    for_client.add(received, trace_id)
                    self.awaited[trace_id] = parent
                    continue  # its parent may come: decided at client_wait, or
                    # at grace after the parent (a root of its own) comes
            elif for_server.wait_ns > grace and awaits_server(p):
                for_server.add(received, trace_id)
                continue
            self._take(buffer, trace_id, ready)
        for trace_id in for_server.due(now):
            self._take(buffer, trace_id, ready)
        for trace_id in for_client.due(now):
            awaited = self.awaited.pop(trace_id, "")
            if awaited in _held_ids(pending[trace_id]):
                # it came, under a span still to come (else, a root, it was decided at
                # its grace): the trace's root decides it, as any trace's
                for_client.ids.discard(trace_id)
                continue
            self._take(buffer, trace_id, ready)
        wait = self.decision_wait_ns
        while pending:
            trace_id, p = next(iter(pending.items()))
            if now - p.first_seen_ns < wait:
                break
            self._take(buffer, trace_id, ready)
        evicted = 0
        for trace_id in buffer.overflow():
            self._take(buffer, trace_id, ready)
            evicted += 1
        return ready, evicted
