"""The explorer against a hostile sender and a hostile web: span data, parameters, Host, token, headers.

`hostile` serves traces whose every string is an injection payload and whose doubles
are NaN and ±Infinity (tests/hostile.py); the browser side is in
test_security_browser.py.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from hostile import NON_FINITE
from tt_testkit import explorer, serving
from web_testkit import HostileServer, WebServer

from tokentrace.collector.otlp import decode_json
from tokentrace.collector.settings import CollectorSettings
from tokentrace.web._guard import SECURITY_HEADERS, token_cookie
from tokentrace.web.app import create_web_app

TOKEN = "t0ken-Secret-1"
LEAKS = ("Traceback", "duckdb", "Binder", "Parser Error", "Catalog", "Conversion Error", "Invalid Input")


def _get(base: str, path: str, **kw: Any) -> httpx.Response:
    # plain HTTP on loopback: verify=False spares the CA bundle a new client loads (~20 ms)
    return httpx.get(base + path, timeout=60, verify=False, **kw)


def _strict_json(text: str) -> Any:
    """Parses JSON as a browser's JSON.parse does: NaN and Infinity are no JSON."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


# ---- hostile span data through the JSON API and the exports ---------------------------


@pytest.mark.slow
@pytest.mark.parametrize("route", ["", "/otlp.json", "/chrome.json"])
def test_non_finite_doubles_in_spans_do_not_break_the_trace_json(hostile: HostileServer, route: str) -> None:
    for t in hostile.traces:
        r = _get(hostile.url, f"/api/trace/{t.trace_id}{route}")
        assert r.status_code == 200, (t.payload_name, r.text[:200])
        _strict_json(r.text)  # valid for any JSON parser; NaN and ±Infinity written as strings
        for written in NON_FINITE.values():
            assert f'"{written}"' in r.text, written


@pytest.mark.slow
def test_otlp_export_of_hostile_spans_round_trips(hostile: HostileServer) -> None:
    for t in hostile.traces:
        doc = _get(hostile.url, f"/api/trace/{t.trace_id}/otlp.json").json()
        spans = decode_json(doc)
        assert {s.name for s in spans} == {t.payload, "tokentrace.request"}
        request = next(s for s in spans if s.name == "tokentrace.request")
        assert request.status_message == t.payload and request.resource["service.name"] == t.payload
        assert request.attributes[t.payload] == t.payload and request.events[0].name == t.payload
        assert request.links[0].attributes[t.payload] == t.payload
        assert math.isnan(request.attributes["double.nan"])  # "NaN" is how OTLP/JSON writes it
        assert request.attributes["double.inf"] == math.inf and request.attributes["double.neg-inf"] == -math.inf


@pytest.mark.slow
def test_hostile_strings_come_back_verbatim_in_the_json(hostile: HostileServer) -> None:
    for t in hostile.traces:
        trace = _get(hostile.url, f"/api/trace/{t.trace_id}").json()
        p = t.payload
        (rq,) = trace["requests"]
        assert rq["summary"]["request_id"] == t.request_id
        assert rq["summary"]["model"] == rq["summary"]["tenant"] == rq["summary"]["service"] == p
        names = {s["name"] for s in trace["spans"]}
        assert p in names
        request = next(s for s in trace["spans"] if s["name"] == "tokentrace.request")
        assert request["status_message"] == p and request["events"][0]["name"] == p
        assert request["attributes"][p] == p and request["resource"][p] == p
        assert request["links"][0]["attributes"][p] == p
        assert {o["request_id"] for o in rq["shared_requests"]} == {
            o.request_id for o in hostile.traces if o is not t
        }
    for t in hostile.traces:
        if len(t.payload) <= 200:  # longer filter values are a 400 (see _params._MAX_TEXT)
            rows = _get(hostile.url, "/api/search", params={"model": t.payload}).json()["rows"]
            assert [r["trace_id"] for r in rows] == [t.trace_id], t.payload_name


