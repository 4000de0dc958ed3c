"""Fixtures of the web tests: one generated database and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tracegen import GeneratedRequest, generate
from web_testkit import WebServer, serve_app


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[GeneratedRequest]]:
    return generate(tmp_path_factory.mktemp("webdb"))


@pytest.fixture(scope="session")
def web(generated: tuple[Path, list[GeneratedRequest]]) -> Iterator[WebServer]:
    db, requests = generated
    server, url = serve_app(db)
    with server:
        yield WebServer(url, db, requests)
        server.server.config.app.state.reports.close()  # type: ignore[attr-defined]
        server.server.config.app.state.db.close()  # type: ignore[attr-defined]
