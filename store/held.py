"""Who holds the database file, and what to run instead.

DuckDB lets one process open a database file (one writer, or readers only).
When another process has it, DuckDB says `Could not set lock on file …:
Conflicting lock is held in <program> (PID n)`.  Every command that opens the
store says instead who holds it and what to do: a running `tokentrace serve`
(found by the note it leaves beside the file, `serve_note`) is asked
(`report`/`requests --url`), sent the file (`import`: its OTLP/HTTP URL), or
named (a second `serve`); a `tokentrace import` (found by its command line)
is waited for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokentrace.store.errors import StoreError
from tokentrace.store.serve_note import read_note

#: DuckDB's words for a file another process has open, and that process's id.
_LOCKED = re.compile(r"could not set lock|conflicting lock", re.IGNORECASE)
_HOLDER_PID = re.compile(r"\(PID (\d+)\)")
#: Where `serve` listens unless told otherwise: the hint for a holder without a note.
DEFAULT_WEB_URL = "http://127.0.0.1:8600"
DEFAULT_OTLP_HTTP_URL = "http://127.0.0.1:4318"
#: `import`'s advice: the file, as an OTLP exporter would send it.
_CURL = "curl -H 'Content-Type: application/x-protobuf' --data-binary @FILE {otlp}/v1/traces"


def is_held(duckdb_said: str) -> bool:
    """Whether DuckDB's error says another process has the file open."""
    return bool(_LOCKED.search(duckdb_said))


class DatabaseHeld(StoreError):
    """Another process has the database open: says who, and what `command` can do instead."""

    def __init__(self, db: Path, duckdb_said: str, command: str | None = None) -> None:
        self.db = db
        self.duckdb_said = duckdb_said
        self.command = command
        super().__init__(held_message(db, command, duckdb_said))

    def for_command(self, command: str) -> DatabaseHeld:
        """Gives the same error, with the advice for `command` (`serve`, `import`, `report`…)."""
        return DatabaseHeld(self.db, self.duckdb_said, command)


@dataclass(frozen=True)
class _Holder:
    pid: int | None
    #: the tokentrace command it runs (`serve`, `import`…), None for another program
    command: str | None
    #: a running serve's note (`serve_note.read_note`), None without one
    note: dict[str, Any] | None


def _holder(db: Path, duckdb_said: str) -> _Holder:
    note = read_note(db)
    if note is not None:
        return _Holder(note["pid"], "serve", note)
    found = _HOLDER_PID.search(duckdb_said)
    pid = int(found.group(1)) if found else None
    return _Holder(pid, tokentrace_command(pid) if pid else None, None)


def tokentrace_command(pid: int) -> str | None:
    """Gives the tokentrace command process `pid` runs (`import` for `tokentrace import …`
    or `python -m tokentrace import …`), None for another program or where /proc is not."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return command_of([part.decode(errors="replace") for part in raw.split(b"\0") if part])


def command_of(argv: list[str]) -> str | None:
    """Gives the tokentrace command of a command line (`import`, `serve`…), None for
    another program's."""
    for i, part in enumerate(argv):
        if Path(part).name in ("tokentrace", "tokentrace.cli", "tokentrace.__main__"):
            rest = [arg for arg in argv[i + 1 :] if not arg.startswith("-")]
            return rest[0] if rest else None
    return None


def held_message(db: Path, command: str | None, duckdb_said: str) -> str:
    """Gives the one line a command says when another process holds `db`: who holds it
    (a running serve's pid and URLs, an import, another program's pid) and what
    `command` can do instead; no DuckDB wording, no traceback."""
    holder = _holder(db, duckdb_said)
    pid = f" (pid {holder.pid})" if holder.pid else ""
    if holder.command == "import":
        return (
            f"{db} is held by `tokentrace import`{pid}, and DuckDB lets one process open it: "
            "an import is writing it; retry when it ends"
        )
    note = holder.note
    if note is not None:
        web, otlp = note["web"], note.get("otlp") or DEFAULT_OTLP_HTTP_URL
        if command == "serve":
            return (
                f"{db} is already served by `tokentrace serve`{pid} at {web}: send traces to "
                f"its OTLP/HTTP endpoint {otlp}, or give this serve another --db"
            )
        lead = f"{db} is held by a running `tokentrace serve`{pid}, and DuckDB lets one process open it"
        if command is None:
            return f"{lead} (web UI {web}, OTLP/HTTP {otlp})"
        return f"{lead}: {_instead(command, web, otlp, ' --token TOKEN' if note['token'] else '')}"
    who = f"`tokentrace {holder.command}`" if holder.command else "another process"
    lead = f"{db} is held by {who}{pid}, and DuckDB lets one process open it"
    if command is None:
        return lead
    if command == "serve":
        return f"{lead}: stop it first, or give this serve another --db"
    # no note: an older serve, or another program; serve's default address as the example
    maybe = "" if holder.command == "serve" else "if that is `tokentrace serve`, "
    instead = _instead(command, DEFAULT_WEB_URL, DEFAULT_OTLP_HTTP_URL, "", example=True)
    return f"{lead}: {maybe}{instead}"


def _instead(command: str, web: str, otlp: str, token: str, example: bool = False) -> str:
    """Gives what `command` can do instead of opening a database a serve holds: send
    the file to its OTLP/HTTP endpoint (`import`), or ask it (`report`, `requests`)."""
    eg = "e.g. " if example else ""
    if command == "import":
        return (
            f"send the file to the server instead, {eg}`{_CURL.format(otlp=otlp)}` "
            "(Content-Type: application/json for an OTLP/JSON file)"
        )
    return f"ask the server instead, {eg}`tokentrace {command} --url {web}{token}`"
