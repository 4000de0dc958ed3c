"""Engine steps and GPU samples replayed from the write-ahead log at start are written once:
a record past the checkpoint may hold rows committed before the stop, and these tables have no
trace id to recheck, so the writer leaves out those the store holds (`WriteBatch.replayed`)."""

from __future__ import annotations

from pathlib import Path

from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.collector.writer import WriteBatch, Writer
from tokentrace.store.connection import open_db

T0 = 1_700_000_000_000_000_000


def _steps(n: int) -> list[EngineStep]:
    return [
        EngineStep(service="engine", instance="i-1", start_ns=T0 + i * 1000, duration_us=1000,
                   prefill_tokens=10, decode_seqs=1, batch_size=2, queue_depth=0)
        for i in range(n)
    ]  # fmt: skip


def _samples(n: int) -> list[dict[str, object]]:
    return [
        {"service": "engine", "instance": "i-1", "gpu_index": 0, "ts_ns": T0 + i, "utilization_pct": 50.0}
        for i in range(n)
    ]


def _counts(conn) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    [(steps,)] = conn.execute("SELECT count(*) FROM engine_steps").fetchall()
    [(samples,)] = conn.execute("SELECT count(*) FROM gpu_samples").fetchall()
    return steps, samples


def test_replayed_steps_and_samples_the_store_holds_are_left_out(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "r.duckdb")
    writer = Writer(conn)
    try:
        assert writer.submit(WriteBatch(engine_steps=_steps(3), gpu_samples=_samples(2)))
        writer.flush()
        # the replay: the same rows and one of each that the stop lost
        assert writer.submit(WriteBatch(engine_steps=_steps(4), gpu_samples=_samples(3), replayed=True))
        writer.flush()
        assert _counts(conn) == (4, 3)
        # not replayed: stored as they come, as before (an engine may send equal steps)
        assert writer.submit(WriteBatch(engine_steps=_steps(1), gpu_samples=_samples(1)))
        writer.flush()
        assert _counts(conn) == (5, 4)
    finally:
        writer.close()
        conn.close()
