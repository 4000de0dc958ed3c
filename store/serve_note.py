"""Where a running `tokentrace serve` answers for its database.

DuckDB lets one process open a database file, so while `serve` runs,
`tokentrace report --db` cannot read it and must be pointed at the server with
`--url`.  To say exactly which URL, `serve` leaves a small note beside the
file (`<db>.serve.json`: its pid, the web UI's URL, whether a token is needed,
and its OTLP/HTTP URL, where `import` can send a file instead) for as long as
it runs, with the ports it bound (`--web-port 0`: the one the OS chose).  A
note whose process is gone is ignored; `held` words what each command says.

Each note also carries an id of its own (`start`), because a pid does not say
which serve wrote it: a serve restarted in a container runs under the pid its
killed predecessor had (often 1).  A serve removes only the note it wrote, and
a note naming this process that it did not write is a predecessor's.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
from pathlib import Path
from typing import Any

logger = logging.getLogger("tokentrace")

#: The ids of the notes this process wrote and has not removed: its running serves'.
_written: set[str] = set()


def note_path(db: Path) -> Path:
    return db.with_name(db.name + ".serve.json")


def write_note(
    db: Path, web_url: str, token_required: bool, otlp_url: str | None = None
) -> str | None:
    """Leaves the note; gives its id for `remove_note`, None when it could not be
    written (that costs the hint, never the server)."""
    start = secrets.token_hex(8)
    note: dict[str, Any] = {"pid": os.getpid(), "web": web_url, "token": token_required}
    if otlp_url:
        note["otlp"] = otlp_url
    note["start"] = start
    try:
        note_path(db).write_text(json.dumps(note))
    except OSError as exc:
        logger.debug("tokentrace: no serve note beside %s: %s", db, exc)
        return None
    _written.add(start)
    return start


def remove_note(db: Path, start: str) -> None:
    """Removes the note that `write_note` gave the id `start`, and no other (another
    serve may have taken over since)."""
    _written.discard(start)
    try:
        if json.loads(note_path(db).read_text()).get("start") != start:
            return
    except (OSError, ValueError, AttributeError):
        return
    note_path(db).unlink(missing_ok=True)


def unclean_stop(db: Path) -> int | None:
    """Gives the pid of a serve of `db` that ended without removing its note (killed:
    `kill -9`, the OOM killer, a crash), None when the last one stopped cleanly."""
    try:
        note = json.loads(note_path(db).read_text())
        pid = int(note["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if _running(note, pid) else pid


def read_note(db: Path) -> dict[str, Any] | None:
    """Gives the note of a serve that is still running, else None: its `pid`, `web`
    URL, whether a `token` is needed, and its `otlp` (OTLP/HTTP) URL where the note
    names one (older serves' notes do not)."""
    try:
        note = json.loads(note_path(db).read_text())
        pid, web = int(note["pid"]), str(note["web"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _is_url(web) or not _running(note, pid):
        return None
    found = {"pid": pid, "web": web, "token": bool(note.get("token"))}
    if isinstance(note.get("otlp"), str) and _is_url(note["otlp"]):
        found["otlp"] = note["otlp"]
    return found


def _is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def _running(note: dict[str, Any], pid: int) -> bool:
    """Whether the serve that wrote `note` (naming `pid`) still runs."""
    start = note.get("start")
    if isinstance(start, str) and start in _written:
        return True  # a serve of this process
    # a note naming this process that it did not write is a predecessor's under
    # the same pid (a restarted container's): gone
    return pid != os.getpid() and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
