"""Jinja filters that format the pages' numbers and times the same way everywhere."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup

from tokentrace._words import noun
from tokentrace.analyzer import render_coverage
from tokentrace.analyzer.diagnosis import COMPLAINTS, TITLES
from tokentrace.analyzer.diagnosis._base import MIN_REQUESTS
from tokentrace.analyzer.render import (
    ITL_APPROXIMATE,
    KEEP_MORE_OPTIONS,
    LATENCY_TERMS,
    NO_EXAMPLES,
    approximate,
    coverage_notes,
    shows_no_examples,
)

#: The problems the diagnosis checks for, in its order: (complaint id, what it says in words).
#: The search page's complaint choice and the "no findings" note name them.
CHECKS: tuple[tuple[str, str], ...] = tuple((c, TITLES[c]) for c in COMPLAINTS)


def ms(value: Any, digits: int = 1) -> str:
    """Gives a millisecond figure for people: '—' when not measured, seconds from 1 s on.

    Seconds keep one decimal more than the millisecond form asks for ('912.4 ms',
    '1.29 s'), like the analyzer's evidence text ('E2E p95 7.29 s'); the switch is
    decided on the rounded figure, so 999.97 ms reads '1.00 s', not '1,000.0 ms'.
    `duration.text` in static/app.js writes the charts' legends the same way (a browser
    test holds the two to the same output).
    """
    if value is None:
        return "—"
    v = float(value)
    if abs(round(v, digits)) < 1000:
        return f"{v:,.{digits}f} ms"
    return f"{v / 1000:,.{digits + 1}f} s"


def num(value: Any, digits: int = 0) -> str:
    return "—" if value is None else f"{float(value):,.{digits}f}"


def counted(n: Any, one: str) -> str:
    """Gives a count with its noun, '1 token' / '1,095 tokens' ('—' when not measured)."""
    return "—" if n is None else f"{int(n):,} {noun(int(n), one)}"


def pct(value: Any, digits: int = 1) -> str:
    """Gives a 0..1 share as a percent ('9.7 %'); a finding's confidence is whole ('72 %', as
    `tokentrace report` writes it: `pct(v, 0)`)."""
    return "—" if value is None else f"{float(value) * 100:.{digits}f} %"


def when(ns: Any) -> str:
    """Gives a unix-ns time as UTC ISO with milliseconds."""
    if ns is None:
        return "—"
    dt = datetime.fromtimestamp(int(ns) / 1e9, tz=timezone.utc)
    return dt.strftime("%Y-%m-%d %H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"


def ago(seconds: Any) -> str:
    """Gives how long ago something happened, `seconds` ago: 'just now', '42 s ago', '3 min ago'."""
    if seconds is None:
        return "—"
    s = int(float(seconds))
    if s < 1:
        return "just now"
    if s < 60:
        return f"{s} s ago"
    if s < 3600:
        return f"{s // 60} min ago"
    return f"{s // 3600} h ago"


def qs(params: dict[str, Any], **override: Any) -> str:
    """Gives a query string from `params` with `override` applied (None removes a key)."""
    merged = {**params, **override}
    return urlencode({k: v for k, v in merged.items() if v is not None})


def value(v: Any) -> str:
    """Gives an attribute value as readable text (lists and maps as JSON); the template escapes it."""
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)


#: Most characters of one value a page shows: a span may carry a 100 KB model name or
#: attribute, which would make the page megabytes wide and long. Longer ones are cut here.
MAX_SHOWN_CHARS = 1_000
#: What follows a cut value: how long it is and where the whole of it is.
CLIPPED_NOTE = "… {chars} characters in all; the whole value is in the trace's OTLP JSON export"


def clip_note(chars: int) -> str:
    """Gives the note after a value cut at MAX_SHOWN_CHARS, saying its length and where the rest is."""
    return CLIPPED_NOTE.format(chars=f"{chars:,}")


def clip(v: Any, most: int = MAX_SHOWN_CHARS) -> str:
    """Gives `v` as text of at most `most` characters; a longer value is cut, followed by a
    note (`CLIPPED_NOTE`) in a `small.clipped`. The value is escaped either way."""
    text = "" if v is None else v if isinstance(v, str) else str(v)
    if len(text) <= most:
        return text  # a plain str: autoescape escapes it
    return Markup('{}<small class="clipped">{}</small>').format(text[:most], clip_note(len(text)))


def cut(v: Any, most: int = MAX_SHOWN_CHARS) -> str:
    """Gives `v` as plain text of at most `most` characters, "…" marking a cut: for attribute
    values (a `title`, an `<option>`), which hold no markup."""
    text = "" if v is None else v if isinstance(v, str) else str(v)
    return text if len(text) <= most else text[:most] + "…"


def install(env: jinja2.Environment) -> None:
    env.filters.update(
        ms=ms, num=num, counted=counted, pct=pct, when=when, value=value, clip=clip, cut=cut, ago=ago
    )
    env.globals.update(
        qs=qs, checks=CHECKS, min_diagnosis_requests=MIN_REQUESTS, coverage_notes=coverage_notes,
        approximate=approximate, itl_approximate=ITL_APPROXIMATE, latency_terms=LATENCY_TERMS,
        shows_no_examples=shows_no_examples, no_examples=NO_EXAMPLES.format(**KEEP_MORE_OPTIONS),
        has_coverage=render_coverage.has_coverage, coverage_title=render_coverage.TITLE,
        coverage_what=render_coverage.WHAT, coverage_signals=render_coverage.signals_line,
        coverage_unchecked=render_coverage.unchecked, coverage_checked=render_coverage.checked,
        coverage_unmatched=render_coverage.unmatched_line,
    )
