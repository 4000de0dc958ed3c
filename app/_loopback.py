"""Whether a `Host` header names this machine: the guard against DNS rebinding.

A server bound to a loopback address is out of other machines' reach, but not
out of a browser's on this one: a page on another site whose name an attacker
re-points at 127.0.0.1 (DNS rebinding) talks to it as its own origin, with no
CORS check in the way.  Such a request still says the attacker's name in its
`Host` header, so a loopback-bound server answers only requests whose `Host`
names this machine (`localhost`, `127.0.0.1`, `[::1]`, any port), as Jupyter
does.  The explorer (reading traces) and the OTLP/HTTP receiver (writing them)
both check it, each against the address it binds itself (`--host` and
`--otlp-host` may differ).
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

#: Host names that always mean this machine.
_LOCAL_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address, IPv6 with or without brackets) is this machine only."""
    name = host.strip().strip("[]").rstrip(".").lower()
    if name in _LOCAL_NAMES or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str | None:
    """Gives the host name of a `Host` header (`[::1]:8600` → `::1`), None when malformed."""
    try:
        parts = urlsplit("//" + header)
        _ = parts.port  # raises ValueError on a port that is no number
    except ValueError:
        return None
    return parts.hostname


def foreign_host(header: str | None) -> bool:
    """Whether a request with this `Host` header (None: none sent) must be refused by a
    loopback-bound server: it names another machine, or is malformed.  HTTP/1.0
    without `Host` is no browser, so no rebinding."""
    if header is None:
        return False
    name = _host_name(header)
    return name is None or not is_loopback(name)


def refusal_message(header: str, server: str, flag: str = "--host") -> str:
    """Says why `server` (e.g. "the explorer") refused a request whose `Host` is `header`;
    `flag` is the option that sets the address `server` binds."""
    return (
        f"Host {header[:100]!r} is not this machine: {server} listens on a loopback address and "
        "answers only http://127.0.0.1:…, http://localhost:… or http://[::1]:… (this guards "
        f"against DNS rebinding; bind another address with {flag} to serve others)"
    )


def host_port(host: str, port: int) -> str:
    """Gives `host:port` as gRPC targets and URLs write it: an IPv6 literal in
    brackets (`[::1]:4317`; grpc reads a bare `::1:4317` as a misformatted name)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"
