"""The store's one exception: what `serve`, `import`, `report` and the web UI say in one line."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database could not be opened or used."""
