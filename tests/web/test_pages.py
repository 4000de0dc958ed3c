"""Every page and JSON twin over HTTP against a real server and a real DuckDB of generated traces."""

from __future__ import annotations

import html
import json
import shutil
from pathlib import Path

import duckdb
import httpx
import pytest
from tracegen import XSS_ATTR, XSS_NAME
from tt_testkit import explorer
from web_testkit import WebServer

from tokentrace.collector.otlp import decode_json
from tokentrace.instrumentation import semconv as sc


def _get(web: WebServer, path: str, **kw: object) -> httpx.Response:
    # plain HTTP on loopback: verify=False spares the CA bundle a new client loads (~20 ms)
    return httpx.get(web.url + path, timeout=30, verify=False, **kw)  # type: ignore[arg-type]


def _db(web: WebServer) -> duckdb.DuckDBPyConnection:
    return duckdb.connect(str(web.db), read_only=True)


@pytest.fixture(scope="module")
def truth(web: WebServer) -> dict[str, object]:
    conn = _db(web)
    try:
        rows = conn.execute("SELECT trace_id, request_id, e2e_ms, model, kept, output_tokens FROM requests").fetchall()
    finally:
        conn.close()
    return {
        "count": len(rows),
        "by_trace": {r[0]: r for r in rows},
        "sampled_out": [r[0] for r in rows if not r[4]],
    }


@pytest.mark.slow
def test_every_html_page_has_a_json_twin(web: WebServer) -> None:
    tid = web.requests[1].trace_id
    for page_path, api in (
        ("/", "/api/overview"),
        ("/search", "/api/search"),
        ("/diagnosis", "/api/diagnosis"),
        (f"/trace/{tid}", f"/api/trace/{tid}"),
    ):
        page = _get(web, page_path)
        assert page.status_code == 200, page_path
        assert page.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in page.headers["content-security-policy"]
        twin = _get(web, api)
        assert twin.status_code == 200, api
        assert twin.headers["content-type"] == "application/json"


def test_overview_counts_every_request(web: WebServer, truth: dict[str, object]) -> None:
    data = _get(web, "/api/overview").json()
    assert data["report"]["requests"]["count"] == truth["count"]
    series = data["series"]
    assert series["bin_s"] and len(series["t"]) == len(series["rps"]) > 1
    assert round(sum(series["rps"]) * series["bin_s"]) == truth["count"]
    for metric in ("e2e", "ttft", "tpot", "itl"):
        assert len(series[metric]["p99"]) == len(series["t"])
        assert all(a <= b for a, b in zip(series[metric]["p50"], series[metric]["p99"], strict=True) if a is not None)
    for i in range(len(series["t"])):
        shares = [series["share"][b][i] for b in ("network", "queue", "prefill", "decode")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-3)
    page = _get(web, "/").text
    assert "Findings" in page and 'data-chart="latency"' in page


@pytest.mark.slow
def test_overview_filters_narrow_the_window(web: WebServer, truth: dict[str, object]) -> None:
    llama = _get(web, "/api/overview", params={"model": "llama-8b"}).json()
    batch = _get(web, "/api/overview", params={"class": "batch"}).json()
    # the CLI's spelling, `--traffic-class`, is the same filter (it was silently ignored)
    alias = _get(web, "/api/overview", params={"traffic_class": "batch"}).json()
    assert alias["report"]["requests"] == batch["report"]["requests"]
    assert llama["report"]["requests"]["count"] == sum(1 for r in web.requests if r.model == "llama-8b")
    assert batch["report"]["requests"]["count"] == sum(1 for r in web.requests if r.traffic_class == "batch")
    mid = sorted(r.start_ns for r in web.requests)[60]
    later = _get(web, "/api/overview", params={"start": str(mid)}).json()
    assert 0 < later["report"]["requests"]["count"] < truth["count"]
    assert _get(web, "/api/overview", params={"window": "5m"}).json()["report"]["requests"]["count"] == truth["count"]


