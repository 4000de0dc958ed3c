"""The OTLP write-ahead log: what the receivers acknowledge survives a `kill -9`.

The tail buffer holds each trace for seconds before it is decided and written
(docs/design.md §4), and before this log a collector killed in that time lost
whatever it had answered 200 for.  Now an export the pipeline takes is appended
here, and its receiver answers 200 / OK only once the record is on disk; a
restart replays what the store had not yet committed (what Tempo's ingesters
and the OpenTelemetry Collector's persistent queue do).

- **What is logged.** The export as the receiver took it (the decompressed body,
  protobuf or OTLP/JSON: `wal_format`), one record an export, after it decoded and
  the pipeline took it (`Pipeline.offer`): a refused or malformed export is never
  logged.  Log exports are not logged: nothing of them is stored.
- **Group commit.** `append` only queues the payload (no copy) and gives a seq; one
  flusher thread writes everything queued with one `writev` and one `fdatasync`, and
  wakes every waiter of that group.  Receivers wait for their group (`Durable`), the
  event loop through one future a group.  While one sync runs the next group fills,
  so the syncs a second fall as the load grows, never below what the disk allows.
- **Seq and checkpoint.** Seqs are given in the pipeline's lock, in the order the
  exports enter the tail buffer, so the oldest buffered trace holds the smallest seq
  still needed (`Pipeline` puts it on each round's `WriteBatch.wal_from`; the writer
  commits it in `commit_log` with the round's rows).  A restart replays from the
  newest committed `wal_from`.  A replayed record may hold traces the store already
  has (they were decided after the checkpoint was written): they are rechecked
  (`stored.StoredRows`), not written twice.
- **Segments.** Records go to segment files of `segment_bytes` (64 MiB); a segment
  whose every record lies below the committed checkpoint is deleted (`release`).  A
  restart never appends to an old segment: a torn tail stays where it is, ignored.
- **Failure.** A write or sync that fails (disk full, read-only) fails its whole group:
  those receivers answer 503 with the reason, `/readyz` says it, and the segment is cut
  back to before the group, so that a later group is never behind a half-written record.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tokentrace.collector.wal_format import (
    WalRecord,
    read_segment,
    record_header,
    segment_name,
    segment_paths,
)

logger = logging.getLogger("tokentrace.collector")

#: A segment is closed, and a new one opened, once it holds this many bytes.
SEGMENT_BYTES = 64 * 1024 * 1024
#: The most iovecs one writev takes (IOV_MAX is 1024 on Linux).
_IOV_MAX = 1024


class WalError(OSError):
    """The log could not make an export durable."""


def wal_dir(db: str | os.PathLike[str]) -> Path:
    """Gives the log's directory beside the database file: `<db>.otlp-wal/`."""
    path = Path(db)
    return path.with_name(path.name + ".otlp-wal")


class Durable:
    """One group commit: done once its records are synced (or failed, `error`)."""

    __slots__ = ("_done", "_futures", "_lock", "error")

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._futures: dict[asyncio.AbstractEventLoop, asyncio.Future[None]] = {}
        self.error: str | None = None

    def wait(self, timeout: float | None = None) -> None:
        """Waits until the group is on disk; raises WalError when it could not be."""
        if not self._done.wait(timeout):
            raise WalError("the write-ahead log did not sync in time")
        if self.error is not None:
            raise WalError(self.error)

    async def wait_async(self) -> None:
        """`wait` for an event loop: one future a loop and group, whatever the waiters."""
        if not self._done.is_set():
            loop = asyncio.get_running_loop()
            with self._lock:
                future = None if self._done.is_set() else self._futures.get(loop)
                if future is None and not self._done.is_set():
                    future = self._futures[loop] = loop.create_future()
            if future is not None:
                await asyncio.shield(future)
        if self.error is not None:
            raise WalError(self.error)

    def finish(self, error: str | None) -> None:
        self.error = error
        with self._lock:
            self._done.set()
            futures = list(self._futures.items())
        for loop, future in futures:
            with contextlib.suppress(RuntimeError):  # a loop closed meanwhile
                loop.call_soon_threadsafe(_resolve, future)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


@dataclass(slots=True)
class _Segment:
    path: Path
    first_seq: int
    #: the seq of its last record (first_seq - 1 while empty)
    last_seq: int


