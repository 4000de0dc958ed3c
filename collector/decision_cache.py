"""The decisions of recent traces, so that spans coming after their trace was decided
follow its decision instead of being summarized again as a request of their own.

A late span of a kept trace is written with it, unless the trace holds its span id
already (an exporter's retry: the kept traces' span ids are cached with their
decisions); a late span of a dropped trace is dropped.  Both are counted.

A trace decided beyond the cache's reach (before this process opened the store, or so
long ago that the cache forgot it) may be a re-sent copy of one written then: the
recheck horizon says which traces may be, and the writer looks those up in the store
(`collector/stored.py`).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from tokentrace.analyzer.spans import Span
from tokentrace.collector.pipeline_stats import PipelineStats
from tokentrace.collector.stored import RESEND_MARGIN_NS


def span_ids(spans: Sequence[Span]) -> bytearray:
    """Gives the span ids newline-delimited (with a newline at each end), the compact
    form `DecisionCache.keep_late` searches: ~17 bytes a span, one object a trace."""
    return bytearray(("\n" + "\n".join([s.span_id for s in spans]) + "\n").encode())


def _add_if_new(ids: bytearray, span_id: str) -> bool:
    """Gives whether the span id was not yet in `ids`; adds it when it was not."""
    if f"\n{span_id}\n".encode() in ids:
        return False
    ids += f"{span_id}\n".encode()
    return True


class DecisionCache:
    """The last `size` decisions (True: kept), the late spans that follow them, and what
    the cache forgot.  Not thread-safe: the pipeline's lock guards it, but for what only
    the decider reads (`rechecked_among`, `decided` in its own round)."""

    def __init__(self, size: int, stats: PipelineStats) -> None:
        self.size = size
        self._stats = stats
        self.decided: OrderedDict[str, bool] = OrderedDict()
        # span ids of the kept traces in `decided` (late spans included), to
        # drop a late span stored already; only late spans ever look them up
        self.kept_span_ids: dict[str, bytearray] = {}
        #: late spans of kept traces, for the next decision round to hand to the writer
        self._late: list[Span] = []
        # Beyond the cache's reach (`recheck_horizon`): [traces, latest start] of each
        # decision round still in `decided`, oldest first; the latest start of a trace
        # whose decision the cache forgot; the cached traces the writer rechecked
        self._rounds: deque[list[int]] = deque()
        self._forgotten_until_ns = 0
        self._rechecked: set[str] = set()

    def get(self, trace_id: str) -> bool | None:
        """Gives the cached decision of a trace (True kept), None when not cached."""
        return self.decided.get(trace_id)

    def keep_late(self, trace_id: str, spans: Iterable[Span]) -> None:
        """Queues the late spans of a kept trace for writing, but for those whose span
        id it holds already."""
        ids = self.kept_span_ids.get(trace_id)
        stats = self._stats
        for s in spans:
            if ids is None or _add_if_new(ids, s.span_id):
                self._late.append(s)
                stats.late_spans_kept += 1
            else:
                stats.late_duplicates_dropped += 1

    def drop_late(self, count: int) -> None:
        """Counts `count` late spans of a dropped trace, dropped with it."""
        self._stats.late_spans_dropped += count

    def take_late(self) -> list[Span]:
        """Gives the late spans queued since the last call."""
        late, self._late = self._late, []
        return late

    def rechecked_among(self, spans: Sequence[Span]) -> set[str]:
        """Gives the trace ids of the spans whose trace the writer rechecked: a late
        span of such a trace may be stored already too."""
        rechecked = self._rechecked
        if not rechecked:
            return set()
        return {s.trace_id for s in spans if s.trace_id in rechecked}

    def recheck_horizon(self, stored_until_ns: int) -> int:
        """Gives the latest start (unix ns) a decided trace may have and still be a copy of
        one written beyond the cache's reach, -1 when there is none.  `stored_until_ns`:
        the latest start stored before this process opened the store."""
        # a re-sent copy starts when its first copy did (within RESEND_MARGIN_NS for a part
        # of a trace), so a trace that started later is new: only the few that started
        # earlier cost the writer a look into the store
        until = max(stored_until_ns, self._forgotten_until_ns)
        return until + RESEND_MARGIN_NS if until else -1

    def record(
        self,
        decisions: Sequence[tuple[str, bool]],
        kept_ids: Iterable[tuple[str, bytearray]],
        round_start: int,
        recheck: set[str],
    ) -> None:
        """Caches one round's decisions, with the span ids of its kept traces, the latest
        start among them and the traces it marked for a recheck; forgets the oldest
        decisions beyond `size`."""
        cache, ids = self.decided, self.kept_span_ids
        for trace_id, keep in decisions:
            cache[trace_id] = keep
        ids.update(kept_ids)
        rounds = self._rounds
        if decisions:
            rounds.append([len(decisions), round_start])
        rechecked = self._rechecked
        rechecked |= recheck
        while len(cache) > self.size:
            trace_id, keep = cache.popitem(last=False)
            if keep:
                ids.pop(trace_id, None)
            rechecked.discard(trace_id)
            oldest = rounds[0]  # the forgotten trace's round
            self._forgotten_until_ns = max(self._forgotten_until_ns, oldest[1])
            oldest[0] -= 1
            if not oldest[0]:
                rounds.popleft()
