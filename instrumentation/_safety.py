"""Keeps the SDK's own failures away from the host: caught, logged once per site."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("tokentrace")
_seen: set[str] = set()
_seen_lock = threading.Lock()


def log_once(site: str, exc: BaseException | None = None) -> None:
    """Logs the SDK's own error at `site` the first time only (a hot loop must not flood logs)."""
    with _seen_lock:
        if site in _seen:
            return
        _seen.add(site)
    if exc is None:
        logger.warning("tokentrace: %s", site)
    else:
        logger.warning(
            "tokentrace: %s failed (further errors here are not logged)", site, exc_info=exc
        )
