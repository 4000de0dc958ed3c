"""`long_wait_then_fast` says the first token's wait is prefill: only requests whose
server was seen measure that.

A client-only trace (OTel GenAI / OpenLLMetry / OpenInference client spans, no server
span: flagged `server_unseen`) cannot split its wait between network, queue and
prefill, so all of it reads as prefill.  The detector used to report "100 % of it
prefill" for such streams, where the wait may as well be a cross-region hop or a queue.
"""

from __future__ import annotations

import random

from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.summary import FLAG_SERVER_UNSEEN, RequestSummary

from .spanfactory import MS, genai_client_trace, sdk_trace
from .workloads import Workload


def _requests(make, n: int = 60) -> list[RequestSummary]:  # type: ignore[no-untyped-def]
    rng = random.Random(5)
    out = []
    for i in range(n):
        spans, _ = make(rng, 1_700_000_000 * 10**9 + round(i * 3000 * MS))
        (r,) = summarize_trace(spans).requests
        out.append(r)
    return out


def _client_only(rng: random.Random, t0: int):  # type: ignore[no-untyped-def]
    # 800 ms to the first chunk, then 20 ms a token: a long wait, then fast
    return genai_client_trace(800.0 + rng.uniform(-50, 50), 20.0, 60, style="openllmetry", t0_ns=t0)


def _server_seen(rng: random.Random, t0: int):  # type: ignore[no-untyped-def]
    return sdk_trace(1.0, 5.0, 800.0 + rng.uniform(-50, 50), 20.0, 60, t0_ns=t0)


def test_client_only_streams_claim_no_prefill(write_workload) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(_client_only)
    assert all(FLAG_SERVER_UNSEEN in r.flags for r in requests)
    assert all(r.prefill_ms > 700 for r in requests)  # the unsplit wait, read as prefill
    report = build_report(write_workload(Workload(requests)))
    assert "long_wait_then_fast" not in [f["complaint"] for f in report["findings"]], report["findings"]


def test_the_same_wait_measured_at_the_server_is_found(write_workload) -> None:  # type: ignore[no-untyped-def]
    requests = _requests(_server_seen)
    assert not any(FLAG_SERVER_UNSEEN in r.flags for r in requests)
    findings = build_report(write_workload(Workload(requests)))["findings"]
    assert [f["complaint"] for f in findings][:1] == ["long_wait_then_fast"], findings


def test_mixed_traffic_is_judged_on_the_measured_requests(write_workload) -> None:  # type: ignore[no-untyped-def]
    seen = _requests(_server_seen, 30)
    unseen = _requests(_client_only, 30)
    finding = next(
        f for f in build_report(write_workload(Workload(seen + unseen)))["findings"]
        if f["complaint"] == "long_wait_then_fast"
    )
    assert finding["evidence"][0]["requests"] == len(seen)
    assert set(finding["affected_trace_ids"]) <= {r.trace_id for r in seen}
