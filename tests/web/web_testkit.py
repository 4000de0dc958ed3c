"""Helpers of the web tests (a uniquely named module: `conftest` names collide)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostile import HostileTrace
from tracegen import GeneratedRequest

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

