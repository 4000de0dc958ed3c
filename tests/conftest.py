"""Fixtures and run settings shared by every test folder (helpers live in `tt_testkit`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tt_testkit import ServeProcess, machine_share, start_serve

#: Fixtures that start a real process or browser: a test that uses one is `slow`.
SLOW_FIXTURES = frozenset({"serve", "serve_sdk", "browser", "page"})


def pytest_configure(config: pytest.Config) -> None:
    # pytest caches the test modules it compiles with rewritten asserts only where bytecode
    # is written; with PYTHONDONTWRITEBYTECODE (set on these machines) every collection,
    # once per xdist worker, compiled them all again (~5 s).  __pycache__ is git-ignored.
    sys.dont_write_bytecode = False
    # Hypothesis reports a failing example through libcst, whose import warns (mypy_extensions'
    # TypedDict): under `filterwarnings = error` that warning was an INTERNALERROR that ended
    # the whole run, so one falsified example (or one over its deadline) cost every later test
    config.addinivalue_line(
        "filterwarnings", "ignore:mypy_extensions.TypedDict is deprecated:DeprecationWarning"
    )


#: The most xdist workers `-n auto` starts: each collects the whole suite and imports torch.
MAX_WORKERS = 16


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Gives 0 (run in this process) when the command names only test files or test ids,
    else two workers per CPU.

    One file runs sooner without starting workers, and prints as plain pytest does.  Most
    tests wait (a server's start, a subprocess, a timeout): on 2 CPUs, 2 workers kept 1.2 of
    them busy on average and 4 workers 1.7, and the collector's tests took 58 s instead of 78."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist reads it
    args = [a for a in config.args if not a.startswith("-")]
    if args and all("::" in a or a.endswith(".py") for a in args):
        return 0
    return min(2 * len(os.sched_getaffinity(0)), MAX_WORKERS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    # outermost (tryfirst), so the wait for the machine is not counted in a test's timeout
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return (yield)  # one process: nothing runs beside a test
    # each worker's basetemp is <the run's basetemp>/<worker id>: the parent is this run's own
    run_dir = Path(item.config.option.basetemp).parent
    with machine_share(run_dir, alone=item.get_closest_marker("alone") is not None):
        return (yield)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = start_serve(tmp_path, "--grace-s", "0.2")
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[Any]:
    """A real PostgreSQL server of this test process (tests/tt_postgres.py); skips where
    PostgreSQL is not installed (`.ci/run` installs it)."""
    from tt_postgres import PostgresServer, bin_dir

    if bin_dir() is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql): the lake's catalog")
    server = PostgresServer()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture()
def lake(postgres: Any, tmp_path: Path) -> tuple[str, str]:
    """A new, empty lake: (`--lake` URI, `--lake-data` directory)."""
    return postgres.new_lake(tmp_path / "lake-data")
