"""Helpers of the web tests (a uniquely named module: `conftest` names collide)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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


def serve_app(db: Path, api_token: str | None = None, host: str = "127.0.0.1") -> tuple[ThreadServer, str]:
    """Gives a server of the explorer over `db` (`host`: the address `serve` would bind, for its Host check)."""
    server = ThreadServer(create_web_app(CollectorSettings(db=db, api_token=api_token, host=host)))
    return server, server.url
