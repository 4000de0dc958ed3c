"""What a newcomer reads first: the docs and every `--help`. They name only files that ship,
say their defaults, and explain every option."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tokentrace.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # `examples.*` resolves from the repository root
    sys.path.insert(0, str(REPO))

#: The design notes live outside the repository: a shipped text that cites them sends the
#: reader to a file they do not have.
OUTSIDE = "DESIGN.md"

DOCS = sorted(
    p.relative_to(REPO).as_posix()
    for p in [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("examples/*.md"),
              *REPO.glob("examples/*/*.md")]
)  # fmt: skip


def _subparsers(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield "tokentrace", parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield f"tokentrace {name}", sub


COMMANDS = dict(_subparsers(build_parser()))


class _Parsed(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def _parser_of(main: Callable[[list[str]], object], monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    """Gives the parser a script's `main` builds, stopped where it would parse."""

    def parse_args(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Parsed(self)

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    with pytest.raises(_Parsed) as parsed:
        main([])
    monkeypatch.undo()
    return parsed.value.parser


def _example_parsers(monkeypatch: pytest.MonkeyPatch) -> dict[str, argparse.ArgumentParser]:
    pytest.importorskip("torch")  # the tiny server's model (the demo extra)
    from examples import netproxy
    from examples.load import generator
    from examples.tiny_llm import server

    return {
        "examples.load.generator": _parser_of(generator.main, monkeypatch),
        "examples.tiny_llm.server": _parser_of(server._parse_args, monkeypatch),
        "examples.netproxy": _parser_of(netproxy.main, monkeypatch),
    }


def _help_of(parser: argparse.ArgumentParser, option: str) -> str:
    """Gives the help `--help` shows for `option`, its %(default)s expanded."""
    action = next(a for a in parser._actions if option in a.option_strings)
    return " ".join(parser._get_formatter()._expand_help(action).split())


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_sends_the_reader_to_a_file_that_does_not_ship(doc: str) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    assert OUTSIDE not in text, f"{doc} cites {OUTSIDE}, which the repository does not contain"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_help_text_sends_the_reader_to_a_file_that_does_not_ship(command: str) -> None:
    assert OUTSIDE not in COMMANDS[command].format_help()


def test_no_example_help_cites_a_file_that_does_not_ship(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, parser in _example_parsers(monkeypatch).items():
        assert OUTSIDE not in parser.format_help(), name


def test_every_example_option_is_explained_and_the_generator_says_its_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsers = _example_parsers(monkeypatch)
    for name, parser in parsers.items():
        unexplained = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        assert not unexplained, f"{name}: {unexplained} have no help text"
    generator = parsers["examples.load.generator"]
    for option, default in (("--limit", "50"), ("--time-compression", "10.0"), ("--trace", "azure_conv"),
                            ("--max-prompt-tokens", "400"), ("--max-output-tokens", "128"),
                            ("--seed", "0"), ("--url", "http://127.0.0.1:8000")):  # fmt: skip
        assert f"(default: {default})" in _help_of(generator, option), option
    server = parsers["examples.tiny_llm.server"]
    from examples.tiny_llm.config import ServerConfig

    for option, value in (("--max-batch-size", ServerConfig.max_batch_size),
                          ("--max-tokens-per-step", ServerConfig.max_tokens_per_step),
                          ("--batch-delay-ms", ServerConfig.batch_delay_ms),
                          ("--seed", ServerConfig.seed)):  # fmt: skip
        assert f"default {value}" in _help_of(server, option), option


def test_the_window_options_say_they_take_a_duration() -> None:
    for command in ("tokentrace report", "tokentrace requests"):
        for option in ("--since", "--until"):
            said = _help_of(COMMANDS[command], option)
            assert "ISO 8601" in said and "ago" in said, (command, option, said)
