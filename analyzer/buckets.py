"""The four-bucket partition (docs/design.md §2), shared by every convention adapter.

All inputs are integer nanoseconds measured on one clock each; the partition
is computed in integers and only then converted to ms, so network + queue +
prefill + decode equals e2e exactly (up to float rounding of the division).
Impossible values are clamped and flagged, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokentrace.analyzer import summary as s

NS_PER_MS = 1_000_000


@dataclass(slots=True)
class Partition:
    e2e_ns: int
    server_ns: int
    network_ns: int | None
    queue_ns: int
    prefill_ns: int
    decode_ns: int
    queue_wait_ns: int
    tokenize_ns: int
    other_ns: int
    flags: list[str] = field(default_factory=list)

    def apply(self, summary: s.RequestSummary) -> None:
        """Writes the partition's ms values into `summary`."""
        summary.e2e_ms = self.e2e_ns / NS_PER_MS
        summary.server_ms = self.server_ns / NS_PER_MS
        summary.network_ms = None if self.network_ns is None else self.network_ns / NS_PER_MS
        summary.queue_ms = self.queue_ns / NS_PER_MS
        summary.prefill_ms = self.prefill_ns / NS_PER_MS
        summary.decode_ms = self.decode_ns / NS_PER_MS
        summary.queue_wait_ms = self.queue_wait_ns / NS_PER_MS
        summary.tokenize_ms = self.tokenize_ns / NS_PER_MS
        summary.other_ms = self.other_ns / NS_PER_MS
        summary.flags.extend(f for f in self.flags if f not in summary.flags)


def _clamp(value: int, low: int, high: int) -> int:
    return low if value < low else high if value > high else value


def partition(
    *,
    server_ns: int,
    prefill_ns: int,
    decode_ns: int,
    client_ns: int | None = None,
    queue_wait_ns: int = 0,
    tokenize_ns: int = 0,
) -> Partition:
    """Gives the partition of one request.

    `server_ns` is the outermost server span's duration, `client_ns` the client
    span's (None when there is none).  `prefill_ns` / `decode_ns` are the
    measured compute buckets; `queue_wait_ns` / `tokenize_ns` the measured
    sub-parts of the queue bucket.  The queue bucket is what is left.
    """
    flags: list[str] = []
    server_ns = max(0, server_ns)
    network_ns: int | None = None
    e2e_ns = server_ns
    if client_ns is not None:
        network_ns = client_ns - server_ns
        if network_ns < 0:
            # Two clocks: a client span shorter than the server span is rounding
            # or skew; the server's duration is the better bound of E.
            flags.append(s.FLAG_NEGATIVE_NETWORK)
            network_ns = 0
        e2e_ns = server_ns + network_ns
    p = _clamp(prefill_ns, 0, server_ns)
    d = _clamp(decode_ns, 0, server_ns - p)
    if p != prefill_ns or d != decode_ns:
        flags.append(s.FLAG_BUCKET_EXCEEDS_E2E)
    queue_ns = server_ns - p - d
    qw = _clamp(queue_wait_ns, 0, queue_ns)
    tk = _clamp(tokenize_ns, 0, queue_ns - qw)
    if (qw, tk) != (queue_wait_ns, tokenize_ns) and s.FLAG_BUCKET_EXCEEDS_E2E not in flags:
        flags.append(s.FLAG_BUCKET_EXCEEDS_E2E)
    return Partition(
        e2e_ns=e2e_ns,
        server_ns=server_ns,
        network_ns=network_ns,
        queue_ns=queue_ns,
        prefill_ns=p,
        decode_ns=d,
        queue_wait_ns=qw,
        tokenize_ns=tk,
        other_ns=queue_ns - qw - tk,
        flags=flags,
    )
