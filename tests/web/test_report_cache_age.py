"""What the pages say about the diagnosis they show and the traces it names: how old it is,
whether a newer one is computing, how many requests a finding speaks of, and why a trace it
names may be gone. A fake clock dates the reports; no wall time is asserted.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from tracegen import GeneratedRequest
from tt_testkit import serving
from web_testkit import WebServer

from tokentrace.collector.settings import CollectorSettings
from tokentrace.web import _report_cache
from tokentrace.web._report_cache import FRESH_S
from tokentrace.web.app import create_web_app


class FakeClock:
    """Monotonic seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _text(page: str, element_id: str) -> str:
    found = re.search(f'id="{element_id}"[^>]*>(.*?)</p>', page, re.S)
    assert found is not None, element_id
    return re.sub(r"<[^>]+>", "", found.group(1))


@pytest.mark.slow
def test_the_pages_say_how_old_the_diagnosis_is_and_that_a_newer_one_is_computing(
    generated: tuple[Path, list[GeneratedRequest]],
) -> None:
    clock = FakeClock()
    with serving(create_web_app(CollectorSettings(db=generated[0]), clock=clock)) as url:
        fresh = httpx.get(url + "/api/diagnosis", timeout=120).json()
        assert fresh["report_age_s"] == 0 and fresh["report_refreshing"] is False
        assert _text(httpx.get(url + "/diagnosis", timeout=60).text, "report-age").startswith(
            "Diagnosis computed just now (it took "
        )
        # past FRESH_S the cached report is served while a newer one is computed: the pages say so
        clock.now += FRESH_S + 27
        for path in ("/diagnosis", "/"):
            said = _text(httpx.get(url + path, timeout=60).text, "report-age")
            assert said.startswith(f"Diagnosis computed {int(FRESH_S) + 27} s ago (it took "), (path, said)
            assert "refreshing: a newer one is being computed, reload in a moment." in said, (path, said)
        overview = httpx.get(url + "/api/overview", timeout=60).json()
        if overview["report_refreshing"]:  # the old one, still served while the newer computes
            assert overview["report_age_s"] >= FRESH_S + 27
        else:  # the newer one finished meanwhile (its compute is quicker than two pages): fresh
            assert overview["report_age_s"] == 0


@pytest.fixture
def capped(
    generated: tuple[Path, list[GeneratedRequest]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """Serves reports whose `stutter` finding names three traces of 2,500 affected requests, as
    the analyzer's `affected_count` says of a finding capped at MAX_AFFECTED; gives the URL."""
    real = _report_cache.build_report
    ids = [r.trace_id for r in generated[1][:3]]

    def capped_report(cur: Any, filters: Any) -> Any:
        report = real(cur, filters)
        others = [f for f in report["findings"] if f["complaint"] != "stutter"]
        stutter = {
            "complaint": "stutter", "title": "It starts responding, then freezes or stutters", "confidence": 0.9,
            "evidence": [], "example_traces": ids[:1], "fix_first": "", "affected_trace_ids": ids,
            "affected_count": 2_500,
        }  # fmt: skip
        return {**report, "findings": [stutter, *others]}

    monkeypatch.setattr(_report_cache, "build_report", capped_report)
    db = tmp_path / "web.duckdb"
    shutil.copy(generated[0], db)
    with serving(create_web_app(CollectorSettings(db=db))) as url:
        yield url


@pytest.mark.slow
def test_all_affected_requests_says_when_it_is_the_first_thousand(capped: str) -> None:
    data = httpx.get(capped + "/api/search", params={"complaint": "stutter"}, timeout=120).json()
    assert data["total"] == 3
    assert data["note"] == "These are the first 3 of 2,500 affected requests (a finding lists at most 1,000)."
    page = httpx.get(capped + "/search", params={"complaint": "stutter"}, timeout=60).text
    assert "These are the first 3 of 2,500 affected requests" in page
    for path in ("/diagnosis", "/"):
        link = re.search(r'<a class="affected-link" href="[^"]*complaint=stutter[^"]*">([^<]*)</a>',
                         httpx.get(capped + path, timeout=60).text)  # fmt: skip
        assert link is not None and link.group(1) == "the first 3 of 2,500 affected requests →", path


def test_a_finding_of_fewer_requests_says_nothing_more(web: WebServer) -> None:
    findings = httpx.get(web.url + "/api/diagnosis", timeout=120).json()["report"]["findings"]
    for f in findings:
        assert f.get("affected_count", 0) <= len(f["affected_trace_ids"])  # the test data is small
        data = httpx.get(web.url + "/api/search", params={"complaint": f["complaint"]}, timeout=60).json()
        assert data["note"] is None
    page = httpx.get(web.url + "/diagnosis", timeout=60).text
    assert page.count(">all affected requests →</a>") == len(findings)


@pytest.mark.slow
def test_a_missing_trace_may_have_been_deleted_by_retention(generated: tuple[Path, list[GeneratedRequest]]) -> None:
    unknown = "ab" * 16
    with serving(create_web_app(CollectorSettings(db=generated[0], retention="7d"))) as url:
        for path in (f"/api/trace/{unknown}", f"/api/trace/{unknown}/otlp.json", f"/api/trace/{unknown}/chrome.json"):
            r = httpx.get(url + path, timeout=60)
            assert r.status_code == 404
            assert r.json()["error"] == (
                f"no request or span with trace id {unknown}; this server deletes data older than 7d "
                "(--retention 7d), so the trace may have been deleted since a page (or a diagnosis "
                "computed earlier) named it"
            ), path
        page = httpx.get(f"{url}/trace/{unknown}", timeout=60)
        assert page.status_code == 404 and "--retention 7d" in page.text
        # a malformed id is no trace that could have been deleted
        assert "retention" not in httpx.get(url + "/api/trace/xyz", timeout=60).json()["error"]
    # without retention nothing is deleted: the 404 says only that there is no such trace
    with serving(create_web_app(CollectorSettings(db=generated[0]))) as url:
        r = httpx.get(f"{url}/api/trace/{unknown}", timeout=60)
        assert r.json()["error"] == f"no request or span with trace id {unknown}"


def test_the_exports_tell_a_sampled_out_trace_from_one_that_does_not_exist(web: WebServer) -> None:
    with duckdb.connect(str(web.db), read_only=True) as conn:
        row = conn.execute(
            "SELECT trace_id FROM requests WHERE trace_id NOT IN (SELECT trace_id FROM spans) LIMIT 1"
        ).fetchone()
    assert row is not None, "the generated data samples some traces out"
    sampled_out, unknown = row[0], "cd" * 16
    for export in ("otlp.json", "chrome.json"):
        r = httpx.get(f"{web.url}/api/trace/{sampled_out}/{export}", timeout=60)
        assert r.status_code == 404 and "its spans were sampled out" in r.json()["error"], export
        r = httpx.get(f"{web.url}/api/trace/{unknown}/{export}", timeout=60)
        assert r.status_code == 404, export
        assert r.json()["error"] == f"no request or span with trace id {unknown}", export
