"""Helpers of the web tests (a uniquely named module: `conftest` names collide)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import pytest
from hostile import HostileTrace
from tracegen import GeneratedRequest
from tt_testkit import explorer

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


#: The one-slice database's requests: ONE_SLICE_COUNT of them, ONE_SLICE_STEP_NS apart.
ONE_SLICE_COUNT = 5
ONE_SLICE_STEP_NS = 80_000_000
#: Spans added to the many-spans database's first kept trace (the reviewer's agent trace had 5,000).
MANY_SPANS = 4_000


def edited_copy(
    generated: tuple[Path, list[GeneratedRequest]],
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    *statements: tuple[str, list[Any]],
) -> Iterator[WebServer]:
    """Serves a copy of the generated database with `statements` (SQL, parameters) run on it."""
    src, requests = generated
    db = tmp_path_factory.mktemp(name) / "web.duckdb"
    shutil.copy(src, db)
    conn = duckdb.connect(str(db))
    try:
        for sql, params in statements:
            conn.execute(sql, params)
    finally:
        conn.close()
    with explorer(db) as url:
        yield WebServer(url, db, requests)
