"""The engine recordings' spans offered to the collector's pipeline as a live `serve` gets
them: each one when its process exports it, on a fake clock, into a real DuckDB file.

On a busy machine vLLM's front end streams far behind its engine (the recorded chat-005:
vLLM's span 59 ms, the client's stream 325 ms), and the client exports httpx's `POST` span
(ended at the response headers) long before OpenInference's `ChatCompletion` above it
(ended at the stream's end).  A live run once decided such a trace at `client_wait`
without the `ChatCompletion`, and the headers' time passed for the user's E2E (127.8 ms
against the client's 306.5 ms).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from recordings import CLIENT_AGREE_MS, LLM_REQUEST, load

from tokentrace.analyzer.spans import KIND_SERVER, Span
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.sampling import P99Tracker, Sampler
from tokentrace.collector.writer import Writer
from tokentrace.store.connection import open_db

NS = 1_000_000_000
GRACE_S, CLIENT_WAIT_S, DECISION_WAIT_S = 2.0, 7.0, 30.0
TICK_NS = NS // 10
#: the recorded request whose live twin was decided without its client's call span
CHAT_005 = "b0ed069537602b90186710d83e714dfc"


class Rig:
    """A pipeline as `serve` runs it (its waits at their defaults), on a fake clock."""

    def __init__(self, db: Path) -> None:
        self.now = 1_000 * NS
        self.conn = open_db(db)
        self.writer = Writer(self.conn, max_pending=256)
        self.pipeline = Pipeline(
            self.writer,
            Sampler(baseline=1.0, p99=P99Tracker(warmup=0)),  # every trace kept, and read
            grace_s=GRACE_S,
            server_wait_s=CLIENT_WAIT_S,
            client_wait_s=CLIENT_WAIT_S,
            decision_wait_s=DECISION_WAIT_S,
            clock=lambda: self.now,
        )

    def replay(self, arrivals: Sequence[tuple[float, list[Span]]]) -> dict[str, float]:
        """Offers each export at its time (s from the first), deciding every 0.1 s, and then
        until nothing is left; gives the time (s) each trace was decided at."""
        decided: dict[str, float] = {}
        start = self.now
        pending = sorted(arrivals, key=lambda a: a[0])
        while pending or self.pipeline.stats.spans_accepted > self._written():
            while pending and self.now - start >= pending[0][0] * NS:
                assert self.pipeline.offer(pending.pop(0)[1]) is None
            before = set(self._trace_ids())
            self.pipeline.decide_ready()
            for trace_id in set(self._trace_ids()) - before:
                decided[trace_id] = (self.now - start) / NS
            self.now += TICK_NS
            assert self.now - start < 2 * DECISION_WAIT_S * NS, "traces never decided"
        return decided

    def _trace_ids(self) -> list[str]:
        self.writer.flush()
        return [r[0] for r in self.conn.execute("SELECT DISTINCT trace_id FROM spans").fetchall()]

    def _written(self) -> int:
        self.writer.flush()
        return int(self.conn.execute("SELECT count(*) FROM spans").fetchone()[0])

    def rows(self) -> dict[str, dict[str, Any]]:
        self.writer.flush()
        cursor = self.conn.execute("SELECT * FROM requests")
        cols = [d[0] for d in cursor.description]
        rows = [dict(zip(cols, r, strict=True)) for r in cursor.fetchall()]
        return {r["trace_id"]: r for r in rows}


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    made = Rig(tmp_path / "arrivals.duckdb")
    yield made
    made.writer.close()
    made.conn.close()


def _busy_client(spans: list[Span]) -> list[tuple[float, list[Span]]]:
    """Gives each span's arrival (s from the first span's start): vLLM's 0.2 s after its end
    (its export schedule in the recordings), the client's HTTP span 3 s after its end and its
    call span 8 s after (a machine so busy that the streams, and the client's exports, ran
    seconds behind the engine)."""
    t0 = min(s.start_ns for s in spans)
    lag_s = {"POST": 3.0, "ChatCompletion": 8.0, LLM_REQUEST: 0.2}
    return [((s.end_ns - t0) / NS + lag_s[s.name], [s]) for s in spans]


def test_openinference_call_span_seconds_after_its_http_span_still_times_the_user(
    rig: Rig,
) -> None:
    rec = load("chat_openinference")
    decided = rig.replay(_busy_client(rec.spans))
    rows = rig.rows()
    assert len(rows) == len(rec.client) == 12
    for m in rec.client:
        row = rows[m["trace_id"]]
        assert "root_missing" not in row["flags"], m["key"]
        assert row["e2e_ms"] == pytest.approx(m["e2e_ms"], abs=CLIENT_AGREE_MS), m["key"]
        assert row["ttft_client_ms"] == pytest.approx(m["first_chunk_ms"], abs=CLIENT_AGREE_MS)
    # decided at the call span's grace: its own arrival is ~8.3 s after the first start
    assert 8.0 + GRACE_S < decided[CHAT_005] < 9.0 + GRACE_S


def test_a_call_span_that_never_comes_is_waited_for_until_decision_wait(rig: Rig) -> None:
    rec = load("chat_openinference")
    spans = [s for s in rec.trace(CHAT_005) if s.name != "ChatCompletion"]
    decided = rig.replay(_busy_client(spans))
    # the trace's root never came: decided at decision_wait, the HTTP span standing in
    assert DECISION_WAIT_S <= decided[CHAT_005] < DECISION_WAIT_S + 1
    assert "root_missing" in rig.rows()[CHAT_005]["flags"]


def test_a_gateway_whose_client_never_reports_waits_client_wait(rig: Rig) -> None:
    # vLLM under a gateway's SERVER span, itself under an uninstrumented client: the gateway
    # came, the span it names never will; decided at client_wait after vLLM's span
    rec = load("chat_openinference")
    server = next(s for s in rec.trace(CHAT_005) if s.name == LLM_REQUEST)
    post = next(s for s in rec.trace(CHAT_005) if s.name == "POST")
    gateway = dataclasses.replace(post, name="gateway", kind=KIND_SERVER)
    decided = rig.replay([(0.0, [server]), (3.0, [gateway])])
    assert CLIENT_WAIT_S <= decided[CHAT_005] < CLIENT_WAIT_S + 0.5
    row = rig.rows()[CHAT_005]
    assert row["source"] == "vllm" and row["network_ms"] is None
