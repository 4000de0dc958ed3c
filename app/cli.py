"""The `tokentrace` command: serve, import, report, requests, demo (README.md, docs/)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokentrace import __version__
from tokentrace._words import counted
from tokentrace.demo_cli import DEFAULT_DEMO_DB
from tokentrace.store.location import DB_ENV, DEFAULT_DB

if TYPE_CHECKING:
    from tokentrace.collector.settings import CollectorSettings

EXIT_USAGE = 2
EXIT_ERROR = 1
#: 128 + SIGPIPE, what a shell reports for `cat` cut short by `| head`
EXIT_BROKEN_PIPE = 141


#: `--db`'s help, worded as `serve --help` words every setting (its own `--db` included)
DB_HELP = f"DuckDB file (env {DB_ENV}; default {DEFAULT_DB})"


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", type=Path, default=None, help=DB_HELP)


#: The lake's variables, as `serve` names them (collector/settings.py ENV).
LAKE_ENV = "TOKENTRACE_LAKE"
LAKE_DATA_ENV = "TOKENTRACE_LAKE_DATA"


def _add_lake(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lake",
        default=None,
        help="read a shared lake instead of --db: a DuckLake catalog as DuckDB's ATTACH takes it, "
        f"e.g. 'ducklake:postgres:dbname=tokentrace host=db.internal' (env {LAKE_ENV}; "
        "docs/scale-out.md)",
    )
    p.add_argument(
        "--lake-data",
        default=None,
        help="the lake's data path, a directory or s3://… (env "
        f"{LAKE_DATA_ENV}; default: the path the lake was made with)",
    )


class UsageError(ValueError):
    """Options that contradict each other: said in one line, exit status 2."""


def resolve_store(args: argparse.Namespace) -> None:
    """Settles what `report` / `requests` read, flag → environment → default: sets `args.lake`
    (None: the file `args.db`) and `args.lake_data`.  Two stores named the same way (both
    flags, or both variables) is a UsageError: which one to read is the user's to say."""
    from tokentrace.store.location import DB_ENV

    url = getattr(args, "url", None)
    if args.lake and args.db is not None:
        raise UsageError("--db and --lake name two stores: give one (the file or the lake)")
    if args.lake and url:
        raise UsageError("--url and --lake name two sources: give one (the server or the lake)")
    lake = args.lake
    if lake is None and args.db is None and not url:
        lake = os.environ.get(LAKE_ENV) or None
        if lake and os.environ.get(DB_ENV):
            raise UsageError(
                f"both {DB_ENV} and {LAKE_ENV} are set: pass --db or --lake to say which to read"
            )
    lake_data = args.lake_data or (os.environ.get(LAKE_DATA_ENV) or None if lake else None)
    if args.lake_data and not lake:
        raise UsageError("--lake-data names the lake's files: give --lake too")
    args.lake, args.lake_data = lake, lake_data


def _add_window(p: argparse.ArgumentParser) -> None:
    p.add_argument("--service", help="only requests of this service.name (e.g. tiny-llm-stutter)")
    p.add_argument("--model", help="only requests of this model")
    p.add_argument("--tenant", help="only requests of this tenant")
    p.add_argument("--traffic-class", choices=("interactive", "batch"), help="only this class")
    p.add_argument(
        "--since",
        help="only requests that started at/after this time: ISO 8601 (2026-11-21T10:00:00Z, "
        "UTC unless it says otherwise) or a duration ago (10m, 2h, 1d)",
    )
    p.add_argument(
        "--until",
        help="only requests that started before this time: ISO 8601 or a duration ago (e.g. 5m)",
    )


