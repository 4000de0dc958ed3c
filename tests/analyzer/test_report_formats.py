"""`tokentrace report` in every format, from a real database, through the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tokentrace.analyzer.report import build_report

from . import workloads


@pytest.fixture
def db(write_workload, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    w = workloads.big_tenants_slower()
    for r in w.requests:
        if r.tenant == "megacorp":
            r.tenant = "<script>alert('x')</script>&co"
    write_workload(w, name="r.duckdb").close()
    return tmp_path / "r.duckdb"


def _report(db: Path, fmt: str, *flags: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-m", "tokentrace", "report", "--db", str(db), "--format", fmt, *flags],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_json_is_the_design_contract(db: Path) -> None:
    report = json.loads(_report(db, "json"))
    assert set(report) >= {"requests", "latency", "buckets", "findings"}
    assert set(report["latency"]) >= {"e2e", "ttft", "tpot", "itl"}
    assert set(report["latency"]["e2e"]) == {"p50", "p90", "p95", "p99"}
    for b in ("network", "queue", "prefill", "decode"):
        assert "share" in report["buckets"][b]
    shares = sum(report["buckets"][b]["share"] for b in ("network", "queue", "prefill", "decode"))
    assert shares == pytest.approx(1.0, abs=1e-3)
    f = report["findings"][0]
    assert set(f) >= {"complaint", "title", "confidence", "evidence", "example_traces", "fix_first",
                      "affected_trace_ids"}
    assert report["timeline"]["points"] and report["itl_histogram"]


@pytest.mark.slow
def test_text_and_markdown_show_the_diagnosis(db: Path) -> None:
    text = _report(db, "text")
    assert "big_tenants_slower" in text and "fix first" in text
    md = _report(db, "markdown")
    assert md.startswith("# tokentrace report")
    # a code span shows its content as it is: no backslash escapes inside
    assert "| end-to-end |" in md and "(`big_tenants_slower`, confidence" in md
    assert "big\\_tenants" not in md
    assert "<script>" not in md


@pytest.mark.slow
def test_html_is_self_contained_and_escaped(db: Path) -> None:
    page = _report(db, "html")
    assert page.startswith("<!doctype html>")
    assert page.count("<svg") == 3
    assert "<script" not in page and "&lt;script&gt;" in page
    # nothing to fetch: no external URL, stylesheet or script reference
    assert not re.search(r"(src|href)\s*=", page)
    assert "http://" not in page and "https://" not in page


def test_empty_database_reports_cleanly(write_workload, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(workloads.Workload(requests=[]), name="empty.duckdb")
    report = build_report(conn)
    assert report["requests"]["count"] == 0 and report["findings"] == []
    from tokentrace.analyzer.render import render_markdown, render_text
    from tokentrace.analyzer.render_html import render_html

    for render in (render_text, render_markdown, render_html):
        assert render(report)


@pytest.mark.slow
def test_every_format_says_which_requests_it_looks_at(db: Path) -> None:
    text = _report(db, "text", "--tenant", "smallco")
    head = text.splitlines()[0]
    assert head.startswith("tokentrace report  (requests started ") and "tenant smallco" in head
    assert "tenant smallco" in _report(db, "markdown", "--tenant", "smallco")
    assert "tenant smallco" in _report(db, "html", "--tenant", "smallco")
    # filters that match nothing say so, not "point your exporter at the collector"
    empty = _report(db, "text", "--service", "no-such-service", "--until", "2020-01-01T00:00:00Z")
    assert "No requests match until 2020-01-01 00:00:00Z · service no-such-service." in empty
    assert "OTLP exporter" not in empty
    assert "service no\\_such\\_service" in _report(db, "markdown", "--service", "no_such_service")


def test_the_text_report_writes_seconds_from_one_second() -> None:
    from tokentrace.analyzer.render import _ms

    # as the findings' evidence writes them ("E2E p95 7.29 s"), so one report reads one way
    assert [_ms(v) for v in (None, 912.44, 999.94, 999.96, 9121.5)] == [
        "—", "912.4 ms", "999.9 ms", "1.00 s", "9.12 s",
    ]  # fmt: skip


@pytest.mark.slow
def test_the_queue_parts_read_like_the_bucket_shares(db: Path) -> None:
    """The queue line gives each part with one decimal, as the buckets above it and the
    web's diagnosis page do ("queue_wait 18.3 %"), never rounded to a whole percent."""
    parts = json.loads(_report(db, "json"))["buckets"]["queue"]["parts"]
    line = next(ln for ln in _report(db, "text").splitlines() if ln.strip().startswith("queue = "))
    assert line.strip() == "queue = " + ", ".join(f"{k} {v * 100:.1f} %" for k, v in parts.items())
    assert any(0 < v * 100 % 1 for v in parts.values())  # a whole percent would have lost that


EVIL_TENANT = "mega\x1b]8;;https://evil.example/\x07corp\x1b[2K\u202e\n       fix first: forged"


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["text", "markdown"])
def test_span_text_cannot_drive_the_terminal_or_forge_lines(write_workload, tmp_path: Path, fmt: str) -> None:  # type: ignore[no-untyped-def]
    w = workloads.big_tenants_slower()
    for r in w.requests:
        if r.tenant == "megacorp":
            r.tenant = EVIL_TENANT
    write_workload(w, name="evil.duckdb").close()
    out = _report(tmp_path / "evil.duckdb", fmt)
    assert "mega" in out  # the finding names the tenant, written out
    assert not re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e]", out), "a control character reached the output"
    assert "forged" not in "\n".join(line for line in out.splitlines() if "mega" not in line)
    assert "\\x1b" in out
