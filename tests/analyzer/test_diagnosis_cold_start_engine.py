"""cold_start from an engine's start-up trace: vLLM exports one at every start (issue 22), and
the requests that come during it or soon after are an instance's cold ones, even where the
window shows one instance and nothing marks a cold start."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from otlp_traces import to_json

from tokentrace.analyzer.report import build_report
from tokentrace.analyzer.spans import Span
from tokentrace.collector.otlp_file import read_otlp_file
from tokentrace.collector.settings import CollectorSettings
from tokentrace.file_import import import_files
from tokentrace.store.connection import open_read_only

from . import spanfactory as f

STARTUP = Path(__file__).resolve().parents[1] / "data" / "engines" / "vllm_startup.jsonl"
S = 10**9


def _startup() -> tuple[int, dict[str, Any]]:
    """Gives when the recorded start-up ended (ns) and its front end's resource."""
    spans = read_otlp_file(STARTUP)
    root = next(s for s in spans if s.name == "Overall Loading")
    return max(s.end_ns for s in spans), dict(root.resource)


def _requests(end_ns: int, resource: dict[str, Any], cold_after_s: float) -> list[Span]:
    """Gives 100 vLLM requests from 1 s after the start-up, one every 6 s; those in the first
    `cold_after_s` seconds wait 3 s in the queue (the first batches after loading)."""
    rng = random.Random(81)
    spans: list[Span] = []
    for i in range(100):
        t = end_ns + S + i * 6 * S
        queue = 3000.0 if (t - end_ns) / S < cold_after_s else rng.uniform(5, 15)
        trace, _ = f.vllm_trace(queue, rng.uniform(20, 30), rng.uniform(300, 400), t0_ns=t, resource=resource)
        spans += trace
    return spans


def _report(tmp_path: Path, cold_after_s: float, startup: bool = True) -> dict[str, Any]:
    end_ns, resource = _startup()
    requests = tmp_path / "requests.json"
    requests.write_text(json.dumps(to_json(_requests(end_ns, resource, cold_after_s))))
    db = tmp_path / "cold.duckdb"
    import_files(CollectorSettings(db=db), [STARTUP, requests] if startup else [requests])
    conn = open_read_only(db)
    try:
        return build_report(conn)
    finally:
        conn.close()


def test_requests_right_after_an_engine_start_are_cold(tmp_path: Path) -> None:
    report = _report(tmp_path, cold_after_s=25)
    assert report["coverage"]["signals"]["engine_starts"] == 1
    findings = report["findings"]
    assert findings and findings[0]["complaint"] == "cold_start", findings
    top = findings[0]
    first, start = top["evidence"][:2]
    assert first["cold_requests"] == 5 and first["after_start"] == 5 and first["instances"] == 1
    # the start-up itself, named by its phases
    assert start["text"].startswith("instance pid 5092 started up in 31.98 s (Load weights 23 ms, Load model 1.71 s, Allocate KV cache 3.33 s)")
    assert start["requests"] == 5 and start["phases"]["Allocate KV cache"] > 3000
    assert top["fix_first"].startswith("Send an instance no traffic until its engine has loaded")


def test_without_the_start_up_trace_one_instance_shows_no_cold_start(tmp_path: Path) -> None:
    report = _report(tmp_path, cold_after_s=25, startup=False)
    assert "cold_start" not in [f["complaint"] for f in report["findings"]]
    (check,) = [c for c in report["coverage"]["complaints"] if c["complaint"] == "cold_start"]
    assert not check["checkable"] and "start-up traces" in check["missing"]


def test_warm_requests_after_a_start_are_no_finding(tmp_path: Path) -> None:
    report = _report(tmp_path, cold_after_s=0)
    assert report["coverage"]["signals"]["engine_starts"] == 1
    assert report["findings"] == []