def _filters(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from tokentrace.analyzer.filters import Filters
    from tokentrace.analyzer.report_cli import window_bounds

    try:
        start_ns, end_ns = window_bounds(args.since, args.until)
    except ValueError as exc:
        raise SystemExit(f"tokentrace: {exc}") from exc
    return Filters(
        start_ns=start_ns,
        end_ns=end_ns,
        model=args.model,
        tenant=args.tenant,
        traffic_class=args.traffic_class,
        service=args.service,
    )


#: `serve --help`'s sections: (title, description, settings), in the order shown.
SERVE_GROUPS: tuple[tuple[str, str | None, tuple[str, ...]], ...] = (
    ("addresses", None, ("host", "otlp_host", "http_port", "grpc_port", "web_port")),
    ("security", None, ("api_token",)),
    (
        "tail sampling",
        "which traces keep their spans; every request keeps its summary (docs/collector.md)",
        ("baseline", "slo_ttft_ms", "slo_e2e_ms", "slo_itl_ms", "keep_rules", "p99_min_samples",
         "p99_warmup", "grace_s", "server_wait_s", "client_wait_s", "decision_wait_s"),
    ),
    (
        "limits and backpressure",
        None,
        ("max_buffered_spans", "max_buffered_bytes", "max_body_bytes", "max_pending_writes",
         "decode_processes"),
    ),
    ("storage", None, ("db", "retention", "duckdb_memory_limit", "duckdb_checkpoint_threshold",
                       "wal")),
    (
        "scale-out",
        "many collectors, one shared lake (docs/scale-out.md)",
        ("lake", "lake_data", "shard", "receivers", "lake_hot_window", "lake_move_interval_s",
         "lake_max_unmoved_rows"),
    ),
)


def _serve_parser(sub: _WithParents) -> None:
    from tokentrace.collector.settings import ENV, HELP, CollectorSettings, shown_default

    p = sub.add_parser(
        "serve",
        help="run the collector (OTLP gRPC 4317, HTTP 4318) and the web UI (8600)",
        description="Run the collector and web explorer. Every setting resolves flag → environment variable → default.",
        usage="%(prog)s [-h] [-v] [--SETTING VALUE ...]",
    )
    group_of: dict[str, argparse._ArgumentGroup] = {}
    for title, description, names in SERVE_GROUPS:
        group = p.add_argument_group(title, description)
        group_of.update(dict.fromkeys(names, group))
    settings_fields = CollectorSettings.__dataclass_fields__
    # a setting no section names yet still shows, under its own heading
    ungrouped = [name for name in settings_fields if name not in group_of]
    if ungrouped:
        group_of.update(dict.fromkeys(ungrouped, p.add_argument_group("other settings")))
    grouped = [name for _, _, names in SERVE_GROUPS for name in names if name in settings_fields]
    for name in [*grouped, *ungrouped]:
        f = settings_fields[name]
        flag = "--" + name.replace("_", "-")
        default = f.default
        kind = type(default) if default is not None and not isinstance(default, Path) else str
        if name.startswith("slo_"):
            kind = float
        if name == "db":
            kind = Path
        if isinstance(default, bool):  # an on-by-default switch: --no-NAME turns it off
            group_of[name].add_argument(
                "--no-" + name.replace("_", "-"),
                dest=name,
                action="store_const",
                const=False,
                default=None,
                help=f"{HELP[name]} (env {ENV[name]}; default {shown_default(name)})",
            )
            continue
        group_of[name].add_argument(
            flag,
            type=kind,
            default=None,
            help=f"{HELP[name]} (env {ENV[name]}; default {shown_default(name)})",
        )


def _cmd_serve(args: argparse.Namespace) -> int:
    from tokentrace.collector.settings import CollectorSettings, resolve
    from tokentrace.serve import serve
    from tokentrace.store.connection import keep_store_private

    explicit = {k: getattr(args, k) for k in CollectorSettings.__dataclass_fields__}
    settings = resolve(explicit)
    if not settings.receivers:
        return _serve_query_node(settings, explicit)

    def ready(server: Any) -> None:
        logging.getLogger("tokentrace").info(
            "tokentrace serve settings: %s",
            ", ".join(f"{k}={v}" for k, v in settings.as_applied().items()),
        )
        from tokentrace._loopback import host_port  # IPv6 literals in brackets

        # the ports served on: a port 0 in the settings is the one bound
        served = dataclasses.replace(
            settings, http_port=server.http_port, grpc_port=server.grpc_port, web_port=server.web_port
        )
        otlp = served.otlp_bind_host  # may differ from the web UI's (--otlp-host)
        print(
            f"tokentrace {__version__}: OTLP/HTTP on http://{host_port(otlp, served.http_port)}, "
            f"OTLP/gRPC on {host_port(otlp, served.grpc_port)}, "
            f"web UI on http://{host_port(served.host, served.web_port)}, db {served.db}",
            flush=True,
        )
        print(next_steps(served), flush=True)

    warning = exposure_warning(settings.host, settings.api_token)
    if warning:
        print(f"tokentrace serve: warning: {warning}", file=sys.stderr, flush=True)
    keep_store_private(settings.db)  # the WAL DuckDB re-creates later, as private as the file
    serve(settings, ready)
    return 0


def _serve_query_node(settings: CollectorSettings, explicit: dict[str, Any]) -> int:
    """`serve --lake URI --no-receivers`: the explorer over the lake; no file is opened."""
    from tokentrace.query_node import next_steps
    from tokentrace.serve import serve

    if explicit.get("db") is not None:
        raise UsageError(
            "--db names a local file, which a query node (--no-receivers) never opens: drop one"
        )

    def ready(server: Any) -> None:
        from tokentrace._loopback import host_port

        print(
            f"tokentrace {__version__}: query node over {server.lake.describe()}, "
            f"web UI on http://{host_port(settings.host, server.web_port)}",
            flush=True,
        )
        print(next_steps(server), flush=True)

    warning = exposure_warning(settings.host, settings.api_token)
    if warning:
        print(f"tokentrace serve: warning: {warning}", file=sys.stderr, flush=True)
    serve(settings, ready)
    return 0


def _local_address(host: str) -> str:
    """Gives the address this machine reaches a server bound to `host` on: a
    wildcard (0.0.0.0, ::) is reached on loopback."""
    bare = host.strip("[]")
    if bare in ("", "0.0.0.0", "::"):  # noqa: S104 - compared, not bound
        return "[::1]" if bare == "::" else "127.0.0.1"
    return f"[{bare}]" if ":" in bare else bare


def next_steps(settings: CollectorSettings) -> str:
    """Gives what `serve` prints under its addresses: where to send traces, how to
    read the diagnosis, how to stop."""
    from tokentrace._loopback import is_loopback

    otlp = _local_address(settings.otlp_bind_host)
    web = _local_address(settings.host)
    elsewhere = "" if is_loopback(settings.otlp_bind_host) else " (other machines: this host's address)"
    token = " (with $TOKENTRACE_API_TOKEN set)" if settings.api_token else ""
    return (
        f"  send traces: OTEL_EXPORTER_OTLP_ENDPOINT=http://{otlp}:{settings.http_port} "
        f"OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf\n"
        f"    (or OTEL_EXPORTER_OTLP_ENDPOINT=http://{otlp}:{settings.grpc_port} for gRPC){elsewhere}\n"
        f"  read the diagnosis: tokentrace report --url http://{web}:{settings.web_port}{token}\n"
        "  Ctrl-C stops serve"
    )


def exposure_warning(host: str, api_token: str | None) -> str | None:
    """Says so when `serve` would show every trace to the network without a token.

    `host` is the web UI's address: only the explorer shows traces.  The OTLP
    receivers (`--otlp-host`) take exports and show /metrics, as an OpenTelemetry
    Collector's do, so binding them beyond loopback needs no token."""
    from tokentrace._loopback import is_loopback

    if api_token or is_loopback(host):
        return None
    return (
        f"--host {host} serves every trace (tenants, request ids, and prompts where "
        "recorded) to whoever reaches the port, with no token: add --api-token "
        "(or $TOKENTRACE_API_TOKEN)"
    )


def _cmd_import(args: argparse.Namespace) -> int:
    from tokentrace.collector.settings import resolve
    from tokentrace.file_import import import_files
    from tokentrace.store.connection import keep_store_private

    settings = resolve({"db": args.db, "baseline": args.baseline})
    keep_store_private(settings.db)
    counts = import_files(settings, args.files)
    read = f"imported {counted(counts['spans'], 'span')} from {counted(counts['files'], 'file')}"
    already = counts["already_stored"]
    new = counts["requests"] - already
    before = "(this file, or a copy of its spans, imported before)"
    if already and not new and not counts["kept_traces"]:
        print(
            f"{read}: nothing new was stored ({counted(already, 'request')}, in the database "
            f"already {before}) → {settings.db}"
        )
        return 0
    print(
        f"{read}: {counted(new, 'new request' if already else 'request')}, "
        f"{counted(counts['kept_traces'], 'trace')} kept whole → {settings.db}"
    )
    if already:
        print(
            f"  {already:,} more {'was' if already == 1 else 'were'} in the database already "
            f"{before}: kept once, as first stored"
        )
    elif counts["kept_traces"] < counts["traces"] and settings.baseline < 1:
        print(
            f"  the spans of {counted(counts['traces'] - counts['kept_traces'], 'trace')} were not "
            f"kept (tail sampling: unremarkable, baseline {settings.baseline}); every request "
            "has its summary. --baseline 1 keeps every trace whole."
        )
    return 0



def _raise_if_held(db: Path) -> None:
    """Raises DatabaseHeld when another process holds `db` (DuckDB's lock says so on open)."""
    from tokentrace.store.connection import StoreError, open_read_only
    from tokentrace.store.held import DatabaseHeld

    try:
        open_read_only(db).close()
    except DatabaseHeld:
        raise
    except StoreError:
        pass  # not held: what it says about an empty file is the caller's to say


@contextlib.contextmanager
def _reading_lake(args: argparse.Namespace) -> Iterator[None]:
    """Turns what DuckDB says while reading the lake (its catalog gone mid-report, a table a
    shard has not made) into one line that names the lake, any password masked."""
    import duckdb

    from tokentrace.store.connection import StoreError
    from tokentrace.store.reader import LakeAddress, first_line

    lake = LakeAddress(args.lake, args.lake_data).describe()
    try:
        yield
    except duckdb.CatalogException as exc:
        raise StoreError(
            f"{lake} is not a tokentrace lake, or one of another version: {first_line(exc)}"
        ) from exc
    except duckdb.Error as exc:
        raise StoreError(f"cannot read {lake}: {first_line(exc)}") from exc


@contextlib.contextmanager
def _reading_db(args: argparse.Namespace) -> Iterator[None]:
    """Turns what DuckDB says about a file that is not a tokentrace database
    (an empty file, another program's database, a query on a missing table)
    into one line that names the file, instead of a traceback."""
    import duckdb

    from tokentrace.store.connection import StoreError, resolve_db_path

    if getattr(args, "lake", None):
        with _reading_lake(args):
            yield
        return
    db = resolve_db_path(args.db)
    if not getattr(args, "url", None) and db.is_file() and db.stat().st_size == 0:
        _raise_if_held(db)  # a writer that just created the file holds it before writing it
        raise StoreError(f"{db} is empty: not a tokentrace database")
    try:
        yield
    except StoreError as exc:
        hint = _demo_hint(db, args)
        if hint is None:
            raise
        raise StoreError(f"{exc} {hint}") from exc
    except duckdb.CatalogException as exc:
        raise StoreError(
            f"{db} is not a tokentrace database, or one of another version: {_first_line(exc)}"
        ) from exc
    except duckdb.Error as exc:
        raise StoreError(f"cannot read {db}: {_first_line(exc)}") from exc


def _demo_hint(db: Path, args: argparse.Namespace) -> str | None:
    """Gives where the demo's data is when `db` does not exist but the demo's file
    does (`tokentrace report` after `tokentrace demo`), else None."""
    demo = DEFAULT_DEMO_DB
    if getattr(args, "url", None) or db.exists() or not demo.is_file():
        return None
    if demo.resolve() == db.resolve():
        return None
    return f"(the demo's data is in {demo}: --db {demo})"


def _first_line(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _cmd_report(args: argparse.Namespace) -> int:
    from tokentrace.analyzer.report_cli import run_report

    resolve_store(args)
    filters = _filters(args)
    with _reading_db(args):
        return run_report(args, filters)


def _cmd_requests(args: argparse.Namespace) -> int:
    from tokentrace.analyzer.report_cli import run_requests

    resolve_store(args)
    filters = _filters(args)
    with _reading_db(args):
        return run_requests(args, filters)


def _cmd_demo(args: argparse.Namespace) -> int:
    from tokentrace.demo_cli import run_demo

    return run_demo(args)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _add_remote(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        help="ask a running `tokentrace serve` (its web URL, e.g. http://127.0.0.1:8600) "
        "instead of opening --db, which the server holds",
    )
    p.add_argument(
        "--token",
        help="bearer token of a server started with --api-token (env TOKENTRACE_API_TOKEN)",
    )


class _WithParents:
    """A subparsers action whose every `add_parser` gets the same parent parsers (`-v`)."""

    def __init__(self, sub: argparse._SubParsersAction, parents: list[argparse.ArgumentParser]) -> None:  # type: ignore[type-arg]
        self._sub = sub
        self._parents = parents

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return self._sub.add_parser(name, parents=self._parents, **kwargs)  # type: ignore[no-any-return]


#: `tokentrace --help`'s closing lines: the first commands to run
QUICK_START = """\
quick start:
  tokentrace demo        a real tiny LLM server under load, diagnosed (no GPU needed)
  tokentrace serve       the collector; then point your server's OpenTelemetry SDK at it:
                         OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318
                         OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf (or :4317 for gRPC)
  tokentrace report --url http://127.0.0.1:8600
                         where the time went and what to fix first

docs: README.md, then docs/ (a command's own options: tokentrace COMMAND --help)
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tokentrace",
        description="Latency doctor for LLM serving: where did the time of each request go,\n"
        "and what should you fix first?",
        epilog=QUICK_START,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"tokentrace {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `tokentrace serve -v` as well as `tokentrace -v serve` (SUPPRESS: an absent -v
    # after the command leaves the one before it alone)
    verbose = argparse.ArgumentParser(add_help=False)
    verbose.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log more")
    sub = _WithParents(subparsers, [verbose])

    _serve_parser(sub)

    p = sub.add_parser(
        "import",
        help="run OTLP files (protobuf, JSON or JSON lines) through the pipeline",
        description="Run OTLP trace files (protobuf, JSON or JSON lines, e.g. the explorer's "
        "otlp.json export or an OpenTelemetry Collector's file exporter) through the same "
        "pipeline as `serve`: every request gets its summary; the spans of a trace are kept "
        "as tail sampling decides (slow, broken, and --baseline of the rest).",
    )
    p.add_argument("files", nargs="+", type=Path, help="OTLP export files")
    p.add_argument(
        "--baseline",
        type=float,
        default=None,
        help="probability of keeping an unremarkable trace's spans; 1 keeps every trace whole "
        "(env TOKENTRACE_BASELINE; default 0.02)",
    )
    _add_db(p)

    p = sub.add_parser(
        "report",
        help="the diagnosis: where the time goes and what to fix first",
        description="The diagnosis of the stored requests: latency percentiles, the four buckets "
        "(network, queue, prefill, decode) and the findings, the most important first, each "
        "with its evidence, example traces and what to fix first.",
    )
    p.add_argument(
        "--format",
        choices=("text", "markdown", "json", "html"),
        default="text",
        help="text for a terminal (default), markdown for an issue or a wiki, json for tools "
        "(its fields: docs/report.md), html for a self-contained page",
    )
    _add_remote(p)
    p.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    _add_db(p)
    _add_lake(p)
    _add_window(p)

    p = sub.add_parser(
        "requests",
        help="one row per request with its four-bucket summary",
        description="One row per request: its start, end-to-end time and four buckets, TTFT, "
        "TPOT, inter-token gaps, token counts, model, tenant and traffic class (docs/buckets.md).",
    )
    p.add_argument(
        "--format",
        choices=("jsonl", "csv", "parquet"),
        default="jsonl",
        help="JSON lines (default), CSV, or Parquet (binary: to --output or a pipe, not a terminal)",
    )
    p.add_argument("--output", "-o", type=Path, help="write to this file instead of stdout")
    p.add_argument("--limit", type=_positive_int, help="at most this many rows")
    _add_remote(p)
    _add_db(p)
    _add_lake(p)
    _add_window(p)

    p = sub.add_parser(
        "demo",
        help="run a real tiny LLM server under load and diagnose it",
        description="Start the collector, then a real tiny PyTorch LLM server with continuous "
        "batching for each scenario (one per complaint, plus a healthy one), load it with "
        "production request traces, and print each scenario's diagnosis. The explorer stays up "
        "afterwards unless --exit. No GPU needed: a run takes about 5-6 minutes on 2 CPU cores.",
    )
    p.add_argument("--quick", action="store_true", help="a shorter CI-sized run (about 4 minutes)")
    p.add_argument(
        "--exit", action="store_true", help="stop after the report instead of keeping the UI up"
    )
    p.add_argument(
        "--scenarios",
        default=None,
        help="comma-separated scenario names, e.g. stutter,cold_start (default: all; "
        "docs/demo.md describes each)",
    )
    p.add_argument(
        "--db",
        type=Path,
        default=None,
        help=f"DuckDB file (default {DEFAULT_DEMO_DB}, deleted and made anew each run; "
        f"${DB_ENV} is not read). A file named here is kept: this run's data is added to it, "
        "and each scenario's diagnosis counts only this run's requests",
    )
    return parser


COMMANDS = {
    "serve": _cmd_serve,
    "import": _cmd_import,
    "report": _cmd_report,
    "requests": _cmd_requests,
    "demo": _cmd_demo,
}


#: Top-level imports the `server` extra installs (the commands' dependencies, not the SDK's).
SERVER_MODULES = frozenset(
    ("duckdb", "numpy", "polars", "pyarrow", "fastapi", "starlette", "uvicorn", "grpc", "jinja2",
     "ddsketch", "prometheus_client", "google", "httpx")
)  # fmt: skip


def _extra_providing(module: str | None) -> str | None:
    """Gives the extra that installs `module` (a ModuleNotFoundError's name), None for others."""
    root = (module or "").partition(".")[0]
    if root in ("torch", "tokenizers"):
        return "demo"
    return "server" if root in SERVER_MODULES else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return COMMANDS[args.command](args)
    except KeyboardInterrupt:
        return 130
    except UsageError as exc:
        print(f"tokentrace {args.command}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        # the reader went away (`tokentrace requests | head`): stop quietly, as `cat` does,
        # with the status a process killed by SIGPIPE has; nothing more goes to the pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    except ModuleNotFoundError as exc:
        extra = _extra_providing(exc.name)
        if extra is None:
            raise
        if args.command == "demo":
            extra = "demo"  # it needs the server extra and torch: one install gives both
        print(
            f"tokentrace {args.command}: needs {exc.name}, which the SDK alone (`pip install .`) "
            f"leaves out: pip install 'tokentrace[{extra}]' (in a clone: pip install '.[{extra}]')",
            file=sys.stderr,
        )
        return EXIT_ERROR
    except (ValueError, OSError, RuntimeError) as exc:
        print(f"tokentrace {args.command}: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except Exception as exc:  # a bug: still one line, the traceback on request
        if args.verbose:
            traceback.print_exc()
        print(
            f"tokentrace {args.command}: unexpected {type(exc).__name__}: {_first_line(exc)}"
            + ("" if args.verbose else " (run `tokentrace -v ...` for the traceback)"),
            file=sys.stderr,
        )
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