@pytest.mark.slow
def test_search_filters_match_the_database(web: WebServer) -> None:
    conn = _db(web)
    try:
        expect = conn.execute(
            "SELECT count(*) FROM requests WHERE model = 'qwen-7b' AND tenant = 'acme' AND e2e_ms >= 300 AND kept"
        ).fetchone()[0]
        slowest = conn.execute("SELECT trace_id FROM requests ORDER BY e2e_ms DESC LIMIT 1").fetchone()[0]
    finally:
        conn.close()
    data = _get(web, "/api/search", params={"model": "qwen-7b", "tenant": "acme", "min_e2e": "300", "kept": "1"}).json()
    assert data["total"] == expect == len(data["rows"])
    assert all(r["model"] == "qwen-7b" and r["kept"] and r["e2e_ms"] >= 300 for r in data["rows"])
    top = _get(web, "/api/search", params={"sort": "e2e_ms", "order": "desc", "limit": "1"}).json()
    assert top["rows"][0]["trace_id"] == slowest
    for bucket in ("queue", "prefill", "decode"):
        rows = _get(web, "/api/search", params={"bucket": bucket, "limit": "500"}).json()["rows"]
        for r in rows:
            assert r["dominant_bucket"] == bucket
            assert r[f"{bucket}_ms"] == max(r["queue_ms"], r["prefill_ms"], r["decode_ms"], r["network_ms"] or 0)


@pytest.mark.slow
@pytest.mark.parametrize("sort,order", [("start_ns", "desc"), ("e2e_ms", "asc"), ("ttft_ms", "desc"), ("tenant", "asc")])
def test_keyset_paging_walks_every_request_once_in_order(
    web: WebServer, truth: dict[str, object], sort: str, order: str
) -> None:
    seen: list[dict[str, object]] = []
    params: dict[str, str] = {"sort": sort, "order": order, "limit": "17"}
    for _ in range(20):
        page = _get(web, "/api/search", params=params).json()
        seen.extend(page["rows"])
        if page["next"] is None:
            break
        params = page["next"]
    keys = [(r["trace_id"], r["request_id"]) for r in seen]
    assert len(keys) == len(set(keys)) == truth["count"]
    values = [r[sort] for r in seen]
    assert values == sorted(values, reverse=order == "desc")


def test_search_html_links_to_traces_and_sorts(web: WebServer) -> None:
    page = _get(web, "/search", params={"sort": "e2e_ms", "order": "asc", "limit": "5"}).text
    assert page.count('class="trace-link"') == 5
    assert "next-page" in page
    assert 'class="sort active asc"' in page


def test_complaint_filter_uses_the_findings(web: WebServer) -> None:
    findings = _get(web, "/api/diagnosis").json()["report"]["findings"]
    for f in findings:
        rows = _get(web, "/api/search", params={"complaint": f["complaint"], "limit": "500"}).json()["rows"]
        affected = set(f.get("affected_trace_ids") or f.get("example_traces") or [])
        assert {r["trace_id"] for r in rows} <= affected
    unknown = _get(web, "/api/search", params={"complaint": "no_such_complaint"}).json()
    assert unknown["rows"] == [] and unknown["total"] == 0 and "no_such_complaint" in unknown["note"]


def test_trace_view_shows_waterfall_buckets_tokens_and_shared_steps(web: WebServer) -> None:
    stalled = next(r for r in web.requests if r.stalled)
    data = _get(web, f"/api/trace/{stalled.trace_id}").json()
    (rq,) = data["requests"]
    s = rq["summary"]
    assert sum(b["ms"] or 0 for b in rq["buckets"]) == pytest.approx(s["e2e_ms"], abs=0.01)
    assert len(rq["timeline"]["tokens"]) == s["output_tokens"] == len(stalled.tokens_abs_ns)
    assert rq["timeline"]["stalls"], "the generated 400-700 ms gap must show as a stall"
    stall = rq["timeline"]["stalls"][0]
    assert stall["gap_ms"] >= 400 and stall["steps"], "a stall lists the engine steps that overlapped it"
    assert rq["engine_steps"]["served"] > 0 and rq["timeline"]["gpu"]
    shared = rq["shared_requests"]
    assert shared and all(o["request_id"] != stalled.request_id for o in shared)
    assert any(o["trace_id"] for o in shared)
    if data["span_count"]:
        depths = {sp["name"]: sp["depth"] for sp in data["spans"]}
        assert depths[sc.SPAN_CLIENT] == 0 and depths[sc.SPAN_REQUEST] == 1 and depths[sc.SPAN_DECODE] == 2
    page = _get(web, f"/trace/{stalled.trace_id}").text
    assert 'class="stall"' in page and 'class="shared-link"' in page
    n = rq["engine_steps"]["overlapping"]
    assert f"{n:,} engine step{'' if n == 1 else 's'} overlapping, " in page


