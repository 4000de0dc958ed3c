"""`tokentrace demo`: collector + explorer in-process, a real tiny LLM server under every complaint.

For each scenario of `examples/scenarios` a fresh tiny server process (its own
`service.name`) is traced through the SDK to this process's collector, and
the load generator's client spans add the user's view. After each scenario
the diagnosis of its service is printed; the explorer stays up until Ctrl-C.
"""

from __future__ import annotations

import argparse
import errno
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokentrace._words import counted

if TYPE_CHECKING:
    import duckdb

DEFAULT_DEMO_DB = Path("tokentrace-demo.duckdb")
CLIENT_SERVICE = "tokentrace-demo-client"


def find_examples() -> Path:
    """Gives the folder of the demo's tiny LLM server and scenarios: `tokentrace.examples`,
    installed with the package (a wheel carries it too)."""
    import tokentrace.examples

    return Path(tokentrace.examples.__file__).resolve().parent


def _port(preferred: int, taken: set[int]) -> int:
    """Gives `preferred` when it is free on 127.0.0.1, else any free port."""
    for candidate in (preferred, 0):
        if candidate in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            port = int(s.getsockname()[1])
            if port not in taken:
                taken.add(port)
                return port
    return _port(0, taken)


def _port_taken(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) says an address is in use."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno == errno.EADDRINUSE:
            return True
        seen = seen.__cause__
    return False


def start_collector(db: Path, attempts: int = 3) -> tuple[Any, Any]:
    """Starts the demo's collector on 4318/4317/8600 when they are free, else on free
    ports; gives its settings and the running servers.

    A port found free can be taken before the collector binds it (another program,
    an outgoing connection's ephemeral port): the start is then tried again on
    other free ports."""
    from tokentrace.collector.settings import resolve
    from tokentrace.serve import start_servers
    from tokentrace.store.connection import keep_store_private

    for attempt in range(attempts):
        taken: set[int] = set()
        preferred = (4318, 4317, 8600) if attempt == 0 else (0, 0, 0)
        settings = resolve(
            {
                "db": db,
                "http_port": _port(preferred[0], taken),
                "grpc_port": _port(preferred[1], taken),
                "web_port": _port(preferred[2], taken),
                # the product default: client spans leave the demo process in batches
                # (every 0.5 s) and must reach their trace before it is decided
                "grace_s": 2.0,
            }
        )
        keep_store_private(settings.db)  # its WAL as private as the file (store/connection.py)
        try:
            return settings, start_servers(settings)
        except OSError as exc:
            if attempt + 1 == attempts or not _port_taken(exc):
                raise
    raise AssertionError("unreachable")


def _wait_written(
    conn: duckdb.DuckDBPyConnection, service: str, since_ns: int, expected: int, timeout_s: float
) -> int:
    """Waits until the collector has decided `expected` requests of `service` started at
    or after `since_ns` (this run's: a `--db` file may hold earlier runs'); gives how
    many it has."""
    deadline = time.monotonic() + timeout_s
    count = 0
    while True:
        cur = conn.cursor()
        try:
            row = cur.execute(
                "SELECT count(*) FROM requests WHERE service = ? AND start_ns >= ?",
                [service, since_ns],
            ).fetchone()
            count = int(row[0]) if row else 0
        finally:
            cur.close()
        if count >= expected or time.monotonic() >= deadline:
            # the client spans of the last requests may still be in their grace period
            return count
        time.sleep(0.25)


def _diagnose(conn: duckdb.DuckDBPyConnection, service: str, since_ns: int) -> dict[str, Any]:
    """Gives the report of `service`'s requests started at or after `since_ns` (this run's)."""
    from tokentrace.analyzer.filters import Filters
    from tokentrace.analyzer.report import build_report
    from tokentrace.store.snapshot import one_snapshot

    cur = conn.cursor()
    try:
        with one_snapshot(cur):
            return build_report(cur, Filters(service=service, start_ns=since_ns))
    finally:
        cur.close()


