"""A real OTLP/HTTP trace receiver on 127.0.0.1 that answers only when its gate is open:
a collector slower than the spans that end, held as long as a test needs (no sleeps)."""

from __future__ import annotations

from tt_testkit import OtlpHttpSink


class GatedTraceReceiver(OtlpHttpSink):
    """Keeps the spans of each export, then waits for `gate` before answering 200."""

    def __init__(self) -> None:
        super().__init__(paths=("/v1/traces",), gated=True)

    @property
    def exports(self) -> int:
        with self._lock:
            return len(self.posts)

    @property
    def spans(self) -> int:
        return len(self.span_names())

    def wait_for_exports(self, count: int, timeout_s: float = 30.0) -> bool:
        return self.wait_for_posts(count, timeout_s)
