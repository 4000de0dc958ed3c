"""A flood of distinct diagnosis requests neither queues without end nor starves the explorer.

Reports are computed one at a time; at most MAX_PENDING distinct ones are pending (the
running one included), and a request for another gets 503 with Retry-After at once.
Waiting for a report holds no thread of the server's pool, so /healthz and every other
page still answer while requests wait. The report computation is held on an event here,
so nothing depends on how fast it is; no wall time is asserted.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from tracegen import BASE_NS, GeneratedRequest
from tt_testkit import serving

from tokentrace.collector.settings import CollectorSettings
from tokentrace.web import _report_cache
from tokentrace.web.app import create_web_app

pytestmark = pytest.mark.slow

#: How many distinct reports may be pending at once (one computing, four queued).
PENDING = 5
#: A generous bound on waiting for the server to take in what the test sent.
SETTLE_S = 60.0


@dataclass
class Blocked:
    """An explorer whose report computations wait for `release`."""

    url: str
    app: Any
    release: threading.Event
    arrived: dict[str, int] = field(default_factory=dict)
    threads: list[threading.Thread] = field(default_factory=list)
    answers: list[int] = field(default_factory=list)

    def pending(self) -> int:
        return len(self.app.state.reports._pending)

    def send(self, path: str) -> None:
        """GETs `path` from a thread of its own, keeping its status in `answers`."""

        def get() -> None:
            try:
                self.answers.append(httpx.get(self.url + path, timeout=300).status_code)
            except httpx.HTTPError:
                self.answers.append(-1)

        t = threading.Thread(target=get, daemon=True)
        t.start()
        self.threads.append(t)

    def finish(self) -> list[int]:
        self.release.set()
        for t in self.threads:
            t.join(300)
        return self.answers


def _until(what: str, done: Callable[[], bool]) -> None:
    deadline = time.monotonic() + SETTLE_S
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"the server never got to: {what}")
        time.sleep(0.02)


def _start(i: int) -> str:
    """A window start of its own: each is a distinct diagnosis."""
    return str(BASE_NS - 1000 - i)


@pytest.fixture
def blocked(
    generated: tuple[Path, list[GeneratedRequest]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Blocked]:
    release = threading.Event()
    real = _report_cache.build_report

    def held(cur: Any, filters: Any) -> Any:
        release.wait(300)
        return real(cur, filters)

    monkeypatch.setattr(_report_cache, "build_report", held)
    db = tmp_path / "web.duckdb"
    shutil.copy(generated[0], db)
    app = create_web_app(CollectorSettings(db=db))
    arrived: dict[str, int] = {}

    @app.middleware("http")
    async def count_arrivals(request: Any, call_next: Any) -> Any:  # outermost: before any thread
        arrived[request.url.path] = arrived.get(request.url.path, 0) + 1
        return await call_next(request)

    with serving(app) as url:
        b = Blocked(url, app, release, arrived)
        try:
            yield b
        finally:
            b.finish()


def test_a_distinct_diagnosis_beyond_the_bound_gets_503_with_retry_after(blocked: Blocked) -> None:
    for i in range(PENDING):
        blocked.send(f"/api/diagnosis?start={_start(i)}")
    _until(f"{PENDING} reports pending", lambda: blocked.pending() == PENDING)

    r = httpx.get(f"{blocked.url}/api/diagnosis?start={_start(PENDING)}", timeout=30)
    assert r.status_code == 503
    assert int(r.headers["Retry-After"]) > 0
    assert "busy computing other diagnoses" in r.json()["error"]
    page = httpx.get(f"{blocked.url}/diagnosis?start={_start(PENDING + 1)}", timeout=30)
    assert page.status_code == 503 and "Retry-After" in page.headers
    assert "busy computing other diagnoses" in page.text and "Content-Security-Policy" in page.headers
    assert blocked.pending() == PENDING, "nothing more was queued"

    # the overview does not fail: it shows its cheap headline and says so in its JSON
    overview = httpx.get(f"{blocked.url}/api/overview?start={_start(PENDING + 2)}", timeout=30)
    assert overview.status_code == 200
    assert overview.json()["report_pending"] and overview.json()["report_busy"]
    page = httpx.get(f"{blocked.url}/?start={_start(PENDING + 2)}", timeout=30)
    assert page.status_code == 200 and "busy computing other diagnoses" in page.text

    # a diagnosis already pending is waited for, not refused
    blocked.send(f"/api/diagnosis?start={_start(0)}")
    _until("the repeated request arrived", lambda: blocked.arrived.get("/api/diagnosis", 0) == PENDING + 2)
    assert blocked.finish() == [200] * (PENDING + 1)


def test_healthz_and_other_pages_answer_while_many_requests_wait_for_reports(blocked: Blocked) -> None:
    flood = 60  # more than the server's thread pool (40) holds
    for i in range(flood):
        if i % 10 == 9:  # a complaint filter waits for its view's report too
            blocked.send(f"/api/search?limit=1&complaint=stutter&start={_start(i % PENDING)}")
        else:
            blocked.send(f"/api/diagnosis?start={_start(i % PENDING)}")
    _until(
        f"all {flood} requests arrived",
        lambda: blocked.arrived.get("/api/diagnosis", 0) + blocked.arrived.get("/api/search", 0) == flood,
    )
    assert blocked.pending() == PENDING

    health = httpx.get(f"{blocked.url}/healthz", timeout=30)
    assert health.status_code == 200 and health.json() == {"status": "ok"}
    assert httpx.get(f"{blocked.url}/api/search?limit=1", timeout=30).status_code == 200
    assert httpx.get(f"{blocked.url}/search?limit=1", timeout=30).status_code == 200
    assert httpx.get(f"{blocked.url}/api/overview", timeout=30).status_code == 200

    assert blocked.finish() == [200] * flood
