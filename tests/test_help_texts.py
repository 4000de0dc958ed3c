"""What a newcomer reads first: the docs and every `--help`. They name only files that ship,
say their defaults, and explain every option."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tokentrace.cli import build_parser

REPO = Path(__file__).resolve().parents[1]

#: A `.md` file a text names (a link, or a path in prose or help): one that is not in the
#: repository (a design note kept elsewhere) sends the reader to a file they do not have.
MD_NAME = re.compile(r"(?<![\w./-])((?:\.\./|\./)?[\w./-]*\w\.md)\b")

DOCS = sorted(
    p.relative_to(REPO).as_posix()
    for p in [*REPO.glob("*.md"), *REPO.glob("docs/*.md"), *REPO.glob("examples/*.md"),
              *REPO.glob("examples/*/*.md")]
)  # fmt: skip


def _missing_md(text: str, here: Path = REPO) -> list[str]:
    """Gives the `.md` files `text` names that are neither beside `here` nor from the root."""
    return sorted({n for n in MD_NAME.findall(text) if not (here / n).exists() and not (REPO / n).exists()})


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
    from tokentrace.examples import netproxy
    from tokentrace.examples.load import generator
    from tokentrace.examples.tiny_llm import server

    return {
        "tokentrace.examples.load.generator": _parser_of(generator.main, monkeypatch),
        "tokentrace.examples.tiny_llm.server": _parser_of(server._parse_args, monkeypatch),
        "tokentrace.examples.netproxy": _parser_of(netproxy.main, monkeypatch),
    }


def _help_of(parser: argparse.ArgumentParser, option: str) -> str:
    """Gives the help `--help` shows for `option`, its %(default)s expanded."""
    action = next(a for a in parser._actions if option in a.option_strings)
    return " ".join(parser._get_formatter()._expand_help(action).split())


@pytest.mark.parametrize("doc", DOCS)
def test_no_doc_sends_the_reader_to_a_file_that_does_not_ship(doc: str) -> None:
    path = REPO / doc
    missing = _missing_md(path.read_text(encoding="utf-8"), path.parent)
    assert not missing, f"{doc} names {missing}, which the repository does not contain"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_no_help_text_sends_the_reader_to_a_file_that_does_not_ship(command: str) -> None:
    assert not _missing_md(COMMANDS[command].format_help())


def test_no_example_help_cites_a_file_that_does_not_ship(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, parser in _example_parsers(monkeypatch).items():
        assert not _missing_md(parser.format_help()), name


def test_every_example_option_is_explained_and_the_generator_says_its_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parsers = _example_parsers(monkeypatch)
    for name, parser in parsers.items():
        unexplained = [a.option_strings[0] for a in parser._actions if a.option_strings and not a.help]
        assert not unexplained, f"{name}: {unexplained} have no help text"
    generator = parsers["tokentrace.examples.load.generator"]
    for option, default in (("--limit", "50"), ("--time-compression", "10.0"), ("--trace", "azure_conv"),
                            ("--max-prompt-tokens", "400"), ("--max-output-tokens", "128"),
                            ("--seed", "0"), ("--url", "http://127.0.0.1:8000")):  # fmt: skip
        assert f"(default: {default})" in _help_of(generator, option), option
    server = parsers["tokentrace.examples.tiny_llm.server"]
    from tokentrace.examples.tiny_llm.config import ServerConfig

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


def _settings_help() -> tuple[dict[str, str], dict[str, str]]:
    from tokentrace.collector.settings import ENV, HELP

    return HELP, ENV


def test_serve_help_groups_every_setting_once_and_keeps_its_flag_env_and_default() -> None:
    from tokentrace.cli import SERVE_GROUPS
    from tokentrace.collector.settings import CollectorSettings, shown_default

    _, env = _settings_help()
    names = [name for _, _, group in SERVE_GROUPS for name in group]
    assert sorted(names) == sorted(CollectorSettings.__dataclass_fields__), "each setting in one section"
    serve = COMMANDS["tokentrace serve"]
    titles = [g.title for g in serve._action_groups]
    assert titles[2:] == [title for title, _, _ in SERVE_GROUPS]  # after positionals, options
    for name in names:
        switch = isinstance(CollectorSettings.__dataclass_fields__[name].default, bool)
        flag = ("--no-" if switch else "--") + name.replace("_", "-")
        assert f"(env {env[name]}; default {shown_default(name)})" in _help_of(serve, flag), flag
    assert serve.format_usage() == "usage: tokentrace serve [-h] [-v] [--SETTING VALUE ...]\n"


def test_db_is_worded_one_way_and_the_demo_says_what_happens_to_its_file() -> None:
    said = {cmd: _help_of(COMMANDS[f"tokentrace {cmd}"], "--db") for cmd in ("serve", "import", "report", "requests")}
    assert set(said.values()) == {"DuckDB file (env TOKENTRACE_DB; default tokentrace.duckdb)"}, said
    demo = _help_of(COMMANDS["tokentrace demo"], "--db")
    assert "append to" not in demo
    assert "default tokentrace-demo.duckdb, deleted and made anew each run" in demo
    assert "A file named here is kept" in demo and "only this run's requests" in demo


def test_the_api_token_advice_is_the_environment_variable() -> None:
    serve = COMMANDS["tokentrace serve"]
    host = _help_of(serve, "--host")
    assert "beyond loopback, set $TOKENTRACE_API_TOKEN" in host and "add --api-token" not in host
    assert "prefer setting $TOKENTRACE_API_TOKEN" in _help_of(serve, "--api-token")


def test_setting_help_is_plain_not_design_notes() -> None:
    help_of, _ = _settings_help()
    for name in ("max_buffered_bytes", "duckdb_checkpoint_threshold"):
        assert len(help_of[name]) <= 200, (name, help_of[name])
        assert "docs/collector.md" in help_of[name]  # where the details are
    assert " MB" not in help_of["max_buffered_bytes"]  # one unit: MiB (--help's default says it)
    assert "whether to keep its spans" in help_of["grace_s"]
    assert help_of["p99_warmup"].startswith("keep the first N traces of each service/model/route")
    assert "5 idle minutes; 0: none" in help_of["p99_warmup"]


def test_tokentrace_help_ends_with_a_quick_start() -> None:
    text = COMMANDS["tokentrace"].format_help()
    quick = text[text.index("quick start:"):]
    for said in ("tokentrace demo", "tokentrace serve", "OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318",
                 "tokentrace report --url http://127.0.0.1:8600", "README.md"):  # fmt: skip
        assert said in quick, said


@pytest.mark.slow
def test_serve_says_what_to_do_next_once_it_is_up(tmp_path: Path) -> None:
    from tt_testkit import start_serve

    server = start_serve(tmp_path, "--decode-processes", "0")
    out = server.stop()
    assert f"OTLP/HTTP on http://127.0.0.1:{server.http_port}" in out, out  # the line tests parse
    assert (f"send traces: OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{server.http_port} "
            "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf") in out, out  # fmt: skip
    assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{server.grpc_port} for gRPC" in out
    assert f"tokentrace report --url http://127.0.0.1:{server.web_port}\n" in out
    assert "Ctrl-C stops serve" in out


def test_next_steps_for_a_wildcard_address_and_a_token() -> None:
    from tokentrace.cli import next_steps
    from tokentrace.collector.settings import CollectorSettings

    said = next_steps(CollectorSettings(host="0.0.0.0", otlp_host="::", api_token="t"))  # noqa: S104
    assert "OTEL_EXPORTER_OTLP_ENDPOINT=http://[::1]:4318" in said
    assert "other machines: this host's address" in said
    assert "tokentrace report --url http://127.0.0.1:8600 (with $TOKENTRACE_API_TOKEN set)" in said