def test_sampled_out_request_still_shows_its_buckets(web: WebServer, truth: dict[str, object]) -> None:
    tid = truth["sampled_out"][0]  # type: ignore[index]
    data = _get(web, f"/api/trace/{tid}").json()
    assert data["span_count"] == 0 and data["kept"] is None
    (rq,) = data["requests"]
    assert not rq["has_spans"] and {b["bucket"] for b in rq["buckets"]} == {"network", "queue", "prefill", "decode"}
    page = _get(web, f"/trace/{tid}").text
    assert "were not kept" in page and "bucketbar" in page
    assert _get(web, f"/api/trace/{tid}/otlp.json").status_code == 404


def test_otlp_export_round_trips_through_the_collector_decoder(web: WebServer) -> None:
    tid = web.requests[0].trace_id  # an error: always kept
    shown = _get(web, f"/api/trace/{tid}").json()
    doc = _get(web, f"/api/trace/{tid}/otlp.json").json()
    spans = decode_json(doc)
    assert len(spans) == shown["span_count"] > 0
    by_name = {s.name: s for s in spans}
    req = by_name[sc.SPAN_REQUEST]
    assert sc.unpack_list(req.attributes[sc.TOKEN_OFFSETS_US]) == [
        (t - req.start_ns) // 1000 for t in web.requests[0].tokens_abs_ns
    ]
    assert req.attributes["user.note"] == XSS_ATTR and req.status_code == 2


def test_chrome_export_has_spans_tokens_and_engine_steps(web: WebServer) -> None:
    gen = web.requests[0]
    doc = _get(web, f"/api/trace/{gen.trace_id}/chrome.json").json()
    events = doc["traceEvents"]
    spans = [e for e in events if e.get("cat") == "span"]
    assert len(spans) == _get(web, f"/api/trace/{gen.trace_id}").json()["span_count"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in spans)
    assert sum(1 for e in events if e.get("cat") == "token") == len(gen.tokens_abs_ns)
    assert any(e.get("cat") == "engine_step" for e in events)
    assert json.dumps(doc)  # plain JSON, loadable by ui.perfetto.dev


def test_span_values_are_escaped(web: WebServer) -> None:
    page = _get(web, f"/trace/{web.requests[0].trace_id}").text
    assert XSS_NAME not in page and XSS_ATTR not in page
    # span details travel in a JSON block (app.js shows them as text), with <, > and & escaped
    # so no value can end the block
    assert "\\u003cscript\\u003ealert(" in page and "\\u003cimg src=x onerror=alert(1)\\u003e" in page
    block = page.split('<script type="application/json" id="span-details">', 1)[1].split("</script>", 1)[0]
    values = {v for span in json.loads(block)["spans"] for _, v in span["attributes"]}
    assert {XSS_NAME, XSS_ATTR} <= values


SQL = ("' OR 1=1 --", "x'); DROP TABLE requests; --", "1; SELECT * FROM spans", '" UNION SELECT 1 --')


@pytest.mark.slow
@pytest.mark.parametrize(
    "param",
    ["window", "start", "end", "model", "tenant", "class", "service", "min_e2e", "max_e2e", "min_ttft", "max_ttft",
     "bucket", "complaint", "kept", "error", "sort", "order", "limit", "after"],
)  # fmt: skip
def test_sql_in_any_search_parameter_is_refused_or_matches_nothing(web: WebServer, param: str) -> None:
    for value in SQL:
        for path in ("/api/search", "/search", "/api/overview", "/diagnosis"):
            r = _get(web, path, params={param: value})
            assert r.status_code in (200, 400), (path, param, value, r.text[:200])
            body = r.text
            for leak in ("Traceback", "duckdb", "Binder", "Parser Error", "Catalog"):
                assert leak not in body
            if r.status_code == 400 and path.startswith("/api/"):
                assert param.split("_")[-1] in r.json()["error"] or param in r.json()["error"]
            elif r.status_code == 200 and path == "/api/search":
                assert r.json()["total"] == 0, (param, value)
    conn = _db(web)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == len(web.requests)
    finally:
        conn.close()


