"""Findings compared as a reader compares them: every field equal, floats to 12 digits.

A finding's impact and some evidence numbers are float sums (E2E totals), which DuckDB adds
in whatever order its threads finish: two runs of one query can differ in the last bit on a
busy machine.  A test holding two computations of a finding to each other (a first check
against the full query) compares them here."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import pytest


def _alike(a: Any, b: Any, where: str) -> None:
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, nan_ok=True), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _alike(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _alike(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def findings_alike(a: Any, b: Any) -> None:
    """Asserts that two findings (or two Nones) are the same."""
    assert (a is None) == (b is None), (a, b)
    if a is not None:
        _alike(asdict(a), asdict(b), "finding")
