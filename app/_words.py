"""Counts in words: '1 request', '3 requests' (the CLI, the demo and the reports alike)."""

from __future__ import annotations


def noun(n: int | None, one: str) -> str:
    """Gives `one` or its plural for `n` of them."""
    return one if n == 1 else one + "s"


def counted(n: int | None, one: str) -> str:
    """Gives '1 kept trace' / '3 kept traces' / '1,000,000 requests' (grouped, as every other
    count in a report is: "client spans on 1,000,000 of 1000000 requests" read as two)."""
    return f"{n:,} {noun(n, one)}" if isinstance(n, int) else f"{n} {noun(n, one)}"