def since_option(started_ns: int) -> str:
    """Gives the `--since` option that keeps a report to requests started at or after
    `started_ns`, in whole UTC seconds (rounded down)."""
    started = datetime.fromtimestamp(started_ns // 10**9, tz=timezone.utc)
    return f"--since {started:%Y-%m-%dT%H:%M:%SZ}"


def _progress_printer(name: str, out: Any) -> Any:
    tty = out.isatty()
    last = [0.0]

    def show(done: int, total: int) -> None:
        now = time.monotonic()
        if tty and (done == total or now - last[0] > 0.1):
            last[0] = now
            width = 24
            filled = round(width * done / max(total, 1))
            out.write(
                f"\r  {name:<24} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} requests"
            )
            out.flush()

    return show


def summarize_findings(report: dict[str, Any]) -> list[str]:
    """Gives the compact per-scenario lines: top finding, its evidence, fix first."""
    findings = report.get("findings") or []
    req = report["requests"]
    kept = req["kept_traces"]
    lines = [f"  {counted(req['count'], 'request')} traced, {counted(kept, 'full trace')} kept"]
    if not findings:
        return [*lines, "  diagnosis: no complaint found"]
    top = findings[0]
    lines.append(
        f"  diagnosis: {top['complaint']} — {top['title']} (confidence {top['confidence'] * 100:.0f} %)"
    )
    for item in top.get("evidence", [])[:2]:
        text = item.get("text") if isinstance(item, dict) else str(item)
        lines.append(f"    evidence: {text}")
    lines.append(f"    fix first: {top['fix_first']}")
    if top.get("example_traces"):
        lines.append(f"    example trace: {top['example_traces'][0]}")
    others = [f["complaint"] for f in findings[1:]]
    if others:
        lines.append(f"    also found: {', '.join(others)}")
    return lines


def run_demo(args: argparse.Namespace) -> int:
    """The `tokentrace demo` command."""
    examples = find_examples()
    from tokentrace import instrumentation as tt
    from tokentrace.examples.load.generator import PromptBuilder
    from tokentrace.examples.scenarios import SCENARIOS, get_scenario, run_scenario

    wanted = getattr(args, "scenarios", None)
    scenarios = [get_scenario(n.strip()) for n in wanted.split(",")] if wanted else list(SCENARIOS)
    db = Path(args.db) if getattr(args, "db", None) else DEFAULT_DEMO_DB
    if not getattr(args, "db", None):
        # a fresh demo database each run (an explicit --db is appended to)
        for stale in (db, db.with_name(db.name + ".wal")):
            stale.unlink(missing_ok=True)
    out = sys.stdout
    try:
        settings, demo = start_collector(db)
    except (OSError, RuntimeError) as exc:
        raise SystemExit(f"tokentrace demo: the collector did not start: {exc}") from exc
    print(
        f"tokentrace demo: collector on {demo.otlp_http_url}, explorer on {demo.web_url}, db {settings.db}",
        flush=True,
    )
    print(
        f"examples: {examples}  ({'quick' if args.quick else 'full'} run, {len(scenarios)} scenarios)\n",
        flush=True,
    )
    tt.configure(endpoint=demo.otlp_http_url, service_name=CLIENT_SERVICE)
    log_dir = (
        Path(os.environ.get("TOKENTRACE_DEMO_LOGS", ""))
        if os.environ.get("TOKENTRACE_DEMO_LOGS")
        else None
    )
    prompts = PromptBuilder()
    summary: list[tuple[str, str | None, str | None]] = []
    run_started_ns = time.time_ns()
    try:
        for scenario in scenarios:
            print(f"▶ {scenario.name}: {scenario.story}", flush=True)
            # this run's requests of the scenario's service: an explicit --db may
            # hold an earlier run's (spans carry wall-clock times, as time_ns gives)
            since_ns = time.time_ns()
            run = run_scenario(
                scenario,
                demo.otlp_http_url,
                quick=args.quick,
                progress=_progress_printer(scenario.name, out),
                prompts=prompts,
                log_dir=log_dir,
            )
            tt.get_tracing().force_flush()
            if out.isatty():
                out.write("\n")
            ok = len(run.results) - run.errors
            _wait_written(demo.collector.conn, scenario.service, since_ns, ok, timeout_s=20.0)
            time.sleep(settings.grace_s + 0.5)  # client spans of the last requests
            print(f"  {len(run.results)} requests in {run.seconds:.1f} s ({run.errors} errors)")
            try:
                report = _diagnose(demo.collector.conn, scenario.service, since_ns)
            except Exception as exc:  # say so and go on: the traces are stored either way
                print(f"  diagnosis failed: {type(exc).__name__}: {exc}")
                summary.append((scenario.name, scenario.complaint, "(diagnosis failed)"))
                continue
            for line in summarize_findings(report):
                print(line)
            top = report["findings"][0]["complaint"] if report.get("findings") else None
            summary.append((scenario.name, scenario.complaint, top))
            print(flush=True)
        print("scenario                  expected                  diagnosed")
        for name, expected, top in summary:
            mark = "✓" if expected == top else "✗"
            print(f"{mark} {name:<23} {expected or '(none)':<25} {top or '(none)'}")
        if args.exit:  # the explorer stops with the demo: say how to bring it back
            print(f"\nexplore the traces: tokentrace serve --db {settings.db}   "
                  "(then http://127.0.0.1:8600, service = tiny-llm-<scenario>)", flush=True)  # fmt: skip
        else:
            print(f"\nexplore the traces: {demo.web_url}   (service = tiny-llm-<scenario>)", flush=True)
        # a --db file may hold earlier runs: the report keeps to this one's
        this_run = f" {since_option(run_started_ns)}" if getattr(args, "db", None) else ""
        print(f"once the demo stops, a scenario's report: tokentrace report --db {settings.db} "
              f"--service tiny-llm-<scenario>{this_run}", flush=True)  # fmt: skip
        if not args.exit:
            print("the explorer stays up; Ctrl-C to stop", flush=True)
            try:
                while True:
                    time.sleep(3600)
            except KeyboardInterrupt:
                print()
    finally:
        tt.shutdown()
        demo.stop()
    return 0
