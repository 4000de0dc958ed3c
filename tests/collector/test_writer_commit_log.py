"""Each writer transaction stamps its rows with one `commit_seq` and logs itself in
`commit_log`: what a shard moves into the lake by, and where the OTLP write-ahead log's replay
starts (`wal_from`).  A batch split apart after a bad row commits its checkpoint only once
every piece is written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from otlp_traces import request_trace

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.collector.writer import WriteBatch, Writer, last_commit_seq, wal_checkpoint
from tokentrace.store.connection import open_db
from tokentrace.store.schema import DATA_TABLES


def _requests(service: str) -> list[Any]:
    return summarize_trace(request_trace(service=service)).requests


def _step(prefill_tokens: int) -> EngineStep:
    return EngineStep(
        service="engine", instance="i-1", start_ns=1_700_000_000_000_000_000, duration_us=1000,
        prefill_tokens=prefill_tokens, decode_seqs=1, batch_size=2, queue_depth=0,
    )  # fmt: skip


def test_rows_carry_their_transactions_seq_and_the_log_its_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "c.duckdb"
    conn = open_db(db)
    writer = Writer(conn)
    assert writer.last_seq == 0 and writer.wal_from is None
    assert writer.submit(WriteBatch(requests=_requests("a"), wal_from=5))
    writer.flush()
    assert writer.submit(WriteBatch(engine_steps=[_step(10)]))
    writer.flush()
    assert writer.submit(WriteBatch(wal_from=9))  # a round that decided nothing moves it too
    writer.flush()
    log = conn.execute("SELECT seq, wal_from FROM commit_log ORDER BY seq").fetchall()
    assert log == [(1, 5), (2, None), (3, 9)]
    assert conn.execute("SELECT DISTINCT commit_seq FROM requests").fetchall() == [(1,)]
    assert conn.execute("SELECT DISTINCT commit_seq FROM itl_hist").fetchall() == [(1,)]
    assert conn.execute("SELECT DISTINCT commit_seq FROM engine_steps").fetchall() == [(2,)]
    for table in DATA_TABLES:  # no row is left without its transaction
        [(n,)] = conn.execute(f"SELECT count(*) FROM {table} WHERE commit_seq IS NULL").fetchall()  # noqa: S608
        assert n == 0, table
    writer.close()
    conn.close()
    again = open_db(db)  # a restart carries on after the last seq, from the same checkpoint
    try:
        assert last_commit_seq(again) == 3 and wal_checkpoint(again) == 9
        restarted = Writer(again)
        assert restarted.submit(WriteBatch(requests=_requests("b")))
        restarted.flush()
        assert restarted.last_seq == 4 and restarted.wal_from == 9
        restarted.close()
    finally:
        again.close()


def test_a_batch_written_apart_commits_its_checkpoint_after_its_last_piece(tmp_path: Path) -> None:
    conn = open_db(tmp_path / "c.duckdb")
    writer = Writer(conn)
    try:
        # 2**40 prefill tokens fit no INTEGER: the batch fails whole, then goes in apart
        assert writer.submit(WriteBatch(requests=_requests("ok"), engine_steps=[_step(2**40)], wal_from=7))
        writer.flush()
        log = conn.execute("SELECT seq, wal_from FROM commit_log ORDER BY seq").fetchall()
        assert log[-1][1] == 7 and all(w is None for _, w in log[:-1]), log
        assert writer.write_errors == 1
        assert conn.execute("SELECT count(*) FROM requests").fetchall() == [(1,)]
    finally:
        writer.close()
        conn.close()
