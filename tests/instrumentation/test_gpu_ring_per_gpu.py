"""The GPU sample ring keeps `ring_size` samples per GPU (docs/sdk.md §6), and a
request's summary finds its window by bisection.

Before, one ring of 6,000 samples was shared by all GPUs: on 8 GPUs a 600 s
request's summary covered only its last 75 s, silently.  An injected fake NVML
backend, and a fake wall clock stepping 100 ms a sample round (10 Hz).
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from tokentrace.instrumentation import _gpu
from tokentrace.instrumentation import semconv as sc

GPUS = 8
STEP_NS = 100_000_000  # 10 Hz
T0 = 1_700_000_000 * 10**9
GIB = 1 << 30


class EightGpus:
    """GPU i at round r reads utilization r % 100 + i, memory (i + 1) GiB + r."""

    def __init__(self) -> None:
        self.round = 0

    def device_count(self) -> int:
        return GPUS

    def read(self, index: int) -> _gpu.GpuReading:
        r = self.round
        return _gpu.GpuReading(
            float(r % 100 + index), (index + 1) * GIB + r, 80 * GIB, 1410.0, 300.0
        )

    def close(self) -> None:
        pass


def _expected(first_round: int, last_round: int) -> dict[str, float]:
    utils = [float(r % 100 + i) for r in range(first_round, last_round + 1) for i in range(GPUS)]
    return {
        sc.GPU_UTIL_MEAN: sum(utils) / len(utils),
        sc.GPU_MEM_MAX_BYTES: GPUS * GIB + last_round,
    }


def _sampled(monkeypatch: pytest.MonkeyPatch, rounds: int, ring_size: int) -> _gpu.GpuSampler:
    backend = EightGpus()
    clock = SimpleNamespace(time_ns=lambda: T0 + backend.round * STEP_NS, monotonic=time.monotonic)
    monkeypatch.setattr(_gpu, "time", clock)
    sampler = _gpu.GpuSampler(backend, 0.1, ring_size=ring_size, export=False)
    for r in range(rounds):
        backend.round = r
        sampler.sample_once()
    return sampler


def _ts(round_: int) -> int:
    return T0 + round_ * STEP_NS


def test_each_gpu_keeps_ring_size_samples(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    ring, rounds = 100, 250
    sampler = _sampled(monkeypatch, rounds, ring)
    last = rounds - 1
    # a request over the ring's whole reach (10 s at 10 Hz) sees every GPU's 10 s
    got = sampler.summary(_ts(last - ring + 1), _ts(last))
    assert got == pytest.approx(_expected(last - ring + 1, last))
    # one older than what is kept: the ring still starts at the same sample
    assert sampler.summary(_ts(0), _ts(last)) == pytest.approx(_expected(last - ring + 1, last))


@pytest.mark.parametrize("rounds", [60, 100, 137, 300])  # not full, just full, wrapped
def test_window_edges_are_exact_however_the_ring_wrapped(monkeypatch, rounds) -> None:  # type: ignore[no-untyped-def]
    ring = 100
    sampler = _sampled(monkeypatch, rounds, ring)
    last = rounds - 1
    oldest = max(0, rounds - ring)
    for first, end in [(oldest, last), (oldest + 3, last - 7), (last, last), (oldest, oldest),
                       (max(oldest, last - 40), last - 1), (oldest + 1, oldest + 1)]:  # fmt: skip
        assert sampler.summary(_ts(first), _ts(end)) == pytest.approx(_expected(first, end))
        # a window between two samples' times holds the same samples
        inside = sampler.summary(_ts(first) - STEP_NS // 2, _ts(end) + STEP_NS // 2)
        assert inside == pytest.approx(_expected(first, end))
    assert sampler.summary(_ts(last) + 1, _ts(last) + STEP_NS) is None  # after the last
    assert sampler.summary(_ts(oldest) - STEP_NS, _ts(oldest) - 1) is None  # before the first


def test_a_wall_clock_stepped_back_keeps_the_ring_in_order(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    sampler = _sampled(monkeypatch, 20, 50)
    backend = sampler.backend
    assert isinstance(backend, EightGpus)
    monkeypatch.setattr(
        _gpu, "time", SimpleNamespace(time_ns=lambda: _ts(5), monotonic=time.monotonic)
    )
    backend.round = 20
    sampler.sample_once()  # NTP stepped the clock 1.5 s back: kept as at the newest time
    got = sampler.summary(_ts(19), _ts(19))
    assert got is not None
    utils = [float(r % 100 + i) for r in (19, 20) for i in range(GPUS)]
    assert got[sc.GPU_UTIL_MEAN] == pytest.approx(sum(utils) / len(utils))
    # and the window before it is as it was
    assert sampler.summary(_ts(0), _ts(18)) == pytest.approx(_expected(0, 18))
