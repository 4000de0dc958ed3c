"""The `tokentrace` command line: `-v` anywhere; misuse and bad files in one clear line.

CLI misuse and bad files: one clear line on stderr and a non-zero exit, never a
traceback (the commands run as a user runs them, in a subprocess).

`-v` before or after the command (`tokentrace serve -v` was refused: unrecognized arguments).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from tt_testkit import free_port

from tokentrace.cli import build_parser


def _cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tokentrace", *args],
        capture_output=True, text=True, timeout=120, cwd=cwd,
    )  # fmt: skip


def _one_clear_line(done: subprocess.CompletedProcess[str], says: str) -> None:
    assert done.returncode != 0, done.stdout
    err = done.stderr.strip()
    assert "Traceback" not in err and "nanobind" not in err, err
    assert len(err.splitlines()) == 1, err
    assert says in err, err


def _export_line(service: str) -> str:
    from otlp_traces import request_trace, to_json

    return json.dumps(to_json(request_trace(service=service)))


@pytest.mark.slow
def test_report_on_a_duckdb_file_of_another_program(tmp_path: Path) -> None:
    db = tmp_path / "other.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE t (x INTEGER)")
    for command in ("report", "requests"):
        _one_clear_line(_cli(command, "--db", str(db)), "is not a tokentrace database")


@pytest.mark.slow
def test_report_on_an_empty_file(tmp_path: Path) -> None:
    db = tmp_path / "empty.duckdb"
    db.touch()
    _one_clear_line(_cli("report", "--db", str(db)), "is empty: not a tokentrace database")


def test_until_before_since_is_an_error(tmp_path: Path) -> None:
    done = _cli("report", "--db", str(tmp_path / "x.duckdb"), "--since", "2027-01-01", "--until", "2026-01-01")
    _one_clear_line(done, "--until 2026-01-01 is not after --since 2027-01-01")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "content", "says"),
    [
        ("empty.json", b"", "the file is empty"),
        ("binary.json", b"\xff\xfe{", "not UTF-8 text"),
        ("notes.txt", b"hello world\n", "neither OTLP/JSON nor OTLP protobuf"),
        ("half.jsonl", None, "line 2, column 20: invalid JSON"),
    ],
)
def test_import_of_a_bad_file_says_what_and_where(
    tmp_path: Path, name: str, content: bytes | None, says: str
) -> None:
    bad = tmp_path / name
    bad.write_bytes(
        content if content is not None else (_export_line("x") + '\n{"resourceSpans": [\n').encode()
    )
    _one_clear_line(_cli("import", "--db", str(tmp_path / "i.duckdb"), str(bad)), says)


@pytest.mark.slow
def test_import_stopped_by_a_bad_file_says_what_was_imported(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text(_export_line("good"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"resourceSpans": [')
    db = tmp_path / "i.duckdb"
    _one_clear_line(_cli("import", "--db", str(db), str(good), str(bad)), "the 1 file(s) before it were imported")
    with duckdb.connect(str(db), read_only=True) as conn:  # and they are there
        assert conn.execute("SELECT service FROM requests").fetchall() == [("good",)]


@pytest.mark.slow
def test_serve_on_a_port_in_use_names_it(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        done = _cli(
            "serve", "--db", str(tmp_path / "s.duckdb"), "--http-port", port,
            "--grpc-port", str(free_port()), "--web-port", str(free_port()),
        )  # fmt: skip
    _one_clear_line(done, f"cannot serve OTLP/HTTP on 127.0.0.1:{port}: Address already in use")


@pytest.mark.slow
def test_serve_with_a_nan_setting(tmp_path: Path) -> None:
    done = _cli("serve", "--db", str(tmp_path / "s.duckdb"), "--grace-s", "nan")
    _one_clear_line(done, "grace_s must be a finite number")


def test_an_unexpected_error_is_one_line(monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from tokentrace import cli

    def bug(args: object) -> int:
        raise KeyError("model")

    monkeypatch.setitem(cli.COMMANDS, "report", bug)
    assert cli.main(["report"]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip()
    assert err == "tokentrace report: unexpected KeyError: 'model' (run `tokentrace -v ...` for the traceback)"


@pytest.mark.slow
@pytest.mark.parametrize("command", ["import", "serve"])
def test_writing_into_a_duckdb_file_of_another_program_is_refused(
    tmp_path: Path, command: str
) -> None:
    # tokentrace must not add its tables to somebody else's database
    db = tmp_path / "other.duckdb"
    with duckdb.connect(str(db)) as conn:
        conn.execute("CREATE TABLE orders (x INTEGER)")
    if command == "import":
        export = tmp_path / "spans.jsonl"
        export.write_text(_export_line("svc") + "\n")
        done = _cli("import", "--db", str(db), str(export))
    else:
        done = _cli("serve", "--db", str(db), "--http-port", str(free_port()),
                    "--grpc-port", str(free_port()), "--web-port", str(free_port()))  # fmt: skip
    _one_clear_line(done, "is another program's DuckDB database (tables orders)")
    with duckdb.connect(str(db), read_only=True) as conn:
        tables = conn.execute("SELECT table_name FROM information_schema.tables").fetchall()
    assert tables == [("orders",)]


@pytest.mark.parametrize(
    ("host", "token", "warned"),
    [("127.0.0.1", None, False), ("localhost", None, False), ("::1", None, False),
     ("0.0.0.0", None, True), ("10.1.2.3", None, True), ("0.0.0.0", "s3cret", False)],
)  # fmt: skip
def test_serve_warns_when_it_shows_traces_to_the_network_without_a_token(
    host: str, token: str | None, warned: bool
) -> None:
    from tokentrace.cli import exposure_warning

    warning = exposure_warning(host, token)
    assert (warning is not None) == warned
    if warning:
        assert f"--host {host}" in warning and "--api-token" in warning


@pytest.mark.parametrize("command", [["serve"], ["import", "f.json"], ["report"], ["requests"], ["demo"]])
def test_verbose_before_or_after_the_command(command: list[str]) -> None:
    parse = build_parser().parse_args
    assert parse([*command, "-v"]).verbose is True
    assert parse(["-v", *command]).verbose is True  # the one before the command is kept
    assert parse(command).verbose is False
