from __future__ import annotations

import pytest

from tokentrace.examples.load.workloads import (
    AZURE_CODE,
    AZURE_CONV,
    MOONCAKE_CONVERSATION,
    TRACE_FILES,
    Scaling,
    TraceRecord,
    assign_tenants,
    assign_traffic_class,
    available_traces,
    load_trace,
    load_workload,
    scale_records,
    with_bursts,
    with_peak_window,
    with_poisson_arrivals,
)


@pytest.mark.parametrize("name", [AZURE_CONV, AZURE_CODE, MOONCAKE_CONVERSATION])
def test_shipped_traces_load_with_their_licenses(name: str) -> None:
    records = load_trace(name)
    assert len(records) >= 1000
    arrivals = [r.arrival_s for r in records]
    assert arrivals[0] == 0.0 and arrivals == sorted(arrivals)
    assert all(r.prompt_tokens > 0 and r.output_tokens >= 0 for r in records)
    folder = TRACE_FILES[name].parent
    assert any(p.name.startswith("LICENSE") for p in folder.iterdir())
    assert (folder.parent / "README.md").is_file()


def test_azure_timestamps_keep_sub_millisecond_order() -> None:
    records = load_trace(AZURE_CONV, limit=2)
    assert records[1].arrival_s == pytest.approx(50.9951690 - 46.6805900, abs=1e-6)


def test_scaling_compresses_time_and_clamps_tokens() -> None:
    records = [
        TraceRecord(0.0, 1000, 200),
        TraceRecord(10.0, 50, 1),
        TraceRecord(20.0, 90_000, 5000),
    ]
    scaling = Scaling(
        time_compression=10, prompt_scale=0.1, output_scale=0.5, max_prompt_tokens=400
    )
    specs = scale_records(records, scaling, source="t")
    assert [s.arrival_s for s in specs] == [0.0, 1.0, 2.0]
    assert [s.prompt_tokens for s in specs] == [100, 8, 400]
    assert [s.output_tokens for s in specs] == [100, 2, 128]
    late = scale_records(records, scaling, start_s=5.0)
    assert [s.arrival_s for s in late] == [0.5, 1.5] and late[0].index == 1


def test_load_workload_window_and_defaults() -> None:
    specs = load_workload(AZURE_CONV, scaling=Scaling(time_compression=20), duration_s=5.0)
    assert specs and all(s.arrival_s <= 5.0 for s in specs)
    assert all(8 <= s.prompt_tokens <= 400 for s in specs)
    mooncake = load_workload(MOONCAKE_CONVERSATION, limit=200)
    assert len({s.prompt_tokens for s in mooncake}) > 10  # the long/short mix survives scaling
    with pytest.raises(ValueError):
        load_trace("nope")
    assert available_traces() == sorted(TRACE_FILES)


def test_arrival_patterns() -> None:
    specs = load_workload(AZURE_CODE, limit=400)
    poisson = with_poisson_arrivals(specs, rate_per_s=10, seed=1)
    assert poisson[-1].arrival_s == pytest.approx(40, rel=0.25)
    assert [s.prompt_tokens for s in poisson] == [s.prompt_tokens for s in specs]
    bursts = with_bursts(specs[:9], burst_size=3, interval_s=2.0)
    assert [s.arrival_s for s in bursts] == [0, 0, 0, 2, 2, 2, 4, 4, 4]
    peak = with_peak_window(
        specs, base_rate_per_s=5, peak_rate_per_s=50, peak_start_s=10, peak_duration_s=2, seed=2
    )
    in_peak = sum(10 <= s.arrival_s < 12 for s in peak)
    before = sum(6 <= s.arrival_s < 8 for s in peak)
    assert in_peak > 3 * before


def test_tenants_and_traffic_classes() -> None:
    specs = load_workload(AZURE_CONV, limit=300)
    tenants = assign_tenants(specs, {"acme": 0.8, "tiny-co": 0.2}, seed=3)
    assert tenants == assign_tenants(specs, {"acme": 0.8, "tiny-co": 0.2}, seed=3)
    share = sum(s.tenant == "acme" for s in tenants) / len(tenants)
    assert 0.7 < share < 0.9
    classed = assign_traffic_class(tenants, batch_tenants=["acme"])
    assert all((s.traffic_class == "batch") == (s.tenant == "acme") for s in classed)
    with pytest.raises(ValueError):
        assign_traffic_class(specs, batch_fraction=2.0)
