"""`tokentrace report` and `tokentrace requests`: from the database, or from a running serve."""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path
from typing import IO

import duckdb

from tokentrace.analyzer.export import write_requests
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.remote_report import fetch_report, fetch_requests
from tokentrace.analyzer.render import render_json, render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import DatabaseHeld, open_read_only, resolve_db_path
from tokentrace.store.snapshot import one_snapshot

RENDERERS = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "html": render_html,
}


def open_local(db: Path | None, command: str) -> duckdb.DuckDBPyConnection:
    """Opens `db` read-only; a database another process holds gives what to run instead
    (`held`: the running serve's URL, or that an import is writing it), not DuckDB's
    lock message."""
    try:
        return open_read_only(resolve_db_path(db))
    except DatabaseHeld as exc:
        raise exc.for_command(command) from exc


def open_store(args: argparse.Namespace, command: str) -> duckdb.DuckDBPyConnection:
    """Opens what `command` reads: the lake (`args.lake`, read-only, its tables in use: the
    analyzer's SQL reads it as a file) or the database file `args.db`."""
    lake = getattr(args, "lake", None)
    if lake:
        from tokentrace.store.reader import LakeAddress, open_lake_reader

        return open_lake_reader(LakeAddress(lake, getattr(args, "lake_data", None)))
    return open_local(args.db, command)


#: A duration ago for `--since` / `--until`: 10m, 2h, 1d, 90s, 1d12h (a unit is required).
_DURATION = re.compile(r"(?:\d+(?:\.\d+)?[dhms])+")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([dhms])")
_UNIT_NS = {"d": 86_400 * 10**9, "h": 3_600 * 10**9, "m": 60 * 10**9, "s": 10**9}
#: What `--since` / `--until` take, as the errors and `--help` say it.
WHEN_FORMS = "ISO 8601 (2026-11-21T10:00:00Z; UTC unless it says otherwise) or a duration ago (10m, 2h, 1d)"


#: The fraction of a second of an ISO 8601 time (after the seconds, before the zone): read
#: apart as integer nanoseconds, since datetime keeps only microseconds and float seconds
#: since 1970 lose even those (…20.000001Z became …001024 ns).
_FRACTION = re.compile(r"(?<=\d)[.,](\d+)(?=[zZ]|[+-]\d|$)")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
#: Digits of a fraction of a second that nanoseconds hold.
MAX_FRACTION_DIGITS = 9


def iso_to_ns(text: str, option: str) -> int:
    """Gives ISO 8601 `text` in unix ns, exactly (UTC unless it says otherwise)."""
    fraction_ns, said = 0, text
    found = _FRACTION.search(text)
    if found:
        digits = found.group(1)
        if len(digits) > MAX_FRACTION_DIGITS:
            raise ValueError(
                f"{option} {said!r}: at most {MAX_FRACTION_DIGITS} digits after the seconds (nanoseconds)"
            )
        fraction_ns = int(digits.ljust(MAX_FRACTION_DIGITS, "0"))
        text = text[: found.start()] + text[found.end() :]
    try:
        t = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{option} {said!r} is neither: use {WHEN_FORMS}") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=timezone.utc)
    since_epoch = t - _EPOCH  # whole seconds and microseconds: integers, no float on the way
    seconds = since_epoch.days * 86_400 + since_epoch.seconds
    return seconds * 10**9 + since_epoch.microseconds * 1_000 + fraction_ns


def parse_when(text: str | None, now_ns: int, option: str = "--since") -> int | None:
    """Gives `text` in unix ns: an ISO 8601 time (to the nanosecond, exactly), or a duration
    before `now_ns` (`10m`, `2h`, `1d`, `1d12h`); None when not given. Raises ValueError
    naming `option`."""
    if not text:
        return None
    raw = text.strip().lower().replace(" ", "")
    if _DURATION.fullmatch(raw):
        ago = sum(Fraction(n) * _UNIT_NS[unit] for n, unit in _DURATION_PART.findall(raw))
        return max(0, now_ns - int(ago))  # further back than 1970: everything
    return iso_to_ns(text.strip(), option)


def window_bounds(
    since: str | None, until: str | None, now_ns: int | None = None
) -> tuple[int | None, int | None]:
    """Gives `--since` / `--until` as unix ns (one "now" for both durations); raises
    ValueError for text that is neither form, or an empty window."""
    now_ns = time.time_ns() if now_ns is None else now_ns
    start_ns, end_ns = parse_when(since, now_ns, "--since"), parse_when(until, now_ns, "--until")
    if start_ns is not None and end_ns is not None and end_ns <= start_ns:
        # an empty window is a typo, not a report of zero requests
        raise ValueError(f"--until {until} is not after --since {since}")
    return start_ns, end_ns


def run_requests(args: argparse.Namespace, filters: Filters) -> int:
    """`tokentrace requests`: from the database, or from a running server with `--url`.

    With `--output` the rows go to a `.part` file beside it, renamed into place
    once complete: a failed export leaves an earlier file as it was.
    """
    if args.format == "parquet" and args.output is None and sys.stdout.isatty():
        raise SystemExit("tokentrace: parquet is binary: pass --output FILE")
    if args.output is None:
        _export_requests(args, filters, sys.stdout.buffer)
        return 0
    part = args.output.with_name(args.output.name + ".part")
    try:
        with open(part, "wb") as out:
            _export_requests(args, filters, out)
        os.replace(part, args.output)
    finally:
        part.unlink(missing_ok=True)
    return 0


def _export_requests(args: argparse.Namespace, filters: Filters, out: IO[bytes]) -> None:
    if args.url:
        fetch_requests(args.url, filters, args.format, out, args.limit, args.token)
        return
    conn = open_store(args, "requests")
    try:
        write_requests(conn, filters, args.format, out, args.limit)
    finally:
        conn.close()


def run_report(args: argparse.Namespace, filters: Filters) -> int:
    renderer = RENDERERS.get(args.format)
    if renderer is None:
        raise ValueError(f"report format {args.format!r} is not available yet")
    url = getattr(args, "url", None)
    if url:
        report = fetch_report(url, filters, getattr(args, "token", None))
        # the HTML report links its example traces to the explorer it came from
        text = render_html(report, explorer=url) if renderer is render_html else renderer(report)
    else:
        conn = open_store(args, "report")
        try:
            with one_snapshot(conn):  # the figures agree; a lake's catalog is read once
                report = build_report(conn, filters)
            if getattr(args, "lake", None) and not report["requests"]["count"]:
                report["lake"] = True  # its empty message names the shards, not an OTLP port
            text = renderer(report)
        finally:
            conn.close()
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
