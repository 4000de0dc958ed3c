"""big_tenants_slower where both tenant groups queue alike: one FIFO engine, a heavy tenant's
bursts fill the queue everyone waits in (real vLLM, issue 22: small tenants' TTFT 4.1 s beside
a big tenant's burst against 36 ms without one, and no finding, since the queue by tenant
group did not differ).  The lighter tenants' own contrast decides: their wait beside the
heavy tenant's requests against without them."""

from __future__ import annotations

import random

from tokentrace.analyzer.report import build_report

from .workloads import T0_NS, Req, S, Server, Workload, lognormal, serve, summarize


def bursts_into_one_queue(seed: int = 91, heavy_instance: str = "i0") -> Workload:
    """Gives ten minutes of two small tenants' chats (one a second) and a big tenant's burst of
    24 long prompts every two minutes, all served first come first served on `i0`'s 4 slots
    (the big tenant's on `heavy_instance`)."""
    rng = random.Random(seed)
    light = []
    for i in range(600):
        r = Req(T0_NS + int((i + rng.uniform(0, 1)) * S), lognormal(rng, 80, 0.4), 30)
        r.tenant = rng.choice(["smallco", "tinyinc"])
        light.append(r)
    heavy = []
    for start in range(30, 600, 120):
        for _ in range(24):
            r = Req(T0_NS + int((start + rng.uniform(0, 1)) * S), lognormal(rng, 3000, 0.2), 200)
            r.tenant, r.instance = "bigcorp", heavy_instance
            heavy.append(r)
    reqs = light + heavy
    serve(rng, reqs, Server(slots=4, prefill_ms_per_token=0.1, tpot_ms=10.0))
    return Workload(summarize(rng, reqs), raw=reqs)


def test_light_tenants_waiting_behind_a_heavy_ones_bursts(write_workload) -> None:  # type: ignore[no-untyped-def]
    findings = build_report(write_workload(bursts_into_one_queue()))["findings"]
    assert findings and findings[0]["complaint"] == "big_tenants_slower", [
        (f["complaint"], f["confidence"]) for f in findings
    ]
    first = findings[0]["evidence"][0]
    assert first["text"].startswith("the lighter tenants (smallco, tinyinc) wait "), first
    assert "when bigcorp has requests in flight on their instance" in first["text"]
    assert first["ratio"] >= 3 and first["requests"] >= 5 and first["baseline_requests"] >= 5


def test_a_heavy_tenant_on_another_instance_blocks_nobody(write_workload) -> None:  # type: ignore[no-untyped-def]
    # its bursts queue on their own replica: the small tenants' waits do not change with them
    # (the big tenant's own requests wait, which the queue by tenant group says)
    findings = build_report(write_workload(bursts_into_one_queue(heavy_instance="i1")))["findings"]
    said = [e["text"] for f in findings if f["complaint"] == "big_tenants_slower" for e in f["evidence"]]
    assert not any("the lighter tenants" in text for text in said), said
