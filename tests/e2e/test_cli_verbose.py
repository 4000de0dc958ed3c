"""`-v` before or after the command (`tokentrace serve -v` was refused: unrecognized arguments)."""

from __future__ import annotations

import pytest

from tokentrace.cli import build_parser


@pytest.mark.parametrize("command", [["serve"], ["import", "f.json"], ["report"], ["requests"], ["demo"]])
def test_verbose_before_or_after_the_command(command: list[str]) -> None:
    parse = build_parser().parse_args
    assert parse([*command, "-v"]).verbose is True
    assert parse(["-v", *command]).verbose is True  # the one before the command is kept
    assert parse(command).verbose is False
