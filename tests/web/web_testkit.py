"""Helpers of the web tests (a uniquely named module: `conftest` names collide)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tracegen import GeneratedRequest
from tt_testkit import ThreadServer

from tokentrace.collector.settings import CollectorSettings
from tokentrace.web.app import create_web_app


@dataclass
class WebServer:
    url: str
    db: Path
    requests: list[GeneratedRequest]


def serve_app(db: Path, api_token: str | None = None) -> tuple[ThreadServer, str]:
    server = ThreadServer(create_web_app(CollectorSettings(db=db, api_token=api_token)))
    return server, server.url
