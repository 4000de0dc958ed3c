"""`tokentrace report --url URL --format html`: the example traces link to their pages on
the explorer the report came from (a report from a file has no explorer: plain ids)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from tokentrace.analyzer import report_cli
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.render_html import _examples


def _report(examples: list[str]) -> dict[str, Any]:
    return {
        "window": {"start_ns": None, "end_ns": None, "filters": {}},
        "requests": {"count": 0, "kept_traces": 0, "errors": 0},
        "findings": [{
            "complaint": "stutter", "title": "It stutters", "confidence": 0.8,
            "evidence": [], "fix_first": "Chunk prefill.", "example_traces": examples,
        }],
    }  # fmt: skip


def test_examples_link_to_the_explorer_and_ids_stay_escaped() -> None:
    hostile = '"><script>alert(1)</script>'
    html = _examples(_report(["abc123", hostile])["findings"][0], "http://127.0.0.1:8600/")
    assert '<a href="http://127.0.0.1:8600/trace/abc123"><code>abc123</code></a>' in html
    assert "<script>" not in html and "%3Cscript%3E" in html  # escaped in the text, quoted in the link
    plain = _examples(_report(["abc123"])["findings"][0])
    assert "<a " not in plain and "<code>abc123</code>" in plain


def test_report_by_url_passes_the_explorer(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: dict[str, Any] = {}

    def fake_render(report: dict[str, Any], explorer: str | None = None) -> str:
        seen["explorer"] = explorer
        return "ok"

    monkeypatch.setattr(report_cli, "fetch_report", lambda url, filters, token: _report(["t1"]))
    monkeypatch.setattr(report_cli, "render_html", fake_render)
    monkeypatch.setitem(report_cli.RENDERERS, "html", fake_render)
    out = tmp_path / "r.html"
    args = argparse.Namespace(format="html", url="http://127.0.0.1:8600", token=None, output=out, db=None)
    assert report_cli.run_report(args, Filters()) == 0
    assert seen["explorer"] == "http://127.0.0.1:8600" and out.read_text() == "ok"