@pytest.mark.parametrize(
    "query,needle",
    [
        ({"window": "3w"}, "window must be one of"),
        ({"min_e2e": "fast"}, "min_e2e must be a number"),
        ({"min_e2e": "-1"}, ">= 0"),
        ({"sort": "trace_id"}, "sort must be one of"),
        ({"order": "sideways"}, "order must be asc or desc"),
        ({"limit": "100000"}, "limit must be"),
        ({"after": "bm90IGEgY3Vyc29y"}, "after is not a cursor"),
        ({"start": "yesterday"}, "ISO 8601"),
        ({"start": "2026-01-02", "end": "2026-01-01"}, "end must be after start"),
        ({"class": "vip"}, "class must be one of"),
    ],
)
def test_bad_parameters_get_400_with_a_clear_message(web: WebServer, query: dict[str, str], needle: str) -> None:
    r = _get(web, "/api/search", params=query)
    assert r.status_code == 400 and needle in r.json()["error"]
    page = _get(web, "/search", params=query)
    assert page.status_code == 400 and html.escape(needle, quote=True) in page.text


def test_unknown_and_malformed_trace_ids(web: WebServer) -> None:
    assert _get(web, "/api/trace/" + "ab" * 16).status_code == 404
    assert _get(web, "/trace/" + "ab" * 16).status_code == 404
    r = _get(web, "/api/trace/not-a-trace")
    assert r.status_code == 400 and "hex" in r.json()["error"]
    jump = _get(web, "/trace", params={"id": web.requests[2].trace_id.upper()}, follow_redirects=False)
    assert jump.status_code == 303 and jump.headers["location"] == f"/trace/{web.requests[2].trace_id}"


