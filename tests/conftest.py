"""Fixtures shared by every test folder (helpers live in `tt_testkit`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tt_testkit import ServeProcess, start_serve


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path, "--grace-s", "0.2")
    try:
        yield server
    finally:
        server.stop()
