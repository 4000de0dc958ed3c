"""The report of a running `tokentrace serve`, fetched from its JSON API.

DuckDB lets one process open a database file, so while `serve` holds it the
report comes from the server's `/api/diagnosis` — the same `build_report`
data, computed inside the server.
"""

from __future__ import annotations

import os
import time
from typing import Any

from tokentrace.analyzer.filters import Filters

#: Bearer token for a server started with `--api-token` (same variable as serve's).
TOKEN_ENV = "TOKENTRACE_API_TOKEN"
#: How long to wait while the server is still computing a first report.
WAIT_S = 120.0


class RemoteReportError(RuntimeError):
    """The server could not be reached or refused the request."""


def _params(filters: Filters) -> dict[str, str]:
    params = {"window": "all"}
    for name, key in (("start_ns", "start"), ("end_ns", "end"), ("model", "model"),
                      ("tenant", "tenant"), ("traffic_class", "class"), ("service", "service")):  # fmt: skip
        value = getattr(filters, name)
        if value is not None:
            params[key] = str(value)
    return params


def fetch_report(url: str, filters: Filters, token: str | None = None, wait_s: float = WAIT_S) -> dict[str, Any]:
    """Gives the report of the server at `url` (its web port) for `filters`."""
    import httpx

    token = token or os.environ.get(TOKEN_ENV)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    endpoint = url.rstrip("/") + "/api/diagnosis"
    deadline = time.monotonic() + wait_s
    while True:
        try:
            response = httpx.get(endpoint, params=_params(filters), headers=headers, timeout=60)
        except httpx.HTTPError as exc:
            raise RemoteReportError(f"cannot reach {endpoint}: {exc}") from exc
        if response.status_code == 503 and time.monotonic() < deadline:
            time.sleep(1.0)  # the first report of a window is still being computed
            continue
        if response.status_code != 200:
            try:
                message = response.json().get("error", response.text)
            except ValueError:
                message = response.text
            raise RemoteReportError(f"{endpoint} answered {response.status_code}: {message}")
        body = response.json()
        report = body.get("report") if isinstance(body, dict) else None
        if not isinstance(report, dict):
            raise RemoteReportError(f"{endpoint} gave no report")
        return report
