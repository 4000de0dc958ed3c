"""`tokentrace report`: open the database read-only, build the report, render it."""

from __future__ import annotations

import argparse
import sys

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.render import render_json, render_markdown, render_text
from tokentrace.analyzer.render_html import render_html
from tokentrace.analyzer.report import build_report
from tokentrace.store.connection import open_read_only

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
    conn = open_read_only(args.db)
    try:
        text = renderer(build_report(conn, filters))
    finally:
        conn.close()
    if args.output is not None:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0
