"""Who holds a database: a tokentrace command is told apart from another program by its
command line (`/proc/<pid>/cmdline`), however it was started."""

from __future__ import annotations

import pytest

from tokentrace.store.held import command_of


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["/usr/bin/python3", "-m", "tokentrace", "import", "a.pb", "--db", "t.duckdb"], "import"),
        (["/venv/bin/python3.11", "/venv/bin/tokentrace", "-v", "import", "a.pb"], "import"),
        (["tokentrace", "serve", "--db", "t.duckdb"], "serve"),
        (["python", "-m", "tokentrace.cli", "demo", "--quick"], "demo"),
        (["python", "-c", "import duckdb; duckdb.connect('t.duckdb')"], None),
        (["python", "my_tokentrace_tool.py", "import"], None),
        (["tokentrace"], None),
        ([], None),
    ],
)
def test_the_command_a_holder_runs(argv: list[str], command: str | None) -> None:
    assert command_of(argv) == command
