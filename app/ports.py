"""Binding the servers' ports: sockets for every address of a host, and errors that
name the server, its address, the OS's reason and the flag to change."""

from __future__ import annotations

import errno
import socket
from typing import Any

from tokentrace._loopback import host_port
from tokentrace.collector.settings import CollectorSettings

#: Each server's port flag, named when its port is busy.
PORT_FLAGS = {"OTLP/HTTP": "http-port", "OTLP/gRPC": "grpc-port", "web UI": "web-port"}


def bare_host(host: str) -> str:
    """Gives `host` as sockets take it: an IPv6 literal without its URL brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _addresses(host: str, port: int) -> list[tuple[int, int, int, Any]]:
    """Gives every address a server on `host:port` binds, as asyncio's `create_server`
    (uvicorn) and grpc resolve them: all of getaddrinfo's answers, so a name such as
    `localhost` is often two (::1 and 127.0.0.1); "" means every interface."""
    infos = socket.getaddrinfo(
        bare_host(host) or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    return list(dict.fromkeys((family, kind, proto, sa) for family, kind, proto, _, sa in infos))


def bind_sockets(host: str, port: int, what: str) -> list[socket.socket]:
    """Gives sockets bound (not yet listening) to every address of `host:port`, with
    the options asyncio's `create_server` sets; raises OSError naming the server, the
    address and the cause.  `port` 0: the first address picks one, the others take it."""
    try:
        addresses = _addresses(host, port)
    except OSError as exc:  # socket.gaierror: a name that does not resolve
        where = host_port(host, port)
        raise OSError(f"cannot serve {what} on {where}: {exc.strerror or exc}") from exc
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, address in addresses:
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            # as the servers do: a port left in TIME_WAIT by a stopped server is free
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:  # each family its own socket, as asyncio's
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind((address[0], port, *address[2:]))
            except OSError as exc:
                raise _bind_error(what, host, port, address[0], exc) from exc
            port = port or int(sock.getsockname()[1])
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _bind_error(what: str, host: str, port: int, address: str, exc: OSError) -> OSError:
    """Gives the error of a bind that failed: the server, its address (and the one of
    the name's that failed), the OS's reason and, for a busy port, the flag to change."""
    where = host_port(host, port)
    if address != bare_host(host):
        where += f" (its address {host_port(address, port)})"
    hint = f" (choose another port with --{PORT_FLAGS[what]})" if exc.errno == errno.EADDRINUSE else ""
    return OSError(f"cannot serve {what} on {where}: {exc.strerror or exc}{hint}")


def check_bindable(host: str, port: int, what: str) -> None:
    """Raises OSError naming the server and the cause when an address of `host:port`
    cannot be bound.  The servers' own errors say neither: uvicorn exits with
    SystemExit(3) from its thread, grpc raises "Failed to bind" (and serves on what
    it could bind of a name's addresses, so a busy one would go unnoticed)."""
    if port == 0:
        return
    for sock in bind_sockets(host, port, what):
        sock.close()


def check_ports(settings: CollectorSettings) -> None:
    """Raises OSError naming the first server whose address cannot be bound.

    Runs before the store is opened, so a busy port leaves no new database
    file behind (and an existing one untouched)."""
    otlp = settings.otlp_bind_host
    check_bindable(otlp, settings.http_port, "OTLP/HTTP")
    check_bindable(otlp, settings.grpc_port, "OTLP/gRPC")
    check_bindable(settings.host, settings.web_port, "web UI")
