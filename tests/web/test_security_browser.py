"""Headless Chromium against hostile span data, the Content-Security-Policy and DNS rebinding.

Hostile pages load with the CSP bypassed, so only escaping stands between a payload
and the page: an init script records any script that ran. The pages of ordinary
data load with it, where anything of ours the policy blocked shows as a violation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hostile import PAYLOADS
from web_testkit import BROWSER_MARKS, CHROMIUM, CHROMIUM_ARGS, HostileServer, WebServer

from tokentrace.web._format import MAX_SHOWN_CHARS, clip_note

pytestmark = BROWSER_MARKS

#: Records what a payload would do if it ran (alert & co.) and every CSP violation.
RECORDER = """
window.__ran = [];
for (const name of ['alert', 'confirm', 'prompt', 'print', 'open']) {
  window[name] = (...args) => { window.__ran.push(name + '(' + args.join(',') + ')'); };
}
document.addEventListener('securitypolicyviolation',
  e => window.__ran.push('csp ' + e.violatedDirective + ' ' + e.blockedURI + ' ' + e.sample));
"""
#: Elements no page of ours has: if one shows up, a payload became markup.
INJECTED = "img[src=x], svg[onload], #injected, script:not([src]):not([type='application/json']), [onerror], [onload]"


def _recording_page(browser: Any, bypass_csp: bool) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, bypass_csp=bypass_csp)
    context.add_init_script(RECORDER)
    page = context.new_page()
    page.js_errors = []
    page.on("pageerror", lambda e: page.js_errors.append(str(e)))
    page.on("dialog", lambda d: (page.js_errors.append("dialog " + d.message), d.dismiss()))
    try:
        yield page
    finally:
        context.close()


@pytest.fixture
def recording(browser: Any) -> Iterator[Any]:
    """A page without the CSP: only escaping stands between a payload and the page."""
    yield from _recording_page(browser, bypass_csp=True)


def _nothing_ran(page: Any) -> None:
    assert page.evaluate("window.__ran") == [], page.url
    assert page.locator(INJECTED).count() == 0, page.url
    assert page.js_errors == [], page.url
    # every link stays on the site: no javascript: or other-site URL came from the data
    hrefs = page.evaluate("[...document.querySelectorAll('[href]')].map(a => a.href)")
    origin = page.evaluate("location.origin")
    assert all(h.startswith(origin + "/") for h in hrefs), [h for h in hrefs if not h.startswith(origin + "/")]


def _shown(p: str, attribute: bool = False) -> str:
    # the HTML parser drops a NUL from text and makes it U+FFFD in an attribute
    return p.replace("\x00", "\ufffd" if attribute else "")


def _read(p: str) -> str:
    """Gives how a page's text reads `p`: a value over MAX_SHOWN_CHARS is cut, and a note follows."""
    if len(p) <= MAX_SHOWN_CHARS:
        return _shown(p)
    return _shown(p[:MAX_SHOWN_CHARS]) + clip_note(len(p))


def _titled(p: str, most: int = 200) -> str:
    """Gives how a `title` reads `p`, cut at `most` characters (web/_format.py cut)."""
    return _shown(p if len(p) <= most else p[:most] + "…", attribute=True)


def test_hostile_traces_show_their_strings_as_text(hostile: HostileServer, recording: Any) -> None:
    page = recording
    for t in hostile.traces:
        assert page.goto(f"{hostile.url}/trace/{t.trace_id}").status == 200
        for row in page.locator(".wf-row").all():
            row.click()  # every detail panel open: attributes, events, links, resource in the DOM
        for details in page.locator("details").all():
            details.evaluate("d => d.open = true")
        page.wait_for_timeout(50)
        _nothing_ran(page)
        # the HTML parser drops a NUL from the server's text; the details app.js builds keep it as text
        text = page.locator("main").inner_text().replace("\x00", "")
        p = _read(t.payload)
        # service, span name, model, tenant, class, request id, attribute keys and values, event name,
        # status message, resource, link attributes: the payload reads as itself wherever it is shown
        # (cut, with a note saying how long it is, past MAX_SHOWN_CHARS)
        assert text.count(p) >= 20, (t.payload_name, text.count(p))
        assert _read(t.request_id) in text
        # the request's header names where it ran: each value as text after its name
        where = page.locator("section.request p.where").first.inner_text()
        assert where == f"service {p} · environment {p} · instance {p}", (t.payload_name, where[:200])
        titles = page.evaluate("[...document.querySelectorAll('a.shared-link')].map(a => a.title)")
        others = [o for o in hostile.traces if o is not t]
        assert len(titles) == len(others)
        assert {_titled(o.payload) for o in others} <= {title.split(" · ")[0] for title in titles}


