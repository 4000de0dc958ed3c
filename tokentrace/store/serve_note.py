"""Where a running `tokentrace serve` answers for its database.

DuckDB lets one process open a database file, so while `serve` runs,
`tokentrace report --db` cannot read it and must be pointed at the server with
`--url`.  To say exactly which URL, `serve` leaves a small note beside the
file (`<db>.serve.json`: its pid, the web UI's URL, whether a token is needed)
for as long as it runs.  A note whose process is gone is ignored.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger("tokentrace")


def note_path(db: Path) -> Path:
    return db.with_name(db.name + ".serve.json")


def write_note(db: Path, web_url: str, token_required: bool) -> None:
    """Leaves the note; a failure to write it costs the hint, never the server."""
    try:
        note_path(db).write_text(
            json.dumps({"pid": os.getpid(), "web": web_url, "token": token_required})
        )
    except OSError as exc:
        logger.debug("tokentrace: no serve note beside %s: %s", db, exc)


def remove_note(db: Path) -> None:
    """Removes the note if it is this process's (another serve may have taken over)."""
    note = read_note(db)
    if note is not None and note["pid"] == os.getpid():
        note_path(db).unlink(missing_ok=True)


def unclean_stop(db: Path) -> int | None:
    """Gives the pid of a serve of `db` that ended without removing its note (killed:
    `kill -9`, the OOM killer, a crash), None when the last one stopped cleanly."""
    try:
        pid = int(json.loads(note_path(db).read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return None if pid == os.getpid() or _alive(pid) else pid


def read_note(db: Path) -> dict[str, Any] | None:
    """Gives the note of a serve that is still running, else None."""
    try:
        note = json.loads(note_path(db).read_text())
        pid, web = int(note["pid"]), str(note["web"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not web.startswith(("http://", "https://")) or not _alive(pid):
        return None
    return {"pid": pid, "web": web, "token": bool(note.get("token"))}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True
