"""Query-string parameters of the pages: parsed, checked, and turned into typed values.

Every value a user types ends up either as a bound SQL parameter or, for
identifiers (sort column, bucket), as one entry of a fixed list checked here.
Anything else is a `ParamError`, which the app answers with 400 and the message.
"""

from __future__ import annotations

import base64
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from tokentrace.analyzer.filters import Filters
from tokentrace.analyzer.report_cli import iso_to_ns


class ParamError(ValueError):
    """A query-string parameter is malformed or out of range; the message says which."""


#: Selectable windows, ending at the newest request in the database.
WINDOWS_NS: dict[str, int | None] = {
    "5m": 5 * 60 * 10**9,
    "15m": 15 * 60 * 10**9,
    "1h": 3600 * 10**9,
    "6h": 6 * 3600 * 10**9,
    "24h": 24 * 3600 * 10**9,
    "7d": 7 * 24 * 3600 * 10**9,
    "all": None,
}
DEFAULT_WINDOW = "all"
BUCKETS = ("network", "queue", "prefill", "decode")
TRAFFIC_CLASSES = ("interactive", "batch")
_ID_RE = re.compile(r"^[0-9a-fA-F]{1,64}$")
_COMPLAINT_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
#: Filter values come from span data (model, tenant, service names): the drop-downs
#: offer what is stored, so the bound is generous; it only keeps parsing bounded.
MAX_FILTER_TEXT = 1_000
#: A text column sorts on its first SORT_PREFIX_CHARS characters (then trace id and the hash of
#: the request id): the cursor carries that prefix, so its size does not grow with what a sender wrote.
SORT_PREFIX_CHARS = 200
#: A cursor is base64 of the JSON [sort key, trace id, hash of the request id]: at most a
#: prefix of SORT_PREFIX_CHARS characters, each at most 6 bytes of JSON ("\u0000"), 64 hex
#: digits and a UBIGINT, about 1,800 characters in all.
_MAX_CURSOR = 2_000
#: The request id's hash (DuckDB's `hash`) is a UBIGINT.
_MAX_UBIGINT = 2**64 - 1
#: Times are unix nanoseconds in BIGINT columns: 1970-01-01 up to 2262-04-11.
_MAX_TIME_NS = 2**63 - 1
#: Most rows a LIMIT takes (a BIGINT); a cursor's numbers are BIGINT or DOUBLE values of a row.
_MAX_ROWS = _MAX_BIGINT = 2**63 - 1


def _digits(raw: str) -> bool:
    # str.isdigit() also says yes to '²' and other Unicode digits, which int() refuses
    return raw.isascii() and raw.isdigit()


def _text(params: Mapping[str, str], name: str, most: int = MAX_FILTER_TEXT) -> str | None:
    raw = params.get(name)
    if raw is None or raw.strip() == "":
        return None
    if len(raw) > most:
        raise ParamError(f"{name} is longer than {most} characters")
    return raw.strip()


