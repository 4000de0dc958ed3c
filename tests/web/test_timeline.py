"""The trace page's timeline: what each drawn engine step says about itself."""

from __future__ import annotations

import pytest

from tokentrace.web._timeline import build_timeline

T0 = 1_700_000_000 * 10**9


def _step(start_ms: float, **extra: object) -> dict[str, object]:
    row: dict[str, object] = {
        "start_ns": T0 + int(start_ms * 1e6), "duration_us": 4_000, "batch_size": 3, "prefill_tokens": 0,
        "decode_seqs": 3, "queue_depth": 0, "kv_usage": None, "served": True, "gpu_us": None,
        "forward_host_us": None,
    }  # fmt: skip
    row.update(extra)
    return row


@pytest.mark.slow
def test_a_step_shows_its_forward_host_and_gpu_time_where_known() -> None:
    steps = [_step(1, forward_host_us=3_250, gpu_us=2_900), _step(6, forward_host_us=3_100), _step(11)]
    drawn = build_timeline(T0, T0 + 20_000_000, [], [], steps, [])["steps"]
    assert [(s["forward_host_ms"], s["gpu_ms"]) for s in drawn] == [(3.25, 2.9), (3.1, None), (None, None)]
