"""Helpers of the web tests (a uniquely named module: `conftest` names collide)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hostile import HostileTrace
from tracegen import GeneratedRequest
from tt_testkit import ThreadServer

from tokentrace.collector.settings import CollectorSettings
from tokentrace.web.app import create_web_app

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
#: The marks of a module of browser tests (its `browser` and `page` fixtures are in conftest.py).
BROWSER_MARKS = [
    pytest.mark.browser,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's /usr/bin/chromium"),
]


@dataclass
class WebServer:
    url: str
    db: Path
    requests: list[GeneratedRequest]


@dataclass
class HostileServer:
    url: str
    db: Path
    traces: list[HostileTrace]


def explorer(db: Path, api_token: str | None = None, host: str = "127.0.0.1") -> AbstractContextManager[str]:
    """Serves the explorer over `db` while the block runs and gives its URL (`host`: the
    address `serve` would bind, for its Host check)."""
    return serving(create_web_app(CollectorSettings(db=db, api_token=api_token, host=host)))


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serves the explorer `app` (from `create_web_app`) while the block runs; gives its URL."""
    server = ThreadServer(app)
    with server:
        try:
            yield server.url
        finally:
            state = server.server.config.app.state  # type: ignore[attr-defined]
            # wait for a report still computing: DuckDB refuses to close a connection it runs on
            state.reports.close(wait=True)
            state.db.close()
