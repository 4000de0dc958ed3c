"""`tokentrace report`: open the database read-only, build the report, render it."""

from __future__ import annotations

import argparse
import sys

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.remote_report import fetch_report
from tokentrace.analyzer.render import render_json, render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import StoreError, open_read_only

RENDERERS = {
    "text": render_text,
    "markdown": render_markdown,
    "json": render_json,
    "html": render_html,
}


def run_report(args: argparse.Namespace, filters: Filters) -> int:
    renderer = RENDERERS.get(args.format)
    if renderer is None:
        raise ValueError(f"report format {args.format!r} is not available yet")
    url = getattr(args, "url", None)
    if url:
        text = renderer(fetch_report(url, filters, getattr(args, "token", None)))
    else:
        try:
            conn = open_read_only(args.db)
        except StoreError as exc:
            if "lock" in str(exc).lower():
                raise StoreError(
                    f"{exc}\nA running `tokentrace serve` holds this database: ask it instead, "
                    "e.g. `tokentrace report --url http://127.0.0.1:8600`"
                ) from exc
            raise
        try:
            text = renderer(build_report(conn, filters))
        finally:
            conn.close()
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