def _float(params: Mapping[str, str], name: str) -> float | None:
    raw = _text(params, name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ParamError(f"{name} must be a number of milliseconds, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ParamError(f"{name} must be a finite number >= 0, not {raw!r}")
    return value


def _time_ns(params: Mapping[str, str], name: str) -> int | None:
    """Accepts unix nanoseconds or an ISO 8601 time (UTC unless it says otherwise)."""
    raw = _text(params, name)
    if raw is None:
        return None
    if _digits(raw):
        ns = int(raw)
    else:
        try:
            ns = iso_to_ns(raw, name)  # exact to the ns (a float lost ~µs: a row at the edge)
        except ValueError:
            raise ParamError(
                f"{name} must be unix nanoseconds or an ISO 8601 time, not {raw!r}"
            ) from None
    # outside this range DuckDB cannot compare it with start_ns, nor Python print it
    if not 0 <= ns <= _MAX_TIME_NS:
        raise ParamError(f"{name} must be between 1970-01-01 and 2262-04-11, not {raw!r}")
    return ns


def parse_trace_id(raw: str) -> str:
    """Gives a lowercase hex trace id, or raises ParamError."""
    if not _ID_RE.fullmatch(raw):  # not match(): '$' also matches before a trailing newline
        raise ParamError(f"trace id must be 1-64 hex digits, not {raw[:80]!r}")
    return raw.lower()


@dataclass(frozen=True, slots=True)
class ViewFilters:
    """The filters every page shares: window (or explicit range), model, tenant, class, service."""

    window: str = DEFAULT_WINDOW
    start_ns: int | None = None
    end_ns: int | None = None
    model: str | None = None
    tenant: str | None = None
    traffic_class: str | None = None
    service: str | None = None
    #: `start` / `end` as the user typed them (an ISO time, or ns): links and the form's from/to
    #: boxes give them back as typed. Not part of the filters' identity (the report cache's key).
    start_text: str | None = field(default=None, compare=False)
    end_text: str | None = field(default=None, compare=False)

    def resolve(self, newest_ns: int | None) -> Filters:
        """Gives the analyzer's Filters, the window ending at the newest request."""
        start, end = self.start_ns, self.end_ns
        span = WINDOWS_NS[self.window]
        if start is None and end is None and span is not None and newest_ns is not None:
            start, end = newest_ns - span, newest_ns + 1
        return Filters(start, end, self.model, self.tenant, self.traffic_class, self.service)

    def query(self) -> dict[str, str]:
        """Gives the filters as query-string values, for links that keep them."""
        out = {"window": self.window} if self.window != DEFAULT_WINDOW else {}
        for key, value in (
            ("start", self.start_text or self.start_ns),
            ("end", self.end_text or self.end_ns),
            ("model", self.model),
            ("tenant", self.tenant),
            ("class", self.traffic_class),
            ("service", self.service),
        ):
            if value is not None:
                out[key] = str(value)
        return out


def parse_view_filters(params: Mapping[str, str]) -> ViewFilters:
    window = _text(params, "window") or DEFAULT_WINDOW
    if window not in WINDOWS_NS:
        raise ParamError(f"window must be one of {', '.join(WINDOWS_NS)}, not {window!r}")
    # `traffic_class` as `tokentrace requests --traffic-class` spells it: an alias,
    # rather than a filter silently ignored
    traffic_class = _text(params, "class") or _text(params, "traffic_class")
    if traffic_class is not None and traffic_class not in TRAFFIC_CLASSES:
        raise ParamError(
            f"class must be one of {', '.join(TRAFFIC_CLASSES)}, not {traffic_class!r}"
        )
    start, end = _time_ns(params, "start"), _time_ns(params, "end")
    if start is not None and end is not None and end <= start:
        raise ParamError("end must be after start")
    return ViewFilters(
        window=window,
        start_ns=start,
        end_ns=end,
        start_text=_text(params, "start") if start is not None else None,
        end_text=_text(params, "end") if end is not None else None,
        model=_text(params, "model"),
        tenant=_text(params, "tenant"),
        traffic_class=traffic_class,
        service=_text(params, "service"),
    )


def parse_limit(params: Mapping[str, str]) -> int | None:
    """Gives the `limit` of an export: a positive number of rows, or None for all."""
    text = _text(params, "limit")
    if text is None:
        return None
    # digits only (int() also takes '1_000' and ' +1'), and no more than SQL's LIMIT holds
    if not _digits(text) or not 1 <= int(text) <= _MAX_ROWS:
        raise ParamError(f"limit must be a whole number 1..{_MAX_ROWS}, not {text!r}")
    return int(text)


#: Columns the search page sorts by; each is checked against the real schema too.
SORTABLE = (
    "start_ns", "e2e_ms", "ttft_ms", "ttft_client_ms", "tpot_ms", "network_ms", "queue_ms",
    "prefill_ms", "decode_ms", "itl_p99_ms", "itl_max_ms", "stall_count", "prompt_tokens",
    "output_tokens", "model", "tenant", "traffic_class", "service",
)  # fmt: skip
PAGE_SIZES = (1, 500)


@dataclass(frozen=True, slots=True)
class SearchParams:
    view: ViewFilters
    min_e2e_ms: float | None = None
    max_e2e_ms: float | None = None
    min_ttft_ms: float | None = None
    max_ttft_ms: float | None = None
    bucket: str | None = None
    complaint: str | None = None
    kept_only: bool = False
    errors_only: bool = False
    sort: str = "start_ns"
    descending: bool = True
    limit: int = 50
    after: tuple[Any, ...] | None = None

    def query(self, **override: Any) -> dict[str, str]:
        """Gives the search as query-string values; `override` replaces fields first."""
        p = replace(self, **override) if override else self
        out = p.view.query()
        for key, value in (
            ("min_e2e", p.min_e2e_ms),
            ("max_e2e", p.max_e2e_ms),
            ("min_ttft", p.min_ttft_ms),
            ("max_ttft", p.max_ttft_ms),
            ("bucket", p.bucket),
            ("complaint", p.complaint),
        ):
            if value is not None:
                out[key] = f"{value:g}" if isinstance(value, float) else str(value)
        if p.kept_only:
            out["kept"] = "1"
        if p.errors_only:
            out["error"] = "1"
        if p.sort != "start_ns" or not p.descending:
            out["sort"] = p.sort
            out["order"] = "desc" if p.descending else "asc"
        if p.limit != 50:
            out["limit"] = str(p.limit)
        if p.after is not None:
            out["after"] = encode_cursor(p.after)
        return out


def _flag(params: Mapping[str, str], name: str) -> bool:
    raw = (_text(params, name) or "0").lower()
    if raw in ("1", "true", "yes", "on"):
        return True
    if raw in ("0", "false", "no", "off"):
        return False
    raise ParamError(f"{name} must be 1 or 0, not {raw!r}")


def _utf8(text: str) -> bool:
    """Whether `text` is UTF-8 text DuckDB takes (JSON can hold lone surrogates: "\\ud800")."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def encode_cursor(key: tuple[Any, ...]) -> str:
    """Gives the opaque keyset cursor for `key`: (sort key, trace id, hash of the request id)."""
    text = json.dumps(list(key), ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def decode_cursor(raw: str) -> tuple[Any, ...]:
    try:
        padded = raw + "=" * (-len(raw) % 4)
        key = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, TypeError):
        raise ParamError("after is not a cursor this page gave out") from None
    if (
        not isinstance(key, list)
        or len(key) != 3
        or not all(isinstance(k, (str, int, float)) and not isinstance(k, bool) for k in key)
        or not isinstance(key[1], str)
        or not isinstance(key[2], int)
        # a row's sort key is a BIGINT, a finite DOUBLE or a text's prefix: anything else
        # DuckDB refuses to compare
        or (isinstance(key[0], int) and not -_MAX_BIGINT - 1 <= key[0] <= _MAX_BIGINT)
        or (isinstance(key[0], float) and not math.isfinite(key[0]))
        or (isinstance(key[0], str) and (len(key[0]) > SORT_PREFIX_CHARS or not _utf8(key[0])))
        or not _ID_RE.fullmatch(key[1])
        or not 0 <= key[2] <= _MAX_UBIGINT
    ):
        raise ParamError("after is not a cursor this page gave out")
    return tuple(key)


def parse_search(params: Mapping[str, str]) -> SearchParams:
    view = parse_view_filters(params)
    bucket = _text(params, "bucket")
    if bucket is not None and bucket not in BUCKETS:
        raise ParamError(f"bucket must be one of {', '.join(BUCKETS)}, not {bucket!r}")
    complaint = _text(params, "complaint")
    if complaint is not None and not _COMPLAINT_RE.match(complaint):
        raise ParamError(f"complaint must be a complaint id such as 'stutter', not {complaint!r}")
    sort = _text(params, "sort") or "start_ns"
    if sort not in SORTABLE:
        raise ParamError(f"sort must be one of {', '.join(SORTABLE)}, not {sort!r}")
    order = (_text(params, "order") or "desc").lower()
    if order not in ("asc", "desc"):
        raise ParamError(f"order must be asc or desc, not {order!r}")
    raw_limit = _text(params, "limit") or "50"
    if not _digits(raw_limit) or not PAGE_SIZES[0] <= int(raw_limit) <= PAGE_SIZES[1]:
        raise ParamError(
            f"limit must be an integer {PAGE_SIZES[0]}..{PAGE_SIZES[1]}, not {raw_limit!r}"
        )
    after_raw = _text(params, "after", _MAX_CURSOR)
    bounds = {name: _float(params, name) for name in ("min_e2e", "max_e2e", "min_ttft", "max_ttft")}
    for measure in ("e2e", "ttft"):
        low, high = bounds[f"min_{measure}"], bounds[f"max_{measure}"]
        if low is not None and high is not None and low > high:
            raise ParamError(
                f"min_{measure} ({low:g} ms) is more than max_{measure} ({high:g} ms): "
                "no request could match"
            )
    out = SearchParams(
        view=view,
        min_e2e_ms=bounds["min_e2e"],
        max_e2e_ms=bounds["max_e2e"],
        min_ttft_ms=bounds["min_ttft"],
        max_ttft_ms=bounds["max_ttft"],
        bucket=bucket,
        complaint=complaint,
        kept_only=_flag(params, "kept"),
        errors_only=_flag(params, "error"),
        sort=sort,
        descending=order == "desc",
        limit=int(raw_limit),
        after=decode_cursor(after_raw) if after_raw else None,
    )
    return out