class WriteAheadLog:
    """The log of one collector: `append` from any thread, a flusher thread syncs."""

    def __init__(
        self,
        directory: Path,
        *,
        checkpoint: int | None = None,
        segment_bytes: int = SEGMENT_BYTES,
        on_sync: Callable[[float, int, int], None] | None = None,
    ) -> None:
        """Opens (creates) the log; `checkpoint`: the store's committed `wal_from` (the
        first record still needed), so that no new record is given a seq below it.
        `on_sync(seconds, records, bytes)` is called after each group's sync."""
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.segment_bytes = segment_bytes
        self._on_sync = on_sync
        self._segments: list[_Segment] = []
        last = 0
        for path in segment_paths(directory):
            read = read_segment(path)
            first = int(path.stem)
            seg_last = read.records[-1].seq if read.records else first - 1
            self._segments.append(_Segment(path, first, seg_last))
            last = max(last, seg_last)
        self._next_seq = max(last + 1, checkpoint or 0, 1)
        self._lock = threading.Condition()
        self._queue: list[tuple[int, int, bytes]] = []
        self._group = Durable()
        self._closing = False
        self._fd = -1
        self._size = 0
        self._open_segment(self._next_seq)  # never after an old segment's (torn) tail
        #: why the last group could not be made durable (None: the last one was)
        self.error: str | None = None
        self.appends = 0
        self.bytes_appended = 0
        self._thread = threading.Thread(target=self._run, name="tokentrace-wal", daemon=True)
        self._thread.start()

    # ---- replay ---------------------------------------------------------------
    def records_from(self, seq: int | None) -> Iterator[WalRecord]:
        """Gives the records from `seq` on (all with None), in seq order; damaged tails
        are skipped with a warning."""
        for segment in list(self._segments[:-1]):  # the last is this run's, still empty
            if seq is not None and segment.last_seq < seq:
                continue
            read = read_segment(segment.path)
            if read.damage is not None:
                logger.warning(
                    "tokentrace: the write-ahead log segment %s ends in %s: the %d records "
                    "before it are replayed, nothing after it",
                    segment.path.name, read.damage, len(read.records),
                )  # fmt: skip
            for record in read.records:
                if seq is None or record.seq >= seq:
                    yield record

    @property
    def next_seq(self) -> int:
        return self._next_seq

    # ---- append ---------------------------------------------------------------
    def append(self, kind: int, payload: bytes) -> tuple[int, Durable]:
        """Queues a record; gives its seq and the group commit to wait on.  Call in the
        order exports enter the pipeline (its lock held): seqs follow that order."""
        with self._lock:
            if self._closing:
                raise WalError("the write-ahead log is closed")
            seq = self._next_seq
            self._next_seq = seq + 1
            self._queue.append((seq, kind, payload))
            group = self._group
            if len(self._queue) == 1:
                self._lock.notify()
        return seq, group

    def release(self, checkpoint: int | None) -> int:
        """Deletes the segments whose every record lies below `checkpoint` (the store's
        committed `wal_from`); gives how many."""
        if checkpoint is None:
            return 0
        with self._lock:
            old = [s for s in self._segments[:-1] if s.last_seq < checkpoint]
            self._segments = [s for s in self._segments if s not in old]
        for segment in old:
            with contextlib.suppress(FileNotFoundError):
                segment.path.unlink()
        return len(old)

    @property
    def segments(self) -> int:
        return len(self._segments)

    # ---- flusher thread -------------------------------------------------------
    def _open_segment(self, first_seq: int) -> None:
        path = self.directory / segment_name(first_seq)
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._size = os.fstat(self._fd).st_size
        # (an earlier run's segment of this name holds no record: it was never written)
        self._segments = [s for s in self._segments if s.path != path]
        self._segments.append(_Segment(path, first_seq, first_seq - 1))
        _sync_dir(self.directory)  # the new name survives a crash

    def _rotate(self, first_seq: int) -> None:
        os.fdatasync(self._fd)
        os.close(self._fd)
        self._fd = -1
        self._open_segment(first_seq)

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if not self._queue:
                    return
                records, self._queue = self._queue, []
                group, self._group = self._group, Durable()
            group.finish(self._commit(records))

    def _commit(self, records: list[tuple[int, int, bytes]]) -> str | None:
        """Writes and syncs one group; gives why it failed (None: durable)."""
        t0 = time.perf_counter()
        segment = self._segments[-1]
        start_size = self._size
        try:
            if self._fd < 0:  # the last failure left no segment open
                self._open_segment(records[0][0])
                segment, start_size = self._segments[-1], 0
            elif self._size >= self.segment_bytes:
                self._rotate(records[0][0])
                segment, start_size = self._segments[-1], 0
            iov: list[bytes] = []
            written = 0
            for seq, kind, payload in records:
                iov.append(record_header(seq, kind, payload))
                iov.append(payload)
                if len(iov) >= _IOV_MAX:
                    written += _writev_all(self._fd, iov)
                    iov = []
            if iov:
                written += _writev_all(self._fd, iov)
            os.fdatasync(self._fd)
        except OSError as exc:
            error = f"the write-ahead log {self.directory} cannot be written: {exc}"
            self._cut_back(start_size)
            if self.error is None:
                logger.error("tokentrace: %s; exports are answered 503 until it can", error)
            self.error = error
            return error
        self._size += written
        segment.last_seq = records[-1][0]
        self.appends += len(records)
        self.bytes_appended += written
        if self.error is not None:
            logger.warning("tokentrace: the write-ahead log is written again")
            self.error = None
        if self._on_sync is not None:
            self._on_sync(time.perf_counter() - t0, len(records), written)
        return None

    def _cut_back(self, size: int) -> None:
        """After a failed group: the segment back to its last good record, or a new
        segment where it cannot be cut (a later record must never follow a torn one)."""
        try:
            os.ftruncate(self._fd, size)
            self._size = size
        except OSError:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            try:
                self._open_segment(self._next_seq)
            except OSError:
                self._fd = -1  # the next group fails on it, and tries again

    def close(self) -> None:
        """Syncs what is queued and stops the flusher; safe to call twice."""
        with self._lock:
            if self._closing:
                return
            self._closing = True
            self._lock.notify()
        self._thread.join(30)
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1


def _writev_all(fd: int, iov: list[bytes]) -> int:
    """Writes every buffer (writev may write less than asked); gives the bytes written."""
    total = sum(len(b) for b in iov)
    done = os.writev(fd, iov)
    while done < total:  # a short write: the rest, from where it stopped
        rest = b"".join(iov)[done:]
        done += os.write(fd, rest)
    return total


def _sync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