def test_exports_are_downloads_of_their_own_type(hostile: HostileServer) -> None:
    tid = hostile.traces[0].trace_id
    for path, media in (
        (f"/api/trace/{tid}/otlp.json", "application/json"),
        (f"/api/trace/{tid}/chrome.json", "application/json"),
        ("/api/requests.csv", "text/csv"),
        ("/api/requests.jsonl", "application/x-ndjson"),
        ("/api/requests.parquet", "application/vnd.apache.parquet"),
    ):
        r = _get(hostile.url, path)
        assert r.status_code == 200 and r.headers["content-type"].split(";")[0] == media, path
        disposition = r.headers["content-disposition"]
        assert disposition.startswith("attachment; filename=\"") and disposition.count('"') == 2, disposition
        assert r.headers["x-content-type-options"] == "nosniff"


# ---- parameters -------------------------------------------------------------------------


def _cursor(key: list[Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


@pytest.mark.parametrize(
    "path,query,needle",
    [
        ("/api/requests.csv", "limit=99999999999999999999", "limit must be a whole number"),
        ("/api/requests.jsonl", "limit=" + "9" * 150, "limit must be a whole number"),
        ("/api/requests.csv", "limit=1_000", "limit must be a whole number"),
        ("/api/search", "after=" + _cursor([10**40, "a", "b"]), "after is not a cursor"),
        ("/api/search", "sort=e2e_ms&after=" + _cursor([-(10**30), "a", "b"]), "after is not a cursor"),
        ("/search", "after=" + _cursor([10**19, "a", "b"]), "after is not a cursor"),
    ],
)
def test_numbers_out_of_range_are_a_400_not_a_500(web: WebServer, path: str, query: str, needle: str) -> None:
    r = _get(web.url, f"{path}?{query}")
    assert r.status_code == 400, r.text[:200]
    assert needle in (r.json()["error"] if path.startswith("/api/") else html.unescape(r.text))


VIEW_PARAMS = ("window", "start", "end", "model", "tenant", "class", "service")
#: Each JSON route with the parameters it reads (its HTML twin parses them with the same function).
ROUTE_PARAMS = {
    "/api/search": (*VIEW_PARAMS, "min_e2e", "max_e2e", "min_ttft", "max_ttft", "bucket", "complaint", "kept",
                    "error", "sort", "order", "limit", "after"),
    "/api/overview": VIEW_PARAMS,
    "/api/diagnosis": VIEW_PARAMS,
    "/api/requests.csv": (*VIEW_PARAMS, "limit"),
    "/trace": ("id",),
}  # fmt: skip
VALUES = (
    "' OR 1=1 --", '"; DROP TABLE requests; --', "\x00", "\u2028", "9" * 199, "-" + "9" * 100, "1e308", "NaN",
    'e2e_ms" --', "x" * 201,
)


@pytest.mark.slow
@pytest.mark.parametrize("route", list(ROUTE_PARAMS))
def test_no_parameter_value_gets_a_500(web: WebServer, route: str) -> None:
    twin = {"/api/search": "/search", "/api/overview": "/", "/api/diagnosis": "/diagnosis"}.get(route)
    asks: list[tuple[str, Any]] = []
    for param in ROUTE_PARAMS[route]:
        for value in VALUES:
            # alone (on the HTML twin too: it parses with the same function), repeated (the last
            # one counts; the first must not slip through either), as an array (an unknown name)
            asks += [(path, {param: value}) for path in (route, twin) if path]
            asks += [(route, [(param, "1"), (param, value)]), (route, [(param, value), (param, "1")])]
            asks += [(route, {param + "[]": value})]
    with httpx.Client(base_url=web.url, timeout=60) as client:
        for path, query in asks:
            r = client.get(path, params=query)
            assert r.status_code < 500, (path, query, r.text[:200])
            assert not any(leak in r.text for leak in LEAKS), (path, query, r.text[:300])


# ---- Host (DNS rebinding) ---------------------------------------------------------------


@pytest.fixture
def guarded(generated: tuple[Path, object]) -> Iterator[str]:
    with explorer(generated[0], api_token=TOKEN) as url:
        yield url


@pytest.mark.slow
@pytest.mark.parametrize("token", [None, TOKEN])
def test_a_host_of_another_name_is_refused(web: WebServer, guarded: str, token: str | None) -> None:
    url = guarded if token else web.url
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    port = url.rsplit(":", 1)[1]
    for path in ("/", "/api/overview", "/api/requests.csv", "/static/app.js", "/healthz", "/no/such/page"):
        for host in (f"rebind.example:{port}", "rebind.example", f"127.0.0.1.rebind.example:{port}", f"127.0.0.1:{port}@x", "[::1"):
            r = _get(url, path, headers={"Host": host, **auth})
            assert r.status_code == 403, (path, host, r.status_code)
            assert "DNS rebinding" in r.json()["error"]
            assert r.headers["x-content-type-options"] == "nosniff"
        for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"LOCALHOST.:{port}", f"[::1]:{port}", "127.0.0.2"):
            r = _get(url, path, headers={"Host": host, **auth})
            assert r.status_code in (200, 404), (path, host, r.status_code, r.text[:200])


@pytest.mark.slow
def test_a_host_that_binds_another_address_takes_any_host(generated: tuple[Path, object]) -> None:
    with explorer(generated[0], host="0.0.0.0") as url:  # noqa: S104 - the setting, not a bind
        assert _get(url, "/api/overview", headers={"Host": "explorer.lan:8600"}).status_code == 200


@pytest.mark.slow
def test_pages_link_their_own_files_root_relative_whatever_the_host(web: WebServer) -> None:
    """Behind the reverse proxy docs/web.md describes (`Host: localhost`), absolute URLs built
    from the Host header sent remote browsers to their own localhost for the CSS and scripts."""
    pages = ("/", "/search", "/diagnosis", f"/trace/{web.requests[0].trace_id}", "/no/such/page")
    for host in ("localhost", "localhost:8600", "127.0.0.1"):
        for path in pages:
            page = _get(web.url, path, headers={"Host": host}).text
            refs = re.findall(r'(?:href|src)="([^"]*)"', page)
            assert "/static/app.js" in refs and "/static/app.css" in refs, (host, path)
            absolute = [r for r in refs if not r.startswith("/") or r.startswith("//")]
            assert absolute == [], (host, path, absolute)


# ---- token ------------------------------------------------------------------------------


@pytest.mark.slow
def test_every_route_needs_the_token_and_none_echoes_it(generated: tuple[Path, list[Any]], guarded: str) -> None:
    tid = generated[1][0].trace_id
    urls = {
        "/": "/", "/api/overview": "/api/overview", "/search": "/search", "/api/search": "/api/search",
        "/trace": f"/trace?id={tid}", "/trace/{trace_id}": f"/trace/{tid}", "/api/trace/{trace_id}": f"/api/trace/{tid}",
        "/api/trace/{trace_id}/otlp.json": f"/api/trace/{tid}/otlp.json",
        "/api/trace/{trace_id}/chrome.json": f"/api/trace/{tid}/chrome.json",
        "/diagnosis": "/diagnosis", "/api/diagnosis": "/api/diagnosis", "/api/requests.{fmt}": "/api/requests.csv",
        "/static": "/static/app.js", "/favicon.ico": "/favicon.ico",
    }  # fmt: skip
    app = create_web_app(CollectorSettings(db=generated[0]))
    # /healthz, the liveness probe, is the one route open without it (the test below)
    assert {getattr(r, "path", None) for r in app.routes} == set(urls) | {"/healthz"}, "a new route: add it here"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    cookie = token_cookie(urlsplit(guarded).port)
    for path in urls.values():
        for headers in ({}, {"Authorization": "Bearer " + TOKEN[:-1]}, {"Cookie": f"{cookie}={TOKEN}x"},
                        {"Cookie": f"{token_cookie(None)}={TOKEN}"}):  # another port's name: not ours
            r = _get(guarded, path, headers=headers)
            assert r.status_code == 401, (path, headers)
            assert TOKEN not in r.text and TOKEN not in str(r.headers)
        for headers in (auth, {"Cookie": f"{cookie}={TOKEN}"}):
            r = _get(guarded, path, headers=headers, follow_redirects=False)
            assert r.status_code in (200, 303), (path, r.status_code)
            assert TOKEN not in r.content.decode("utf-8", "replace") and TOKEN not in str(r.headers)


@pytest.mark.slow
def test_the_liveness_probe_needs_no_token_and_says_only_ok(guarded: str) -> None:
    """A load balancer or a Kubernetes probe has no secret: GET /healthz answers without
    the token (as Grafana's /api/health does), and with nothing but "ok"."""
    port = guarded.rsplit(":", 1)[1]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": f"{token_cookie(int(port))}=wrong"}):
        r = _get(guarded, "/healthz", headers=headers, follow_redirects=False)
        assert r.status_code == 200, (headers, r.status_code, r.text[:200])
        assert r.json() == {"status": "ok"} and "set-cookie" not in r.headers
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, name
    head = httpx.head(guarded + "/healthz", timeout=60)
    assert head.status_code == 200
    # a wrong ?token= neither refuses it nor is echoed; a right one sets no cookie here
    r = _get(guarded, "/healthz", params={"token": "guess"}, follow_redirects=False)
    assert r.status_code == 200 and "guess" not in r.text
    # only the probe: its neighbours, other methods and look-alike paths still need the token
    for path in ("/healthz/", "/healthz.json", "/healthzz", "/api/healthz", "/static/../healthz/x"):
        assert _get(guarded, path, follow_redirects=False).status_code == 401, path
    assert httpx.post(guarded + "/healthz", timeout=60).status_code == 401
    # the Host check still applies (DNS rebinding is refused before the token is looked at)
    rebound = _get(guarded, "/healthz", headers={"Host": f"rebind.example:{port}"})
    assert rebound.status_code == 403 and "DNS rebinding" in rebound.json()["error"]


def test_the_token_link_redirects_only_within_the_site(guarded: str) -> None:
    for path in ("//rebind.example/x", "///rebind.example", "/\\rebind.example"):
        r = _get(guarded, path, params={"token": TOKEN, "model": "m"}, follow_redirects=False)
        assert r.status_code == 303, path
        location = r.headers["location"]
        assert location.startswith("/") and not location.startswith(("//", "/\\")), location
        assert TOKEN not in location and "model=m" in location


@pytest.mark.slow
def test_the_token_is_never_logged(guarded: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        for path in ("/api/overview", "/api/trace/zz", "/search?limit=x", "/nope"):
            _get(guarded, path, params={"token": TOKEN}, follow_redirects=True)
            _get(guarded, path, headers={"Authorization": f"Bearer {TOKEN}"})
    # the server's loggers (httpx, the client here, logs the URLs it asks for)
    server = [r for r in caplog.records if r.name.startswith(("tokentrace", "uvicorn", "starlette", "fastapi"))]
    assert all(TOKEN not in r.getMessage() and TOKEN not in str(r.args) for r in server)


# ---- headers on every response ----------------------------------------------------------


@pytest.fixture
def crashing(generated: tuple[Path, object]) -> Iterator[str]:
    """The app with one more route that fails with an error of no known kind."""
    app = create_web_app(CollectorSettings(db=generated[0], api_token=TOKEN))

    def boom() -> None:
        raise RuntimeError("secret internals /var/lib/db")

    for path in ("/api/boom", "/boom"):
        app.add_api_route(path, boom)
    with serving(app) as url:
        yield url


def test_an_unexpected_error_is_the_explorers_500(crashing: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    api = _get(crashing, "/api/boom", headers=auth)
    assert api.status_code == 500 and api.json() == {"error": "internal error; see the server log"}
    page = _get(crashing, "/boom", headers=auth)
    assert page.status_code == 500 and 'class="error-message"' in page.text and "internals" not in page.text
    for r in (api, page):
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.url, name)


@pytest.mark.slow
def test_every_kind_of_response_carries_the_security_headers(crashing: str, guarded: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    port = guarded.rsplit(":", 1)[1]
    responses = [
        _get(guarded, "/", headers=auth),  # a page
        _get(guarded, "/api/overview", headers=auth),  # JSON
        _get(guarded, "/static/app.js", headers=auth),
        _get(guarded, "/api/requests.csv", headers=auth),  # a streamed export
        _get(guarded, "/search?limit=x", headers=auth),  # 400
        _get(guarded, "/no/such/page", headers=auth),  # 404
        _get(guarded, "/api/overview"),  # 401
        _get(guarded, "/api/overview", params={"token": TOKEN}),  # 303 with the cookie
        _get(guarded, "/api/overview", headers={"Host": f"rebind.example:{port}"}),  # 403
        _get(crashing, "/api/boom", headers=auth),  # 500
    ]
    assert [r.status_code for r in responses] == [200, 200, 200, 200, 400, 404, 401, 303, 403, 500]
    for r in responses:
        for name, value in SECURITY_HEADERS.items():
            assert r.headers.get(name) == value, (r.url, r.status_code, name)
