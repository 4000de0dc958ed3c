"""What every response passes through: the Host check, the bearer token, the security headers.

The explorer serves traces (prompts, tenants) to whoever can reach its port, so:

- bound to a loopback address, it answers only requests whose `Host` names this
  machine (`tokentrace._loopback`: DNS rebinding is refused);
- with a token, every route (pages, API, exports, static files) needs it, compared
  in constant time and never echoed, except the liveness probe `GET /healthz`
  (`{"status": "ok"}` and nothing else), which load balancers and Kubernetes ask
  without secrets;
- every response, refusals and errors included, carries the security headers.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response

from tokentrace._loopback import foreign_host, is_loopback, refusal_message

TOKEN_COOKIE = "tokentrace_token"


def token_cookie(port: int | None) -> str:
    """Gives the token cookie's name for the explorer on `port`: cookies are not
    kept apart by port, so two explorers on one machine would overwrite each
    other's token (and each would send its token to the other)."""
    return TOKEN_COOKIE if port is None else f"{TOKEN_COOKIE}_{port}"


def _server_port(request: Request) -> int | None:
    server = request.scope.get("server")
    return server[1] if server and server[1] else None


#: Scripts only from our own /static: even a value that escaped escaping could not run.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate it
    "Referrer-Policy": "no-referrer",
    # other sites may not embed the API's JSON or the exports (<script src>, <img>)
    "Cross-Origin-Resource-Policy": "same-origin",
}


def secure(response: Response) -> Response:
    """Gives `response` with the security headers (those it set itself are kept)."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def host_refusal(request: Request) -> Response | None:
    """Gives a 403 when the request's `Host` header names another machine, else None."""
    header = request.headers.get("host")
    if not foreign_host(header):
        return None
    return JSONResponse({"error": refusal_message(header or "", "the explorer")}, status_code=403)


def token_check(token: str, request: Request) -> Response | None:
    """Gives the response that refuses (401) or redirects (`?token=`) `request`; None lets it through."""
    expected = token.encode()
    given = request.query_params.get("token")
    if given is not None and hmac.compare_digest(given.encode(), expected):
        # a browser link with ?token= once: set the cookie, drop the token from the URL;
        # one leading slash only: browsers read `//evil.example` (and `/\\evil.example`) as another site
        rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
        target = "/" + request.url.path.lstrip("/\\") + (f"?{urlencode(rest)}" if rest else "")
        redirect = RedirectResponse(target, status_code=303)
        redirect.set_cookie(
            token_cookie(_server_port(request)), token, httponly=True, samesite="strict"
        )
        return redirect
    header = request.headers.get("authorization", "")
    bearer = header[7:] if header.lower().startswith("bearer ") else ""
    cookie = request.cookies.get(token_cookie(_server_port(request)), "")
    if any(hmac.compare_digest(v.encode(), expected) for v in (bearer, cookie) if v):
        return None
    return JSONResponse(
        {
            "error": "a bearer token is required (Authorization: Bearer …, or open a page once with ?token=…)"
        },
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


#: Answered without the token (Host is still checked): what a liveness probe asks, and its
#: answer says nothing about the traces (Grafana's /api/health, Jaeger's health port alike).
#: `/readyz` is a query node's (app/query_node.py): whether the lake's catalog answers.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})


def needs_token(request: Request) -> bool:
    """Whether `request` must carry the token: all but a GET/HEAD of a liveness path."""
    return not (request.method in ("GET", "HEAD") and request.url.path in OPEN_PATHS)


Guard = Callable[[Request, Callable[[Request], Awaitable[Response]]], Awaitable[Response]]


def make_guard(bind_host: str, token: str | None) -> Guard:
    """Gives the middleware that checks Host (when bound to loopback) and the token (but for
    `OPEN_PATHS`), then adds headers."""
    check_host = is_loopback(bind_host)

    async def guard(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        refusal = host_refusal(request) if check_host else None
        if refusal is None and token is not None and needs_token(request):
            refusal = token_check(token, request)
        return secure(refusal if refusal is not None else await call_next(request))

    return guard
