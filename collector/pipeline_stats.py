"""The pipeline's counts, kept once: the pipeline adds to them, /metrics reads them at
each scrape (`metric_views.PipelineCounts`), `tokentrace import` reports them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class PipelineStats:
    """Running totals of one pipeline; written under its locks, read anywhere."""

    spans_received: int = 0
    spans_accepted: int = 0
    spans_rejected: int = 0
    #: traces decided, by (kept, reason)
    decided: dict[tuple[bool, str], int] = field(default_factory=dict)
    traces_evicted_early: int = 0
    late_spans_kept: int = 0
    late_spans_dropped: int = 0
    #: late spans of a kept trace whose span id was already stored with it
    late_duplicates_dropped: int = 0
    #: repeats of a span id within a buffered trace
    duplicate_spans_dropped: int = 0
    #: decided traces the writer checks against the store (`WriteBatch.recheck`)
    traces_rechecked: int = 0
    #: traces the analyzer or the sampler failed on: kept whole, unsummarized
    traces_unsummarized: int = 0
    requests_summarized: int = 0
    #: what decision rounds handed over after the writer thread had stopped: never
    #: written (`commit.Handover`); rows as the writer counts them (`WriteBatch.row_count`)
    batches_lost: int = 0
    traces_lost: int = 0
    rows_lost: int = 0

    @property
    def traces_decided(self) -> int:
        return sum(self.decided.values())

    @property
    def traces_kept(self) -> int:
        return sum(n for (keep, _), n in self.decided.items() if keep)

    @property
    def kept_by_reason(self) -> dict[str, int]:
        return {reason: n for (keep, reason), n in self.decided.items() if keep}
