"""Replaying the OTLP write-ahead log at start, before the receivers open
(`collector/wal.py` says what is logged and why).

Each record from the store's checkpoint on goes through the decode path its receiver
used, into the pipeline as the record it was (its seq), its traces marked for a
recheck: a record past the checkpoint may hold traces that were decided and committed
after it, and the writer leaves out what the store holds (`stored.StoredRows`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from tokentrace.collector.otlp import OtlpDecodeError, decode_json_body, decode_protobuf_partial
from tokentrace.collector.otlp_metrics import decode_metrics_json_body, decode_metrics_protobuf
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.wal import WriteAheadLog
from tokentrace.collector.wal_format import (
    KIND_METRICS_JSON,
    KIND_METRICS_PROTOBUF,
    KIND_TRACES_JSON,
    WalRecord,
)
from tokentrace.collector.writer import WriteBatch

logger = logging.getLogger("tokentrace.collector")

#: How long a replay waits for room (the writer's queue) before it tries again.
_ROOM_WAIT_S = 0.05


@dataclass(slots=True)
class Replayed:
    """What a replay took from the log."""

    records: int = 0
    spans: int = 0
    gpu_samples: int = 0
    #: records that no longer decode (a bug, or a log written by another version)
    unreadable: int = 0


def replay(wal: WriteAheadLog, pipeline: Pipeline, checkpoint: int | None) -> Replayed:
    """Feeds every record from `checkpoint` on (all with None) to the pipeline; logs
    one line of what it replayed, and gives it."""
    done = Replayed()
    for record in wal.records_from(checkpoint):
        try:
            _replay_one(record, pipeline, done)
        except (OtlpDecodeError, ValueError) as exc:
            done.unreadable += 1
            logger.error(
                "tokentrace: write-ahead log record %d no longer decodes (%s); skipped",
                record.seq, exc,
            )  # fmt: skip
            continue
        done.records += 1
    if done.records or done.unreadable:
        logger.warning(
            "tokentrace: replayed %d records of the write-ahead log (%d spans, %d GPU "
            "samples) that the store had not committed before the last stop%s",
            done.records, done.spans, done.gpu_samples,
            f"; {done.unreadable} records did not decode" if done.unreadable else "",
        )  # fmt: skip
    return done


def _replay_one(record: WalRecord, pipeline: Pipeline, done: Replayed) -> None:
    kind, payload = record.kind, record.payload
    if kind in (KIND_METRICS_PROTOBUF, KIND_METRICS_JSON):
        proto = kind == KIND_METRICS_PROTOBUF
        rows = (decode_metrics_protobuf if proto else decode_metrics_json_body)(payload).rows
        if rows:
            while not pipeline.add_engine_data(WriteBatch(gpu_samples=rows, replayed=True)):
                time.sleep(_ROOM_WAIT_S)  # the writer catches up
        done.gpu_samples += len(rows)
        return
    decode = decode_json_body if kind == KIND_TRACES_JSON else decode_protobuf_partial
    spans, _rejected = decode(payload)  # (the rejected spans were answered as such)
    if not spans:
        return
    while pipeline.replay(spans, record.seq) is not None:
        # the buffer or the writer's queue is full: decide what is due (past the high
        # water mark, the oldest traces early), and give the writer time
        pipeline.decide_ready()
        time.sleep(_ROOM_WAIT_S)
    done.spans += len(spans)