@pytest.mark.parametrize("path", ["/", "/search", "/search?sort=model&order=asc", "/diagnosis"])
def test_hostile_pages_list_the_strings_as_text(hostile: HostileServer, recording: Any, path: str) -> None:
    page = recording
    assert page.goto(hostile.url + path).status == 200
    _nothing_ran(page)
    options = page.evaluate("[...document.querySelectorAll('select[name=model] option')].map(o => o.value)")
    offered = {_shown(p, attribute=True) for n, p in PAYLOADS.items() if n != "long"}
    assert offered <= set(options)
    # a value longer than a filter takes is not offered: choosing it would be a 400
    assert not any(len(o) > 1_000 for o in options)
    if path.startswith("/search"):
        text = page.locator("table.results").inner_text()
        assert all(_read(p) in text for p in PAYLOADS.values())
    series = page.evaluate("(() => { const el = document.getElementById('series'); return el && JSON.parse(el.textContent); })()")
    assert path != "/" or series["t"], "the overview's chart data must parse"


def test_hostile_filters_and_error_pages(hostile: HostileServer, recording: Any) -> None:
    page = recording
    for name, p in PAYLOADS.items():
        if name == "long":
            continue  # over the 1,000 characters a filter takes: a 400, below
        for key in ("model", "tenant", "service"):
            assert page.goto(f"{hostile.url}/search?{key}={_url(p)}").status == 200
            _nothing_ran(page)
            assert page.locator(f"select[name={key}] option:checked").get_attribute("value") == _shown(p, attribute=True)
        for path, status in ((f"/search?window={_url(p)}", 400), (f"/trace?id={_url(p)}", 400),
                             (f"/api-less/{_url(p)}", 404)):  # fmt: skip
            assert page.goto(hostile.url + path).status == status, path
            _nothing_ran(page)
            # the search page refuses it beside its form; the others on the error page
            assert page.locator(".error-message, #search-error").count() == 1
    assert page.goto(f"{hostile.url}/search?model={_url(PAYLOADS['long'])}").status == 400
    _nothing_ran(page)


def _url(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


def test_every_page_keeps_to_the_content_security_policy(web: WebServer, browser: Any) -> None:
    """The policy fits the pages' own scripts and styles: nothing of ours is blocked."""
    tid = web.requests[0].trace_id
    for page in _recording_page(browser, bypass_csp=False):
        for path in ("/", "/search", "/diagnosis", f"/trace/{tid}", "/no/such/page"):
            page.goto(web.url + path)
            if path == "/":
                page.wait_for_selector(".uplot")
                assert page.locator(".uplot").count() == 6
            if path.startswith("/trace/"):
                page.locator(".wf-row").first.click()
                assert page.locator(".wf-detail:visible").count() == 1  # app.js ran
            assert page.evaluate("window.__ran") == [], path
            assert page.js_errors == [], path


def test_a_page_of_another_name_cannot_read_the_api(web: WebServer, browser: Any) -> None:
    """DNS rebinding for real: Chromium resolves rebind.test to 127.0.0.1, as an attacker's DNS would."""
    port = web.url.rsplit(":", 1)[1]
    args = [*CHROMIUM_ARGS, "--host-resolver-rules=MAP rebind.test 127.0.0.1"]
    rebound = browser.browser_type.launch(executable_path=CHROMIUM, args=args)
    try:
        page = rebound.new_page()
        response = page.goto(f"http://rebind.test:{port}/api/overview")
        assert response.status == 403 and "DNS rebinding" in page.inner_text("body")
        # the attacker's page asks the API same-origin, as a rebound page would
        assert page.evaluate("fetch('/api/search').then(r => r.status)") == 403
        assert page.goto(f"http://localhost:{port}/api/overview").status == 200
    finally:
        rebound.close()
