"""Counts in words: '1 request', '3 requests' (the CLI, the demo and the reports alike)."""

from __future__ import annotations


def noun(n: int | None, one: str) -> str:
    """Gives `one` or its plural for `n` of them."""
    return one if n == 1 else one + "s"


def counted(n: int | None, one: str) -> str:
    """Gives '1 kept trace' / '3 kept traces'."""
    return f"{n} {noun(n, one)}"
