"""The report's words as a newcomer reads them (a review of the report's wording).

- Figures counted on a subset (live traffic beside batch jobs, the requests with a first
  token) say so in their sentence: the tables above them are of the whole window.
- A server saturated throughout gets a title of its own: "at peak hours" contradicted its
  evidence ("not only in its busiest slices").  The complaint id stays `peak_hours`.
- "prefill" one way; a large prefill's bar says where it comes from (the data).
- tiny_prompts_slow's advice follows the measured split: nothing said twice, no "cap queue
  depth" for 2 ms of queue.
- Slices are counted apart from their length: "12 slices (1 s each)", not "12 1-second slices".
- A finding whose traces were all sampled out says so, in every format.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import duckdb
import jinja2
import pytest

from tokentrace.analyzer.diagnosis import TITLES, big_tenants, long_wait, peak_hours, stutter
from tokentrace.analyzer.diagnosis._base import FIX_FIRST, Context
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.render import render_json, render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.web import _format

from . import workloads
from .test_diagnosis_load_backlog import _fifo
from .workloads import Req, S, Server, Workload, serve, summarize

RENDERERS = (render_text, render_markdown, render_html)


def _with_batch_jobs(w: Workload, seed: int = 40, per_s: float = 0.5) -> Workload:
    """Adds batch requests that never wait (their own engine) over the workload's time: the
    window's queue share drops, live traffic's does not."""
    rng = random.Random(seed)
    t0, t1 = min(r.start_ns for r in w.requests), max(r.start_ns for r in w.requests)
    batch = [
        Req(t0 + int(i / per_s * S), 300, 400, tenant="nightly-eval", traffic_class="batch", network_ms=5.0)
        for i in range(int((t1 - t0) / S * per_s))
    ]
    serve(rng, batch, Server(slots=64))
    return Workload(w.requests + summarize(rng, batch), engine_steps=w.engine_steps, raw=w.raw + batch)


def _texts(finding: Any) -> list[str]:
    return [e["text"] for e in finding.evidence]


# --- 1. figures of a subset say whose they are ----------------------------------------------------


def test_saturation_counted_on_live_traffic_says_so_in_every_sentence(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(_with_batch_jobs(workloads.steady_overload()))
    window_share = build_report(conn)["buckets"]["queue"]["share"]
    f = peak_hours.detect(Context(conn, Filters()))
    assert f is not None and f.basis == "saturated"
    first, little, trend = _texts(f)
    # the live requests' share is not the window's (the tables'): the sentence says whose it is
    assert f.evidence[0]["queue_share"] > window_share + 0.1
    assert first.startswith("interactive requests: queue wait is "), first
    assert "of their E2E" in first
    assert little.startswith("on average ") and " interactive requests wait in the queue" in little
    assert "their queue wait p50" in little and "their E2E p95" in little
    assert trend.startswith("interactive requests' queue wait p50 "), trend
    assert "interactive requests wait while" in f.fix_lead  # type: ignore[operator]


@pytest.mark.slow
def test_a_peak_counted_on_live_arrivals_says_so(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(_with_batch_jobs(workloads.peak_hours(), per_s=1.0))
    f = peak_hours.detect(Context(conn, Filters()))
    assert f is not None and f.basis == "contrast"
    slices, arrivals = _texts(f)
    assert "busiest 10 % of 20-second slices by interactive arrivals" in slices
    assert re.search(r"× the interactive arrivals \([\d.,]+ vs [\d.,]+ interactive requests per slice\)", arrivals)
    assert "the usual interactive arrivals" in f.fix_lead  # type: ignore[operator]
    # one class only: the figures are the window's, and no class is named
    alone = peak_hours.detect(Context(write_workload(workloads.peak_hours(), name="alone.duckdb"), Filters()))
    assert alone is not None and not any("interactive" in t for t in _texts(alone))


@pytest.mark.slow
def test_tenants_compared_on_live_traffic_say_so(write_workload) -> None:  # type: ignore[no-untyped-def]
    conn = write_workload(_with_batch_jobs(workloads.big_tenants_slower()))
    f = big_tenants.detect(Context(conn, Filters()))
    assert f is not None
    queue, volume, *_ = _texts(f)
    assert queue.startswith("interactive requests: the heaviest tenant (megacorp) waits longer"), queue
    assert "of the interactive tokens across" in volume, volume


@pytest.mark.slow
def test_long_wait_figures_of_some_requests_say_which(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.long_wait_then_fast()
    for s in w.requests[::4]:  # no first token: a non-streaming answer
        s.ttft_ms = s.ttft_client_ms = None
    conn = write_workload(w)
    f = long_wait.detect(Context(conn, Filters()))
    assert f is not None
    n, count = f.evidence[0]["requests"], len(w.requests)
    assert n < count
    first = f.evidence[0]["text"]
    assert first.startswith(f"{n} of {count} requests (those with a first token the server saw): TTFT p50 "), first
    assert "of their E2E time" in first
    # all of them: the window's figures, said as before
    whole = long_wait.detect(Context(write_workload(workloads.long_wait_then_fast(), name="whole.duckdb"), Filters()))
    assert whole is not None and whole.evidence[0]["text"].startswith("TTFT p50 ")


# --- 2. a saturated server's title ----------------------------------------------------------------


def _findings_html(findings: list[dict[str, Any]]) -> str:
    templates = Path(_format.__file__).parent / "templates"
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates)), autoescape=True)
    _format.install(env)
    return env.get_template("_findings.html").render(
        filters={}, detail=True, services=1, findings=findings, count=500
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("workload", "shape"),
    [(workloads.steady_overload, "all"), (lambda: _fifo(19), "most"), (lambda: _fifo(20), "bursts")],
    ids=["all-the-time", "most-of-the-time", "bursts"],
)
def test_a_saturated_server_is_not_said_to_explode_at_peak_hours(write_workload, workload, shape: str) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(workload()))
    top = report["findings"][0]
    assert top["complaint"] == "peak_hours"  # the id other tools rely on stays
    assert top["title"] == peak_hours.SATURATED_TITLES[shape] != TITLES["peak_hours"]
    # every format, and the explorer's findings, show the finding's own title
    for render in RENDERERS:
        out = render(report).replace("&#x27;", "'")
        assert top["title"] in out and TITLES["peak_hours"] not in out, render.__name__
    assert json.loads(render_json(report))["findings"][0]["title"] == top["title"]
    assert top["title"] in _findings_html(report["findings"])
    # the explorer's list of what is checked names the complaint, not this case
    assert ("peak_hours", TITLES["peak_hours"]) in _format.CHECKS


@pytest.mark.slow
def test_a_peak_keeps_the_peak_hours_title(write_workload) -> None:  # type: ignore[no-untyped-def]
    top = build_report(write_workload(workloads.peak_hours()))["findings"][0]
    assert top["complaint"] == "peak_hours" and top["title"] == TITLES["peak_hours"]


# --- 5, 6. prefill, and where a large prefill's bar comes from --------------------------------------


def test_prefill_is_spelled_one_way(write_workload) -> None:  # type: ignore[no-untyped-def]
    report = build_report(write_workload(workloads.long_wait_then_fast()))
    assert report["findings"][0]["complaint"] == "long_wait_then_fast"
    said = json.dumps([report["findings"], FIX_FIRST, TITLES], ensure_ascii=False)
    assert "prefill" in said and "pre-fill" not in said


@pytest.mark.parametrize(
    ("p90", "largest", "bar", "basis"),
    [(500, 2000, 500, "p90"), (2000, 2400, 1200, "half_max"), (100, 150, 256, "floor"),
     (2000, 3000, 1500, "half_max"), (0, 0, 256, "floor"), (900, 400, 256, "floor")],
)  # fmt: skip
def test_a_large_prefill_bar_comes_from_the_window(p90: int, largest: int, bar: int, basis: str) -> None:
    assert stutter.large_prefill(p90, largest) == (bar, basis)


@pytest.mark.slow
def test_stutter_says_a_large_prefill_is_summed_over_the_step_and_taken_from_the_data(write_workload) -> None:  # type: ignore[no-untyped-def]
    f = {x["complaint"]: x for x in build_report(write_workload(workloads.stutter()))["findings"]}["stutter"]
    linked = f["evidence"][1]
    large, basis = linked["large_prefill_tokens"], linked["large_prefill_basis"]
    assert (
        f"while their engine ran a step that prefilled ≥ {large} tokens (summed over the step's requests; "
        f"{stutter.LARGE_PREFILL_BASIS[basis]})" in linked["text"]
    ), linked["text"]


# --- 7. tiny prompts: advice the measured split supports, said once ---------------------------------


@pytest.mark.slow
def test_tiny_prompts_advice_follows_the_split(write_workload) -> None:  # type: ignore[no-untyped-def]
    def advice(w: Workload, name: str) -> tuple[str, dict[str, Any]]:
        found = {f["complaint"]: f for f in build_report(write_workload(w, name=name))["findings"]}
        f = found["tiny_prompts_slow"]
        return f["fix_first"], f["evidence"][1]

    # far-away users, a queue of a few percent of the wait: the region once, no queue advice
    fix, split = advice(workloads.tiny_prompts_slow(), "far.duckdb")
    assert split["where"] == "network"
    assert split["overhead_bound_queue_mean_ms"] < 0.2 * split["overhead_bound_wait_mean_ms"]
    assert fix.startswith("Network is ") and "Then:" not in fix, fix
    assert "cap queue depth" not in fix and "serving region" not in fix
    # a slow gateway, measured as tokenize: the tokenizer's advice, neither region advice (users
    # are near) nor "cap queue depth" (nobody waits for the scheduler)
    fix, split = advice(workloads.slow_gateway(), "gateway.duckdb")
    assert split["where"] == "queue" and fix.startswith("Tokenization is ") and "Then:" not in fix, fix
    assert "region" not in fix and "cap queue depth" not in fix
    # both real: the lead for the larger (the queue's tokenize), the region advice for the network
    fix, split = advice(workloads.tiny_prompts_mixed_overhead(), "mixed.duckdb")
    assert fix.startswith("Tokenization is "), fix
    assert fix.endswith(". Then: check the serving region against your users, kill cross-region hops."), fix


# --- 8. slices counted apart from their length ------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "n", "said"),
    [(1, 12, "12 slices (1 s each)"), (5, 49, "49 slices (5 s each; median slice 75 %)"),
     (60, 45, "45 minutes (median slice 75 %)"), (60, 1, "1 minute"), (120, 1, "1 slice (2 min)")],
)  # fmt: skip
def test_slices_are_counted_apart_from_their_length(seconds: int, n: int, said: str) -> None:
    ctx = Context(duckdb.connect(), Filters())
    ctx.__dict__["slice_ns"] = seconds * 10**9  # the cached property, as a window of that length sets it
    also = "median slice 75 %" if "median" in said else ""
    assert ctx.slices_counted(n, also) == said


@pytest.mark.slow
def test_saturation_counts_its_slices_apart_from_their_length(write_workload) -> None:  # type: ignore[no-untyped-def]
    first = build_report(write_workload(workloads.steady_overload()))["findings"][0]["evidence"][0]
    assert f"every one of the window's {first['slices']} slices (10 s each; median slice " in first["text"]
    assert not re.search(r"\d+ \d+-second slices", first["text"])


# --- 9. no example trace kept -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_finding_without_kept_traces_says_so_in_every_format(write_workload) -> None:  # type: ignore[no-untyped-def]
    w = workloads.peak_hours()
    for s in w.requests:
        s.kept, s.sample_reason = False, "dropped"
    report = build_report(write_workload(w))
    assert report["findings"] and report["requests"]["kept_traces"] == 0
    f = report["findings"][0]
    assert f["example_traces"] == [] and f["affected_trace_ids"]  # the JSON holds it as an empty list
    assert json.loads(render_json(report))["findings"][0]["example_traces"] == []
    text, md, page = render_text(report), render_markdown(report), render_html(report)
    assert (
        "example traces: none kept (the spans of these requests were sampled out; "
        "tokentrace serve --keep-rules or a higher --baseline keeps more)" in text
    )
    assert "Example traces: none kept (the spans of these requests were sampled out; " in md
    assert "`tokentrace serve --keep-rules` or a higher `--baseline` keeps more" in md
    assert "<p>Example traces: none kept (the spans of these requests were sampled out; " in page
    assert "<code>tokentrace serve --keep-rules</code> or a higher <code>--baseline</code>" in page
    # a report from a server without the list says nothing of examples
    older = {**report, "findings": [{k: v for k, v in f.items() if k != "example_traces"}]}
    for render in RENDERERS:
        assert "none kept" not in render(older).lower(), render.__name__


def test_large_counts_read_as_one_number() -> None:
    """Counts are grouped wherever a report says them: "client spans on 1,000,000 of 1000000
    requests" read as two numbers, "52856.9 vs 9813.0 requests per slice" as a measurement."""
    from tokentrace._words import counted

    assert counted(1_000_000, "request") == "1,000,000 requests"
    assert counted(1, "kept trace") == "1 kept trace"
    assert peak_hours._mean(52_856.94) == "52,857"
    assert peak_hours._mean(2.44) == "2.4"
