"""`tokentrace report` and `tokentrace requests`: from the database, or from a running serve."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import IO

import duckdb

from tokentrace.analyzer.export import write_requests
from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.remote_report import fetch_report, fetch_requests
from tokentrace.analyzer.render import render_json, render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import StoreError, open_read_only
from tokentrace.store.serve_note import read_note

RENDERERS = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "html": render_html,
}


def open_local(db: Path, command: str) -> duckdb.DuckDBPyConnection:
    """Opens `db` read-only; a database held by `serve` gives an error that says what to do."""
    try:
        return open_read_only(db)
    except StoreError as exc:
        if "lock" in str(exc).lower():
            note = read_note(db)
            if note is None:  # an older serve, or another program: the default URL
                hint = f"e.g. `tokentrace {command} --url http://127.0.0.1:8600`"
            else:
                token = " --token TOKEN" if note["token"] else ""
                hint = f"`tokentrace {command} --url {note['web']}{token}` (serve pid {note['pid']})"
            raise StoreError(
                f"{exc}\nA running `tokentrace serve` holds this database: ask it instead, {hint}"
            ) from exc
        raise


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
    conn = open_local(args.db, "requests")
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
        text = renderer(fetch_report(url, filters, getattr(args, "token", None)))
    else:
        conn = open_local(args.db, "report")
        try:
            text = renderer(build_report(conn, filters))
        finally:
            conn.close()
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
