"""The report's coverage in words: what the window's traces could show, and what not.

Every format (text, markdown, HTML, the explorer's diagnosis page) says it in these same
sentences, built from the report's `coverage` (docs/report.md, "Coverage").  A report from
an older server has none: then nothing is said.
"""

from __future__ import annotations

from typing import Any

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis.coverage import short

#: The heading every format puts over the coverage (text: lower case, as its other headings).
TITLE = "Coverage"
#: Said under the heading.
WHAT = "what this window's traces could show, and what they could not"
#: What a trace of no known convention needs, said after how many there were.
UNMATCHED_FIX = (
    "send spans of a convention tokentrace reads (docs/conventions.md), or wrap the call in "
    "the SDK's tt.request"
)


def _coverage(report: dict[str, Any]) -> dict[str, Any]:
    said = report.get("coverage")
    return said if isinstance(said, dict) else {}


def _listed(counts: dict[str, int], most: int = 4) -> str:
    shown = [f"{short(name)} {n:,}" for name, n in list(counts.items())[:most]]
    more = len(counts) - most
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


#: Where a request's token times came from (`requests.token_times_source`), as said aloud.
_TIMES_FROM = {"server": "from the server", "client": "from the client's chunks", "none": "none"}


def _token_times(counts: dict[str, int], requests: int) -> str:
    """Gives 'token times from the server on 6 requests, from the client's chunks on 111,
    none on 27' ('token times: none' where no request had any)."""
    said = [(_TIMES_FROM.get(k, short(k)), v) for k, v in counts.items() if v]
    if not said or said == [("none", requests)]:
        return "token times: none"
    first, *rest = [f"{what} on {n:,}" for what, n in said]
    return f"token times {first} {'request' if said[0][1] == 1 else 'requests'}" + "".join(
        f", {x}" for x in rest
    )


def signals_line(report: dict[str, Any]) -> str | None:
    """Gives the signals the window had, in one line ('signals: token times from the
    client's chunks on 96 requests, …')."""
    s = _coverage(report).get("signals") or {}
    n = int(s.get("requests") or 0)
    if not n:
        return None
    parts = [
        _token_times(s.get("token_times") or {}, n),
        f"client spans on {s.get('client_spans', 0):,} of {counted(n, 'request')}",
    ]
    steps = int(s.get("engine_steps") or 0)
    if steps:
        unknown = [
            name for name, key in (("batch size", "step_batch_sizes"), ("KV usage", "step_kv"))
            if not s.get(key)
        ]  # fmt: skip
        parts.append(counted(steps, "engine step") + (f" ({', '.join(unknown)} unknown)" if unknown else ""))
    else:
        parts.append("engine steps: none")
    gpu = int(s.get("gpu_samples") or 0)
    parts.append(counted(gpu, "GPU sample") if gpu else "GPU samples: none")
    envs = s.get("environments") or {}
    parts.append(f"environments: {_listed(envs)}" if envs else "environments: none")
    tenants = int(s.get("tenants") or 0)
    parts.append(counted(tenants, "tenant") if tenants else "tenants: none")
    classes = s.get("traffic_classes") or {}
    parts.append(f"traffic classes: {_listed(classes)}" if classes else "traffic classes: none")
    starts = int(s.get("engine_starts") or 0)
    if starts:
        parts.append(counted(starts, "engine start-up"))
    return "signals: " + "; ".join(parts)


def unchecked(report: dict[str, Any]) -> list[tuple[str, str]]:
    """Gives (complaint, what is missing and what to add) of each complaint the window could
    not check."""
    return [
        (str(c.get("complaint")), str(c.get("missing") or ""))
        for c in _coverage(report).get("complaints") or []
        if not c.get("checkable")
    ]


def checked(report: dict[str, Any]) -> list[str]:
    """Gives the complaints the window could check."""
    return [str(c.get("complaint")) for c in _coverage(report).get("complaints") or [] if c.get("checkable")]


def unmatched_line(report: dict[str, Any]) -> str | None:
    """Says how many traces matched no known convention, by root span, and what they need."""
    u = _coverage(report).get("unmatched_traces") or {}
    n = int(u.get("count") or 0)
    if not n:
        return None
    roots = u.get("roots") or []
    names = ", ".join(f"{short(r.get('name'))} ({int(r.get('count') or 0):,})" for r in roots)
    shown = sum(int(r.get("count") or 0) for r in roots)
    if shown < n:
        names += f", others ({n - shown:,})"
    return (
        f"{counted(n, 'trace')} matched no known span convention and gave no request row "
        f"(root spans: {names}): {UNMATCHED_FIX}."
    )


def has_coverage(report: dict[str, Any]) -> bool:
    """Whether the report carries a coverage to say (a report from an older server does not)."""
    return bool(_coverage(report))