@pytest.mark.slow
def test_bearer_token_guards_pages_and_api(generated: tuple[object, object]) -> None:
    db, requests = generated
    with explorer(db, api_token="s3cret") as url:  # type: ignore[arg-type]
        assert httpx.get(url + "/api/overview").status_code == 401
        assert httpx.get(url + "/", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(url + "/api/overview", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        with httpx.Client(base_url=url, follow_redirects=True) as browser:
            first = browser.get("/search", params={"token": "s3cret", "model": "qwen-7b"})
            assert first.history and first.history[0].status_code == 303
            assert "token" not in str(first.url) and "model=qwen-7b" in str(first.url)
            assert first.status_code == 200
            assert browser.get("/api/search").status_code == 200  # the cookie now carries the token
        assert httpx.get(url + "/static/app.js").status_code == 401


@pytest.mark.slow
@pytest.mark.parametrize(
    "query,needle",
    [
        ({"start": "0001-01-01"}, "between 1970-01-01 and 2262-04-11"),
        ({"end": "99999999999999999999999"}, "between 1970-01-01 and 2262-04-11"),
        ({"start": "²"}, "ISO 8601"),  # a digit to str.isdigit(), not to int()
    ],
)
def test_times_out_of_range_are_a_400_on_every_page(web: WebServer, query: dict[str, str], needle: str) -> None:
    for path in ("/", "/search", "/diagnosis", "/api/overview", "/api/search", "/api/diagnosis", "/api/requests.csv"):
        r = _get(web, path, params=query)
        assert r.status_code == 400, (path, query, r.text[:200])
        assert needle in (r.json()["error"] if path.startswith("/api/") else html.unescape(r.text))


def test_a_unicode_digit_limit_is_a_400(web: WebServer) -> None:
    for path in ("/search", "/api/search", "/api/requests.csv"):
        r = _get(web, path, params={"limit": "²"})
        assert r.status_code == 400 and "limit must be" in html.unescape(r.text), path


def test_a_trace_id_with_a_trailing_newline_is_refused(web: WebServer) -> None:
    r = _get(web, f"/api/trace/{web.requests[1].trace_id}%0A")
    assert r.status_code == 400 and "hex" in r.json()["error"]


def test_the_jump_box_takes_the_short_ids_the_pages_show(web: WebServer) -> None:
    tid = web.requests[3].trace_id
    shown = _get(web, "/search", params={"limit": "500"}).text
    assert f">{tid[:16]}</a>" in shown  # what a user copies
    for given in (tid[:16], tid[:8].upper(), tid):
        jump = _get(web, "/trace", params={"id": given}, follow_redirects=False)
        assert jump.status_code == 303 and jump.headers["location"] == f"/trace/{tid}", given
    short = _get(web, "/trace", params={"id": tid[:7]}, follow_redirects=False)
    assert short.headers["location"] == f"/trace/{tid[:7]}"  # too short to guess from: the page says not found
    assert _get(web, "/trace", params={"id": "0" * 16}, follow_redirects=True).status_code == 404


def test_unknown_urls_get_the_error_page_not_framework_json(web: WebServer) -> None:
    page = _get(web, "/no/such/page")
    assert page.status_code == 404 and page.headers["content-type"].startswith("text/html")
    assert "no such page" in page.text and 'class="error-message"' in page.text
    api = _get(web, "/api/no-such-thing")
    assert api.status_code == 404 and api.json() == {"error": "no such page"}


def test_filter_form_carries_every_filter_of_the_url(web: WebServer) -> None:
    start = str(min(r.start_ns for r in web.requests))
    for path in ("/", "/search", "/diagnosis"):
        page = _get(web, path, params={"service": "llm-server", "start": start}).text
        assert '<option value="llm-server" selected>llm-server</option>' in page, path
        assert f'name="start" size="20" placeholder="ISO time or ns" value="{start}"' in page, path


def test_search_shows_and_sorts_by_service(web: WebServer) -> None:
    data = _get(web, "/api/search", params={"sort": "service", "order": "asc"}).json()
    assert data["sort"] == "service" and data["rows"][0]["service"] == "llm-server"
    assert '<td class="text">llm-server</td>' in _get(web, "/search").text


@pytest.mark.slow
def test_no_tenant_is_no_filter_choice(edited: WebServer) -> None:
    page = _get(edited, "/search", params={"limit": "500"}).text
    assert page.count('<td class="text">—</td>') == 2  # the two requests without a tenant
    at = page.index('<select name="tenant">')
    tenants = page[at : page.index("</select>", at)]
    # "(none)" had the value "" of "any": choosing it showed every tenant
    assert tenants.count('value=""') == 1 and "(none)" not in tenants


def test_overview_series_has_a_point_for_every_bin_of_the_window(edited: WebServer) -> None:
    series = _get(edited, "/api/overview").json()["series"]
    step = series["bin_s"]
    assert all(b - a == pytest.approx(step) for a, b in zip(series["t"], series["t"][1:], strict=False))
    idle = [i for i, rps in enumerate(series["rps"]) if rps == 0]
    assert len(idle) * step >= 500, "ten idle minutes show as bins without requests"
    for i in idle:
        assert series["e2e"]["p99"][i] is None and series["share"]["queue"][i] is None
    assert round(sum(series["rps"]) * step) == len(edited.requests)


def test_request_and_error_counts_read_as_english(web: WebServer) -> None:
    import re

    errors = _get(web, "/api/overview").json()["report"]["requests"]["errors"]
    noun = "error" if errors == 1 else "errors"
    for path in ("/", "/diagnosis"):
        page = _get(web, path).text
        assert re.search(rf"\b{errors:,} {noun}\b", page), path
        assert not re.search(r"\b1 (errors|requests)\b", page), path


def _as_ms(text: str) -> float:
    number, unit = text.rsplit(" ", 1)
    assert unit in ("ms", "s"), text
    return float(number.replace(",", "")) * (1000 if unit == "s" else 1)


def test_durations_read_in_seconds_from_one_second() -> None:
    from tokentrace.web._format import ms

    assert [ms(v) for v in (None, 0, 912.44, 999.94, 999.96, 1000, 1290.4, 7290, 9121.5, 12345.6)] == [
        "—", "0.0 ms", "912.4 ms", "999.9 ms", "1.00 s", "1.00 s", "1.29 s", "7.29 s", "9.12 s", "12.35 s",
    ]  # fmt: skip
    # finer figures keep finer seconds; the switch goes by the figure as rounded
    assert (ms(999.994, 2), ms(999.996, 2), ms(1234.6, 2), ms(1234.56, 3)) == ("999.99 ms", "1.000 s", "1.235 s", "1.2346 s")


def test_search_shows_seconds_from_one_second_and_still_sorts_by_value(web: WebServer) -> None:
    import re

    params = {"sort": "e2e_ms", "order": "desc", "limit": "500"}
    truth = [row["e2e_ms"] for row in _get(web, "/api/search", params=params).json()["rows"]]
    shown = re.findall(r"Z</td>\s*<td>([^<]+)</td>", _get(web, "/search", params=params).text)  # after the start time
    assert len(shown) == len(truth) == len(web.requests)
    assert min(truth) < 1000 <= max(truth), "the generated requests lie on both sides of 1 s"
    for text, value in zip(shown, truth, strict=True):
        assert text.endswith(" s") == (value >= 1000), text
        assert _as_ms(text) == pytest.approx(value, abs=5 if text.endswith(" s") else 0.05)
    # sorting is the server's, by the column's numbers: the mixed units still read in order
    assert [_as_ms(t) for t in shown] == sorted((_as_ms(t) for t in shown), reverse=True)


@pytest.mark.slow
def test_no_page_shows_a_thousand_milliseconds_or_more(edited: WebServer) -> None:
    import re

    slowest = _get(edited, "/api/search", params={"sort": "e2e_ms", "limit": "1"}).json()["rows"][0]
    for path in ("/", "/search", "/diagnosis", f"/trace/{slowest['trace_id']}"):
        page = _get(edited, path).text
        big = re.search(r"\b\d{1,3}(,\d{3})+(\.\d+)? ms\b", page)
        assert big is None, (path, big)
        assert re.search(r"\b\d+\.\d\d s\b", page), path


@pytest.mark.slow
def test_paging_walks_requests_whose_ids_are_long(tmp_path: Path) -> None:
    # a request id is whatever a sender wrote; the next-page cursor carries it, and
    # a cursor over the filters' length bound made the second page a 400
    from tracegen import generate

    db, _ = generate(tmp_path, count=7, evil=False)
    with duckdb.connect(str(db)) as conn:
        conn.execute("UPDATE requests SET request_id = repeat('r', 1500) || request_id")
    seen: list[str] = []
    with explorer(db) as url:
        params: dict[str, str] = {"limit": "2"}
        for _ in range(10):
            r = httpx.get(f"{url}/api/search", params=params, timeout=30)
            assert r.status_code == 200, r.text
            page = r.json()
            seen.extend(row["request_id"] for row in page["rows"])
            if page["next"] is None:
                break
            params = page["next"]
    assert len(seen) == len(set(seen)) == 7


@pytest.mark.slow
def test_network_not_measured_reads_as_a_dash_not_zero(one_slice: WebServer, web: WebServer) -> None:
    import re

    data = _get(one_slice, "/api/overview").json()
    assert data["report"]["buckets"]["network"]["measured"] is False
    assert data["series"]["share"]["network"] == [None] and data["series"]["share"]["decode"][0] > 0
    for path in ("/", "/diagnosis"):
        page = _get(one_slice, path).text
        network = re.search(r'<i class="sw b-network"></i>network</th><td>([^<]*)</td>', page)
        assert network and network[1] == "—", (path, network and network[1])
    # measured, it is a share as before
    page = _get(web, "/").text
    assert re.search(r'<i class="sw b-network"></i>network</th><td>\d+\.\d %</td>', page)


def test_a_sampled_out_trace_says_its_token_times_were_not_kept(web: WebServer, truth: dict[str, object]) -> None:
    tid = truth["sampled_out"][0]  # type: ignore[index]
    assert truth["by_trace"][tid][5] > 0  # type: ignore[index]  # it did stream tokens
    page = _get(web, f"/trace/{tid}").text
    assert "token times were not kept for this request (its spans were sampled out)" in page
    assert " tokens over " not in page
    kept = web.requests[0]  # an error: always kept
    page = _get(web, f"/trace/{kept.trace_id}").text
    assert f"{len(kept.tokens_abs_ns)} tokens over " in page and "token times were not kept" not in page


def test_confidence_reads_as_a_whole_percent(web: WebServer) -> None:
    import re

    findings = _get(web, "/api/diagnosis").json()["report"]["findings"]
    assert findings
    for path in ("/", "/diagnosis"):
        page = _get(web, path).text
        shown = re.findall(r'<span class="conf">confidence ([^<]*)</span>', page)
        assert shown == [f"{f['confidence']:.0%}".replace("%", " %") for f in findings], (path, shown)
        assert all(re.fullmatch(r"\d{1,3} %", s) for s in shown), shown


@pytest.mark.slow
def test_one_wording_and_one_duration_format_across_pages(web: WebServer) -> None:
    import re

    from tokentrace.web._format import ms

    # TPOT as every other duration: one decimal (search and trace said "33.53 ms")
    rows = _get(web, "/api/search", params={"sort": "e2e_ms", "limit": "20"}).json()["rows"]
    page = _get(web, "/search", params={"sort": "e2e_ms", "limit": "20"}).text
    tpots = re.findall(r"Z</td>\s*<td>[^<]+</td><td>[^<]+</td><td>([^<]+)</td>", page)
    assert tpots == [ms(r["tpot_ms"]) for r in rows]
    tid = web.requests[0].trace_id
    tpot = _get(web, f"/api/trace/{tid}").json()["requests"][0]["summary"]["tpot_ms"]
    assert f"<th>TPOT</th><td>{ms(tpot)}</td>" in _get(web, f"/trace/{tid}").text
    # the overview's names: "TTFT (server)" (a bare "TTFT" was read as the user's), "E2E"; the
    # queue's parts as docs/buckets.md names them
    diagnosis = _get(web, "/diagnosis").text
    assert re.search(r"<th[^>]*>TTFT \(server\)</th>", diagnosis) and "<th>TTFT</th>" not in diagnosis
    assert "end-to-end</th>" not in diagnosis
    assert re.search(r"queue: queue_wait \d+\.\d %, tokenize \d+\.\d %, other \d+\.\d %", diagnosis)
    assert "queue_wait</th>" in _get(web, f"/trace/{tid}").text


@pytest.mark.slow
def test_findings_of_several_services_say_so_and_how_they_are_ordered(two_services: WebServer, web: WebServer) -> None:
    report = _get(two_services, "/api/diagnosis").json()  # waits for the report: the overview then has it
    assert report["report"]["findings"] and report["services"] == 2
    for path in ("/", "/diagnosis"):
        page = _get(two_services, path).text
        assert 'id="findings-mixed"' in page and "mix 2 services" in page, path
        assert "weighted by the share of the window's end-to-end time" in page, path
        one = _get(two_services, path, params={"service": "llm-server"}).text
        assert 'id="findings-mixed"' not in one, path
    _get(web, "/api/diagnosis")
    assert 'id="findings-mixed"' not in _get(web, "/").text  # one service: nothing to say


def test_the_site_has_a_favicon(web: WebServer) -> None:
    icon = _get(web, "/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    assert icon.text.startswith("<svg")
    page = _get(web, "/").text
    link = page.index('<link rel="icon"')
    href = page[link:].split('href="', 1)[1].split('"', 1)[0]
    assert href == "/static/favicon.svg"  # root-relative (docs/web.md: behind a reverse proxy)
    assert httpx.get(web.url + href, timeout=30).status_code == 200


def test_out_of_duckdbs_memory_is_a_503_that_says_what_to_do(
    generated: tuple[Path, object], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A window over millions of requests outgrew the 256MB bound: a bare 500 'internal error'
    (an SRE measured it at 2.5 M requests); here a tiny bound does the same on a small file."""
    from tt_testkit import explorer

    from tokentrace.store import reader

    def tiny_bound(path: Path) -> duckdb.DuckDBPyConnection:
        # set when the explorer opens its connection: once it holds data, a lower bound is refused
        return duckdb.connect(str(path), read_only=True, config={"memory_limit": "1MB"})

    monkeypatch.setattr(reader, "open_read_only", tiny_bound)
    db = tmp_path / "copy.duckdb"  # a file no other connection of this process holds
    shutil.copy(generated[0], db)
    with explorer(db) as url:
        r = httpx.get(f"{url}/api/search", params={"limit": 500, "sort": "ttft_ms"}, timeout=60)
        assert r.status_code == 503, (r.status_code, r.text[:300])
        assert "ran out of memory" in r.json()["error"] and "--duckdb-memory-limit" in r.json()["error"]


def test_the_parquet_download_says_start_is_utc(web: WebServer) -> None:
    """`/api/requests.parquet` (what `requests --url` fetches) writes `start` as a UTC
    timestamp, as `tokentrace requests --format parquet` does; the text formats say `Z`."""
    import io

    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = _get(web, "/api/requests.parquet", params={"limit": "5"}).content
    table = pq.read_table(io.BytesIO(data))
    assert table.schema.field("start").type == pa.timestamp("us", tz="UTC")
    frame = pl.read_parquet(io.BytesIO(data))
    assert frame["start"].dt.epoch("us").to_list() == [ns // 1000 for ns in table.column("start_ns").to_pylist()]
    lines = [json.loads(x) for x in _get(web, "/api/requests.jsonl", params={"limit": "5"}).text.splitlines()]
    assert [x["start"] for x in lines] == [t.strftime("%Y-%m-%dT%H:%M:%S.%fZ") for t in frame["start"].to_list()]
