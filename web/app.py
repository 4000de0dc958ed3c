"""The web trace explorer: FastAPI app with HTML pages and their JSON twins.

Every page has a twin under `/api/...` built by the same data function; the
HTML is Jinja2 with autoescape on, so every value from spans is escaped.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import duckdb
import jinja2
from fastapi import FastAPI, Request
from fastapi.responses import (
    FileResponse,
    HTMLResponse,
    JSONResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from tokentrace.analyzer.export import write_requests
from tokentrace.store.connection import StoreError
from tokentrace.store.reader import StoreReader
from tokentrace.web import _format
from tokentrace.web._data_json import DataJSONResponse
from tokentrace.web._db import QueryTimeout, fetch_dicts
from tokentrace.web._export import to_chrome_trace, to_otlp_json
from tokentrace.web._guard import make_guard, secure
from tokentrace.web._overview import filter_choices, newest_start_ns, overview_data
from tokentrace.web._params import (
    ParamError,
    parse_limit,
    parse_search,
    parse_trace_id,
    parse_view_filters,
)
from tokentrace.web._report_cache import (
    REPORT_TIME_LIMIT_S,
    RETRY_AFTER_S,
    ReportCache,
    ReportsBusy,
)
from tokentrace.web._search import search_data, search_error
from tokentrace.web._span_details import span_details
from tokentrace.web._trace import (
    SpansNotKept,
    TraceNotFound,
    kept_spans,
    resolve_trace_prefix,
    trace_data,
)

logger = logging.getLogger("tokentrace.web")
HERE = Path(__file__).parent
CHOICES_TTL_S = 30.0
#: `/api/requests.{fmt}`: the formats of `tokentrace requests` and their media types
EXPORT_MEDIA_TYPES = {
    "jsonl": "application/x-ndjson",
    "csv": "text/csv; charset=utf-8",
    "parquet": "application/vnd.apache.parquet",
}
#: An export bigger than this is spooled to a temporary file
EXPORT_SPOOL_BYTES = 16 << 20


def error_status(exc: Exception) -> tuple[int, str]:
    """Maps an exception to its HTTP status and the message the user sees (never internals)."""
    if isinstance(exc, ParamError):
        return 400, str(exc)
    if isinstance(exc, TraceNotFound):
        return 404, str(exc)
    if isinstance(exc, (QueryTimeout, ReportsBusy)):
        return 503, str(exc)
    if isinstance(exc, StoreError):
        return 503, str(exc)
    if isinstance(exc, duckdb.OutOfMemoryException):
        # a long window over millions of requests outgrows DuckDB's memory bound
        return 503, (
            "the database ran out of memory computing this page over the whole window: pick a "
            "shorter window (e.g. the last 24 h), or start `serve` with a bigger "
            "--duckdb-memory-limit (default 256MB)"
        )
    return 500, "internal error; see the server log"


def retention_note(settings: Any) -> str | None:
    """Gives what a missing trace's 404 adds when the server deletes old data (`--retention`):
    a trace a cached diagnosis names, or a link kept from before, may have been deleted since."""
    retention = getattr(settings, "retention", None)
    if getattr(settings, "retention_s", None) is None or not retention:
        return None
    return (
        f"this server deletes data older than {retention} (--retention {retention}), so the "
        "trace may have been deleted since a page (or a diagnosis computed earlier) named it"
    )


@dataclass(frozen=True, slots=True)
class OtlpAddresses:
    """Where the serving collector takes OTLP: empty pages and `report --url` name them."""

    http_url: str  # http://host:port
    grpc_address: str  # host:port


def create_web_app(
    settings: Any,
    *,
    store: StoreReader | None = None,
    otlp: OtlpAddresses | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> FastAPI:
    """Gives the explorer app over `settings.db`, read through `store` when given (inside
    `tokentrace serve`: cursors of the writer's connection), else the file read-only.
    `otlp`: the addresses an empty page tells to send traces to; `clock` (monotonic
    seconds) dates the cached diagnosis reports, which pages say the age of."""
    db = store if store is not None else StoreReader(Path(settings.db))
    deleted_note = retention_note(settings)
    token: str | None = getattr(settings, "api_token", None) or None
    app = FastAPI(title="tokentrace", docs_url=None, redoc_url=None, openapi_url=None)
    # autoescape everything, not only *.html: every value from spans is untrusted
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(HERE / "templates")), autoescape=True
    )
    templates = Jinja2Templates(env=env)
    _format.install(templates.env)
    if otlp is not None:
        templates.env.globals["otlp"] = {"http": otlp.http_url, "grpc": otlp.grpc_address}
    # a query node over the lake takes no traces: its empty page names the shards instead
    templates.env.globals["lake"] = db.lake is not None
    app.mount("/static", StaticFiles(directory=str(HERE / "static")), name="static")
    reports = ReportCache(db, clock)
    app.state.db = db
    app.state.reports = reports
    choices_cache: dict[str, Any] = {}

    @app.middleware("http")
    async def server_timing(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        # the time the server spent, for browsers' devtools and benchmarks/bench_web.py
        started = time.perf_counter()
        response = await call_next(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.2f}"
        return response

    # Host check, token and security headers on every response; the outermost of our
    # middleware, so refusals and redirects carry the headers too
    app.middleware("http")(make_guard(getattr(settings, "host", "127.0.0.1"), token))

    def error_response(request: Request, status: int, message: str, headers: Any = None) -> Response:
        if request.url.path.startswith("/api/"):
            return secure(JSONResponse({"error": message}, status_code=status, headers=headers))
        return secure(
            templates.TemplateResponse(
                request,
                "error.html",
                {"status": status, "message": message, "page": ""},
                status_code=status,
                headers=headers,
            )
        )

    def fail(request: Request, exc: Exception) -> Response:
        status, message = error_status(exc)
        # a trace of which nothing is stored may have been deleted since a page named it
        if isinstance(exc, TraceNotFound) and not isinstance(exc, SpansNotKept) and deleted_note:
            message = f"{message}; {deleted_note}"
        if status == 500:
            logger.exception("web request %s failed", request.url.path, exc_info=exc)
        # too many distinct diagnoses pending: say when to come back
        headers = {"Retry-After": str(RETRY_AFTER_S)} if isinstance(exc, ReportsBusy) else None
        return error_response(request, status, message, headers)

    # one place maps the web's errors to responses: handlers just raise
    errors = (ParamError, TraceNotFound, StoreError, QueryTimeout, ReportsBusy, duckdb.Error)
    for error_type in errors:
        app.add_exception_handler(error_type, fail)  # type: ignore[arg-type]

    def crash(request: Request, exc: Exception) -> Response:
        # any other exception: the explorer's 500, with the security headers, never internals;
        # Starlette raises it on to the server afterwards, which logs the traceback
        return error_response(request, *error_status(exc))

    app.add_exception_handler(Exception, crash)

    def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # FastAPI's own 404/405 (a mistyped URL) as the explorer's error page, not {"detail": …}
        message = "no such page" if exc.status_code == 404 else str(exc.detail)
        return error_response(request, exc.status_code, message, exc.headers)

    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]

    def page(request: Request, name: str, data: dict[str, Any], **extra: Any) -> Response:
        return templates.TemplateResponse(request, name, {"data": data, **extra})

    def choices() -> dict[str, list[str]]:
        # the drop-downs change rarely and cost a scan each: refreshed every CHOICES_TTL_S
        now = time.monotonic()
        if choices_cache.get("at", -CHOICES_TTL_S) + CHOICES_TTL_S < now:
            with db.cursor() as cur:
                choices_cache.update(at=now, value=filter_choices(cur))
        value: dict[str, list[str]] = choices_cache["value"]
        return value

    # Handlers that query are sync (`def`): FastAPI runs them in its thread pool, so a long
    # query never blocks the event loop that also serves other pages. Those that wait for a
    # diagnosis report are async and await it (ReportCache.wait): a wait of minutes must
    # not hold one of the pool's threads (40), or a flood of them starves every page.

    @app.get("/", response_class=HTMLResponse)
    def overview_page(request: Request) -> Response:
        view = parse_view_filters(request.query_params)
        with db.cursor() as cur:
            data = overview_data(cur, view, reports)
        return page(
            request, "overview.html", data, page_name="overview", choices=choices(), view=view
        )

    @app.get("/api/overview")
    def overview_api(request: Request) -> Response:
        view = parse_view_filters(request.query_params)
        with db.cursor() as cur:
            return DataJSONResponse(overview_data(cur, view, reports))

    async def search(params: Any) -> dict[str, Any]:
        report = None
        if params.complaint is not None:  # its finding's traces: wait for the report
            cached, _ = await reports.wait(params.view, REPORT_TIME_LIMIT_S)
            report = cached.report if cached is not None else {}

        def query() -> dict[str, Any]:
            with db.cursor() as cur:
                return search_data(cur, params, report)

        return await run_in_threadpool(query)

    @app.get("/search", response_class=HTMLResponse)
    async def search_page(request: Request) -> Response:
        try:
            params: Any = parse_search(request.query_params)
            data = await search(params)
            status = 200
        except ParamError as exc:
            # the form again, as typed, with what is wrong beside it (a 400 all the same)
            params, data, status = None, search_error(request.query_params, str(exc)), 400
        response = await run_in_threadpool(
            lambda: page(
                request, "search.html", data, page_name="search", choices=choices(), params=params
            )
        )
        response.status_code = status
        return response

    @app.get("/api/search")
    async def search_api(request: Request) -> Response:
        data = await search(parse_search(request.query_params))
        return DataJSONResponse(data)

    @app.get("/trace")
    def trace_jump(request: Request, id: str = "") -> Response:
        tid = parse_trace_id(id.strip())
        with db.cursor() as cur:
            tid = resolve_trace_prefix(cur, tid)
        return RedirectResponse(f"/trace/{tid}", status_code=303)

    @app.get("/trace/{trace_id}", response_class=HTMLResponse)
    def trace_page(request: Request, trace_id: str) -> Response:
        tid = parse_trace_id(trace_id)
        with db.cursor() as cur:
            data = trace_data(cur, tid)
        return page(
            request, "trace.html", data, page_name="trace", details=span_details(data["spans"])
        )

    @app.get("/api/trace/{trace_id}")
    def trace_api(request: Request, trace_id: str) -> Response:
        tid = parse_trace_id(trace_id)
        with db.cursor() as cur:
            return DataJSONResponse(trace_data(cur, tid))

    @app.get("/api/trace/{trace_id}/otlp.json")
    def trace_otlp(request: Request, trace_id: str) -> Response:
        tid = parse_trace_id(trace_id)
        with db.cursor() as cur:
            spans = kept_spans(cur, tid)
        return DataJSONResponse(
            to_otlp_json(tid, spans),
            headers={"Content-Disposition": f'attachment; filename="trace-{tid}.otlp.json"'},
        )

    @app.get("/api/trace/{trace_id}/chrome.json")
    def trace_chrome(request: Request, trace_id: str) -> Response:
        tid = parse_trace_id(trace_id)
        with db.cursor() as cur:
            spans = kept_spans(cur, tid)
            steps = _steps_of_trace(cur, tid)
        return DataJSONResponse(
            to_chrome_trace(tid, spans, steps),
            headers={"Content-Disposition": f'attachment; filename="trace-{tid}.chrome.json"'},
        )

    @app.get("/diagnosis", response_class=HTMLResponse)
    async def diagnosis_page(request: Request) -> Response:
        view = parse_view_filters(request.query_params)
        data = await diagnosis(view)
        return await run_in_threadpool(
            lambda: page(
                request, "diagnosis.html", data, page_name="diagnosis", choices=choices(), view=view
            )
        )

    @app.get("/api/diagnosis")
    async def diagnosis_api(request: Request) -> Response:
        return DataJSONResponse(await diagnosis(parse_view_filters(request.query_params)))

    async def diagnosis(view: Any) -> dict[str, Any]:
        # raises ReportsBusy (503, Retry-After) when other diagnoses fill the queue
        cached, refreshing = await reports.wait(view, wait_s=REPORT_TIME_LIMIT_S)
        if cached is None:
            raise QueryTimeout("the diagnosis is still being computed; reload in a moment")
        report = cached.report
        otlp = templates.env.globals.get("otlp")
        if otlp:  # `report --url` on an empty server says where to send traces
            report = {**report, "otlp": otlp}
        if templates.env.globals.get("lake") and not report["requests"]["count"]:
            report = {**report, "lake": True}  # a query node's: the shards take the traces
        return {
            "filters": view.query(),
            "window": view.window,
            "report": report,
            "report_compute_s": round(cached.compute_s, 3),
            "report_age_s": round(reports.age_s(cached), 3),
            "report_refreshing": refreshing,
            "services": cached.services,
        }

    @app.get("/api/requests.{fmt}")
    def requests_export(request: Request, fmt: str) -> Response:
        """One row per request, as `tokentrace requests` writes it (`requests --url` asks here)."""
        if fmt not in EXPORT_MEDIA_TYPES:
            raise ParamError(f"format must be one of {', '.join(EXPORT_MEDIA_TYPES)}, not {fmt!r}")
        view = parse_view_filters(request.query_params)
        limit = parse_limit(request.query_params)
        # spooled: a big export goes to a temporary file, not the server's memory
        out = tempfile.SpooledTemporaryFile(max_size=EXPORT_SPOOL_BYTES)  # noqa: SIM115 - closed by the response
        try:
            with db.cursor() as cur:
                filters = view.resolve(newest_start_ns(cur))
            with db.cursor() as cur:  # a fresh cursor: DuckDB refuses one with a result open
                write_requests(cur, filters, fmt, out, limit)
            out.seek(0)
        except BaseException:
            out.close()
            raise
        return StreamingResponse(
            _chunks(out),
            media_type=EXPORT_MEDIA_TYPES[fmt],
            headers={"Content-Disposition": f'attachment; filename="requests.{fmt}"'},
        )

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:
        # pages link /static/favicon.svg; browsers still ask here for the JSON twins and exports
        return FileResponse(HERE / "static" / "favicon.svg", media_type="image/svg+xml")

    # the liveness probe: open without the token (web/_guard.py OPEN_PATHS), so it says
    # nothing but "ok"; HEAD too, which some load balancers' checks send. Async: answered on
    # the event loop, never queued behind pages that hold the thread pool
    @app.api_route("/healthz", methods=["GET", "HEAD"])
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def _chunks(out: IO[bytes], size: int = 1 << 20) -> Iterator[bytes]:
    """Gives `out` in chunks, then closes it (a streamed response's body)."""
    try:
        while chunk := out.read(size):
            yield chunk
    finally:
        out.close()


def _steps_of_trace(cur: duckdb.DuckDBPyConnection, trace_id: str) -> list[dict[str, Any]]:
    """Gives the engine steps that served any request of the trace, for the Chrome export."""
    rows, _ = fetch_dicts(
        cur,
        "SELECT e.start_ns, e.duration_us, e.batch_size, e.prefill_tokens, e.decode_seqs, e.queue_depth, "
        "e.kv_usage, true AS served FROM engine_steps e JOIN (SELECT request_id, start_ns, e2e_ms FROM requests "
        "WHERE trace_id = ?) r ON list_contains(e.request_ids, r.request_id) "
        "AND e.start_ns BETWEEN r.start_ns AND r.start_ns + CAST(r.e2e_ms * 1e6 AS BIGINT) ORDER BY e.start_ns",
        [trace_id],
        cap=20_000,
    )
    return rows
