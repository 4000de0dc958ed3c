"""Fixtures of the web tests: one generated database and a real uvicorn server on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import uvicorn
from tokentrace.collector.settings import CollectorSettings
from tokentrace.web.app import create_web_app
from tracegen import GeneratedRequest, generate


def free_port() -> int:
    """Gives a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class WebServer:
    url: str
    db: Path
    requests: list[GeneratedRequest]


class _ThreadServer:
    """Runs uvicorn in a daemon thread; stopped (and joined) by the fixture."""

    def __init__(self, app: object, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _ThreadServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("web server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="session")
def generated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[GeneratedRequest]]:
    return generate(tmp_path_factory.mktemp("webdb"))


def serve_app(db: Path, api_token: str | None = None) -> tuple[_ThreadServer, str]:
    port = free_port()
    app = create_web_app(CollectorSettings(db=db, api_token=api_token))
    return _ThreadServer(app, port), f"http://127.0.0.1:{port}"


@pytest.fixture(scope="session")
def web(generated: tuple[Path, list[GeneratedRequest]]) -> Iterator[WebServer]:
    db, requests = generated
    server, url = serve_app(db)
    with server:
        yield WebServer(url, db, requests)
        server.server.config.app.state.reports.close()  # type: ignore[attr-defined]
        server.server.config.app.state.db.close()  # type: ignore[attr-defined]
