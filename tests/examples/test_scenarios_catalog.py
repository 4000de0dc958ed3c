"""The scenario catalog: every complaint has a scenario, and every load is a real, sized replay."""

from __future__ import annotations

import itertools

import pytest

from tokentrace.examples.scenarios import SCENARIOS, get_scenario
from tokentrace.examples.tiny_llm.config import ServerConfig

COMPLAINTS = {
    "tiny_prompts_slow",
    "bad_in_production",
    "long_wait_then_fast",
    "stutter",
    "peak_hours",
    "big_tenants_slower",
    "batch_mode_breaks_live",
    "cold_start",
}


def test_one_scenario_per_complaint_plus_a_healthy_baseline() -> None:
    assert {s.complaint for s in SCENARIOS} == COMPLAINTS | {None}
    assert get_scenario("healthy").complaint is None
    assert len({s.service for s in SCENARIOS}) == len(SCENARIOS)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_loads_are_big_enough_to_diagnose_and_fit_the_model(scenario) -> None:  # type: ignore[no-untyped-def]
    for quick in (True, False):
        specs = [spec for d in scenario.deployments for spec in d.load(quick)]
        # the analyzer needs about 30 requests in a window before it states anything
        assert len(specs) >= 32
        assert all(s.arrival_s >= 0 for s in specs)
    for deployment in scenario.deployments:
        config = ServerConfig.from_env({}, **deployment.server)  # every setting is a real field
        for spec in deployment.load(False):
            assert spec.prompt_tokens + spec.output_tokens <= config.max_seq_len


def test_unknown_scenario_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown scenario"):
        get_scenario("nope")


def test_every_tenant_of_big_tenants_has_enough_requests_to_be_compared() -> None:
    from collections import Counter

    load = get_scenario("big_tenants_slower").deployments[0].load
    for quick in (True, False):
        specs = load(quick)
        counts = Counter(s.tenant for s in specs)
        # the detector compares tenants with at least 10 requests each
        assert len(counts) == 3 and min(counts.values()) >= 10, counts
        # a server's very first request must not be a burst of long jobs (a cold start)
        first = min(specs, key=lambda s: s.arrival_s)
        assert first.tenant != "bigcorp"


def test_peak_hours_peak_is_short_and_sharp() -> None:
    specs = get_scenario("peak_hours").deployments[0].load(True)
    arrivals = sorted(s.arrival_s for s in specs)
    per_second = [sum(1 for a in arrivals if t <= a < t + 1) for t in range(int(arrivals[-1]) + 1)]
    # one busy second holds several times a calm second's arrivals
    assert max(per_second) >= 8 * sorted(per_second)[len(per_second) // 2]


def test_batch_mode_live_baseline_comes_before_the_batch_job_and_none_after_it() -> None:
    # The detector compares live requests in time slices with batch arrivals against those
    # without.  The batch job runs last, so its backlog on a slow machine (long generations
    # run out at batch 16) outlasts no live request that a slice without batch arrivals
    # would count as "without batch jobs".
    for quick in (True, False):
        specs = get_scenario("batch_mode_breaks_live").deployments[0].load(quick)
        batch = sorted(s.arrival_s for s in specs if s.traffic_class == "batch")
        live = [s.arrival_s for s in specs if s.traffic_class != "batch"]
        assert sum(a < batch[0] for a in live) >= 10  # the detector's MIN_PER_SIDE
        assert sum(a >= batch[0] for a in live) >= 10
        assert max(live) - batch[-1] < 1.0  # the last live requests share the last slice
        # between batch arrivals, never a whole 1-second slice without one
        assert max(b - a for a, b in itertools.pairwise(batch)) < 1.0
        assert min(s.output_tokens for s in specs if s.traffic_class == "batch") >= 320
