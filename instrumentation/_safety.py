"""Keeps the SDK's own failures away from the host: caught, logged once per site."""

from __future__ import annotations

import logging
import threading
from typing import Any

logger = logging.getLogger("tokentrace")
_seen: set[str] = set()
_seen_lock = threading.Lock()


def after_fork_in_child() -> None:
    """Makes the log's lock again in a forked child (run first by the runtime's at-fork
    handler: every later step may log)."""
    # another thread may have held it at the fork: the child would wait forever
    global _seen_lock
    _seen_lock = threading.Lock()


def log_once(site: str, exc: BaseException | None = None, detail: str = "") -> None:
    """Logs the SDK's own error at `site` the first time only (a hot loop must not flood logs).

    Without `exc` it is a misuse by the host, said in words: `site` and then
    `detail` (the first offending value, say), which is not part of the key.
    """
    with _seen_lock:
        if site in _seen:
            return
        _seen.add(site)
    if exc is None:
        logger.warning("tokentrace: %s%s (further ones are not logged)", site, detail)
    else:
        logger.warning(
            "tokentrace: %s failed (further errors here are not logged)", site, exc_info=exc
        )


def describe(value: Any) -> str:
    """Gives what a log line may say of a value the host handed over: a number as itself,
    anything else by its type (and length): text may be a prompt (`set_tokens(prompt=text)`),
    and the SDK records no content unless configured to."""
    if value is None or value.__class__ in (bool, int, float):
        return repr(value)
    name = type(value).__name__
    if isinstance(value, (str, bytes, bytearray, list, tuple, dict)):
        return f"{name} of length {len(value)}"
    return name


def count_or_zero(value: Any, what: str) -> int:
    """Gives a count the host handed over as text or a float (`token("3")`) as an int;
    0 (nothing recorded, logged once) when it is not a number.  Off the usual path."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        log_once(f"{what} is not a number", detail=f" ({describe(value)}; not recorded)")
        return 0
