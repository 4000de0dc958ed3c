"""ruff and mypy run with the tests, so the README's one test command (CI's) covers them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_ruff_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.slow
def test_mypy_finds_nothing() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "typecheck")], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
