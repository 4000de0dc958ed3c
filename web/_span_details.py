"""The trace page's span details: what a click on a waterfall row shows, as text in one JSON block.

A trace may hold 5,000 spans; rendered up front, their hidden detail tables made the
page 5.9 MB and 205,000 DOM nodes. The page carries them instead as one
`application/json` block that `static/app.js` reads when a row is clicked, building the
table with `textContent` only (so every value stays text, and no inline script is
needed: the CSP forbids them). Each value is already the text the page shows: lists and
maps as JSON, long lists summarized (`_long_values`), and a value longer than
MAX_SHOWN_CHARS cut, as `[cut text, length]`, which app.js follows with `clip_note`.
The block holds strings and numbers only, so no NaN reaches `JSON.parse`.
"""

from __future__ import annotations

import json
from typing import Any

from tokentrace.web._format import CLIPPED_NOTE, MAX_SHOWN_CHARS, ms, value
from tokentrace.web._long_values import ListSummary

#: What each of a span's `rows` is, said once for all the spans.
ROW_LABELS = ("span id", "kind / status", "start / duration", "scope")
#: A value as the block carries it: its text, or [its first MAX_SHOWN_CHARS characters, its length].
Shown = str | list[Any]


def shown(v: Any) -> Shown:
    """Gives the text the page shows for an attribute value (cut when too long)."""
    text = v.text() if isinstance(v, ListSummary) else value(v)
    return text if len(text) <= MAX_SHOWN_CHARS else [text[:MAX_SHOWN_CHARS], len(text)]


def _pairs(attributes: dict[str, Any]) -> list[list[Shown]]:
    return [[shown(str(k)), shown(v)] for k, v in attributes.items()]


def span_details(spans: list[dict[str, Any]]) -> dict[str, Any]:
    """Gives the details of the waterfall's spans (`_trace.waterfall`), in its row order.

    `spans[i]` is the i-th row's: `rows` (the values of ROW_LABELS, which `labels` gives:
    id, kind and status, times, scope), `attributes` ([key, value] pairs), `events` ([offset, name, attribute pairs]),
    `links` ([trace id, span id]) and `resource` (an index into `resources`, which each
    distinct resource appears in once: the spans of one process share it)."""
    resources: list[list[list[Shown]]] = []
    resource_index: dict[str, int] = {}
    out = []
    for sp in spans:
        key = json.dumps(sp["resource"], sort_keys=True, default=str)
        if key not in resource_index:
            resource_index[key] = len(resources)
            resources.append(_pairs(sp["resource"]))
        status = f"{sp['kind']} / {sp['status']} {sp['status_message'] or ''}".rstrip()
        out.append(
            {
                "rows": [
                    shown(sp["span_id"]),
                    shown(status),
                    f"+{ms(sp['start_ms'], 3)} / {ms(sp['duration_ms'], 3)}",
                    shown(sp["scope"] or ""),  # a span with no scope: nothing, not "null"
                ],
                "attributes": _pairs(sp["attributes"]),
                "events": [
                    [f"+{ms(e['offset_ms'], 3)}", shown(str(e.get("name", ""))), _pairs(e["attributes"])]
                    for e in sp["events"]
                ],
                "links": [
                    [str(lk.get("trace_id", "")), str(lk.get("span_id", ""))] for lk in sp["links"]
                ],
                "resource": resource_index[key],
            }
        )
    return {"labels": ROW_LABELS, "spans": out, "resources": resources, "clip_note": CLIPPED_NOTE}
