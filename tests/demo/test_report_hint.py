"""`tokentrace report` right after `tokentrace demo`: no ./tokentrace.duckdb, but the
demo's ./tokentrace-demo.duckdb is there, and the error says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokentrace.cli import EXIT_ERROR, main
from tokentrace.store.connection import open_db
from tokentrace.store.location import DB_ENV

HINT = "(the demo's data is in tokentrace-demo.duckdb: --db tokentrace-demo.duckdb)"


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(DB_ENV, raising=False)
    return tmp_path


def _demo_ran(workdir: Path) -> None:
    open_db(workdir / "tokentrace-demo.duckdb").close()


@pytest.mark.parametrize("command", ["report", "requests"])
def test_a_missing_database_names_the_demos_when_it_is_there(
    workdir: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _demo_ran(workdir)
    assert main([command]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"tokentrace {command}: no tokentrace database at tokentrace.duckdb"), err
    assert err.rstrip().endswith(HINT), err
    assert not (workdir / "tokentrace.duckdb").exists()


def test_no_demo_no_hint(workdir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report"]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "no tokentrace database at tokentrace.duckdb" in err and "demo" not in err, err


def test_the_hint_leads_to_the_demos_data(
    workdir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _demo_ran(workdir)
    assert main(["report", "--db", "tokentrace-demo.duckdb", "--format", "json"]) == 0
    assert '"findings"' in capsys.readouterr().out
