"""The search form after a refused query, ranges that cannot match, times as typed, and the
user's TTFT card saying what part of the window it is over."""

from __future__ import annotations

import html
import re

import httpx
import pytest
from web_testkit import WebServer


def _value(page: str, name: str) -> str:
    found = re.search(f'<input name="{name}"[^>]*value="([^"]*)"', page)
    assert found is not None, name
    return html.unescape(found.group(1))


@pytest.mark.parametrize(
    "query,needle",
    [
        ({"min_e2e": "500", "max_e2e": "100"}, "min_e2e (500 ms) is more than max_e2e (100 ms): no request could match"),
        ({"min_ttft": "80.5", "max_ttft": "8"}, "min_ttft (80.5 ms) is more than max_ttft (8 ms): no request could match"),
    ],
)
def test_a_range_whose_min_is_over_its_max_is_a_400(web: WebServer, query: dict[str, str], needle: str) -> None:
    r = httpx.get(web.url + "/api/search", params=query, timeout=30)
    assert r.status_code == 400 and r.json()["error"] == needle
    page = httpx.get(web.url + "/search", params=query, timeout=30)
    assert page.status_code == 400 and html.escape(needle, quote=True) in page.text
    # an empty range of one value is a range all the same
    same = {k: "100" for k in query}
    assert httpx.get(web.url + "/api/search", params=same, timeout=30).status_code == 200


def test_a_refused_search_shows_its_form_as_typed_with_the_message_beside_it(web: WebServer) -> None:
    query = {"min_e2e": "fast", "max_e2e": "900", "start": "2026-01-01T00:00:10Z", "model": "qwen-7b",
             "bucket": "decode", "kept": "1", "sort": "e2e_ms", "order": "asc"}  # fmt: skip
    r = httpx.get(web.url + "/search", params=query, timeout=30)
    assert r.status_code == 400
    page = r.text
    assert 'id="search-error">min_e2e must be a number of milliseconds, not &#39;fast&#39;</p>' in page
    assert 'class="error-message"' not in page  # not the bare error page
    assert _value(page, "min_e2e") == "fast" and _value(page, "max_e2e") == "900"
    assert _value(page, "start") == "2026-01-01T00:00:10Z"
    assert '<option value="qwen-7b" selected>' in page and '<option value="decode" selected>' in page
    assert 'name="kept" value="1" checked' in page
    assert '<input type="hidden" name="sort" value="e2e_ms"><input type="hidden" name="order" value="asc">' in page
    assert "table class=\"grid results\"" not in page  # no results to show


def test_the_time_boxes_give_back_the_iso_time_typed(web: WebServer) -> None:
    start, end = "2026-01-01T00:00:10Z", "2026-01-01T00:00:30+00:00"
    for path in ("/", "/search", "/diagnosis"):
        page = httpx.get(web.url + path, params={"start": start, "end": end}, timeout=60).text
        assert _value(page, "start") == start and _value(page, "end") == end, path
    # the search's own links (sorting, paging) keep the time as typed too
    data = httpx.get(web.url + "/api/search", params={"start": start, "limit": "2"}, timeout=30).json()
    assert data["filters"]["start"] == start and data["next"]["start"] == start
    page = httpx.get(web.url + "/search", params={"start": start, "sort": "e2e_ms"}, timeout=30).text
    sort_link = re.search(r'<a class="sort[^"]*" href="([^"]*)">E2E</a>', page)
    assert sort_link is not None and "start=2026-01-01T00%3A00%3A10Z" in sort_link.group(1)


def test_the_users_ttft_card_says_how_many_requests_it_is_over(few_user_ttft: WebServer, web: WebServer) -> None:
    count = len(few_user_ttft.requests)
    page = httpx.get(few_user_ttft.url + "/", timeout=60).text
    assert f'id="ttft-user-over">over 1 of {count:,} requests: those a client span measured</small>' in page
    assert httpx.get(few_user_ttft.url + "/api/overview", timeout=60).json()["ttft_client_requests"] == 1
    # where every request's client span measured it, the card needs no such note
    assert 'id="ttft-user-over"' not in httpx.get(web.url + "/", timeout=60).text
