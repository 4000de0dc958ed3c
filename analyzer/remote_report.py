"""The report and the requests of a running `tokentrace serve`, fetched from its API.

DuckDB lets one process open a database file, so while `serve` holds it the
report comes from the server's `/api/diagnosis` — the same `build_report`
data, computed inside the server — and `tokentrace requests` from its
`/api/requests.{jsonl,csv,parquet}`, the same rows written by the server.
"""

from __future__ import annotations

import os
import time
from typing import IO, Any

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


def _headers(token: str | None) -> dict[str, str]:
    token = token or os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def _refused(endpoint: str, status: int, body: bytes) -> RemoteReportError:
    """Gives the error for a refusal, with the server's own message where it sent one."""
    import json

    text = body.decode("utf-8", "replace")
    try:
        doc = json.loads(text)
        message = doc.get("error", text) if isinstance(doc, dict) else text
    except ValueError:
        message = text
    if status == 404:
        # the usual cause: --url names the OTLP port (4318), not the web UI's
        message += " (is --url the web UI's address? `tokentrace serve` prints it; default http://127.0.0.1:8600)"
    return RemoteReportError(f"{endpoint} answered {status}: {message}")


def fetch_requests(
    url: str,
    filters: Filters,
    fmt: str,
    out: IO[bytes],
    limit: int | None = None,
    token: str | None = None,
) -> None:
    """Writes the requests of the server at `url` (its web port) for `filters` to `out`, as `fmt`."""
    import httpx

    endpoint = url.rstrip("/") + f"/api/requests.{fmt}"
    params = _params(filters)
    if limit is not None:
        params["limit"] = str(limit)
    try:
        with httpx.stream(
            "GET", endpoint, params=params, headers=_headers(token), timeout=300
        ) as response:
            if response.status_code != 200:
                raise _refused(endpoint, response.status_code, response.read())
            for chunk in response.iter_bytes():
                out.write(chunk)
    except httpx.HTTPError as exc:
        raise RemoteReportError(f"cannot reach {endpoint}: {exc}") from exc
    out.flush()


def fetch_report(
    url: str, filters: Filters, token: str | None = None, wait_s: float = WAIT_S
) -> dict[str, Any]:
    """Gives the report of the server at `url` (its web port) for `filters`."""
    import httpx

    headers = _headers(token)
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
            raise _refused(endpoint, response.status_code, response.content)
        body = response.json()
        report = body.get("report") if isinstance(body, dict) else None
        if not isinstance(report, dict):
            raise RemoteReportError(f"{endpoint} gave no report")
        return report
