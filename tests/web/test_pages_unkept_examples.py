"""A finding whose requests' span trees were all sampled out says so on the pages, as the
reports do, instead of showing no example at all."""

from __future__ import annotations

from pathlib import Path

import jinja2

from tokentrace.web import _format

TEMPLATES = Path(_format.__file__).parent / "templates"


def _render(finding: dict[str, object]) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True)
    _format.install(env)
    return env.get_template("_findings.html").render(
        findings=[finding], filters={}, detail=True, services=1, count=100
    )


def _finding(examples: list[str] | None) -> dict[str, object]:
    f: dict[str, object] = {
        "complaint": "big_tenants_slower", "title": "Big customers feel slower than small ones",
        "confidence": 0.7, "evidence": [{"text": "the heaviest tenant waits longer"}],
        "fix_first": "Isolate tenants.",
    }  # fmt: skip
    if examples is not None:
        f["example_traces"] = examples
    return f


def test_no_kept_trace_is_said_as_the_reports_say_it() -> None:
    html = _render(_finding([]))
    assert "example traces: none kept (the spans of these requests were sampled out" in html
    assert "--keep-rules" in html and "all affected requests" in html


def test_kept_traces_are_linked_and_an_old_report_says_nothing() -> None:
    assert 'href="/trace/abc123"' in _render(_finding(["abc123"]))
    assert "none kept" not in _render(_finding(["abc123"]))
    assert "none kept" not in _render(_finding(None))  # an older server's report: no list
