"""Fixtures shared by every test folder (helpers live in `tt_testkit`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from tt_testkit import ServeProcess, start_serve


def pytest_configure(config: pytest.Config) -> None:
    # Hypothesis reports a failing example through libcst, whose import warns (mypy_extensions'
    # TypedDict): under `filterwarnings = error` that warning was an INTERNALERROR that ended
    # the whole run, so one falsified example (or one over its deadline) cost every later test
    config.addinivalue_line(
        "filterwarnings", "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
    )


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path, "--grace-s", "0.2")
    try:
        yield server
    finally:
        server.stop()
