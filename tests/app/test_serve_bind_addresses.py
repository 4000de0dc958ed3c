"""Which addresses `serve` binds, and what it says when it cannot.

- An IPv6 literal (`--host ::1`, `--otlp-host ::1`) serves OTLP/gRPC, OTLP/HTTP and the
  web UI, and every URL it writes puts the address in brackets (`http://[::1]:8600`).
- A host name binds every address it resolves to (uvicorn and grpc both do), so the
  port check before the start checks each of them: a busy second address of
  `localhost` is named before the store is opened.
- A port taken between that check and the bind ends the start with one line naming
  the server, the address and the cause: no SystemExit(3), no asyncio noise.

Real `tokentrace serve` processes where the output is what is checked; addresses are
loopback ones only.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from otlp_traces import request_trace, to_protobuf
from tt_testkit import free_port

from tokentrace.collector.collector import Collector
from tokentrace.collector.grpc_receiver import TRACE_SERVICE, start_grpc_server
from tokentrace.collector.settings import CollectorSettings
from tokentrace.serve import CollectorServer
from tokentrace.store.connection import open_read_only
from tokentrace.store.serve_note import read_note

PB = {"Content-Type": "application/x-protobuf"}
#: what each port flag serves, as the errors name it
SERVED = {"--http-port": "OTLP/HTTP", "--grpc-port": "OTLP/gRPC", "--web-port": "web UI"}
SETTING = {"--http-port": "http_port", "--grpc-port": "grpc_port", "--web-port": "web_port"}


def _ipv6_loopback() -> str | None:
    """Gives why ::1 cannot be used here, None when it can."""
    if not socket.has_ipv6:
        return "Python was built without IPv6"
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
    except OSError as exc:
        return f"this machine has no IPv6 loopback ({exc.strerror})"
    return None


needs_ipv6 = pytest.mark.skipif(_ipv6_loopback() is not None, reason=str(_ipv6_loopback()))


def _store_files(db: Path) -> list[str]:
    return sorted(p.name for p in db.parent.iterdir() if p.name.startswith(db.name))


# ---- 1. an IPv6 literal ------------------------------------------------------------


@pytest.mark.slow
@needs_ipv6
@pytest.mark.parametrize("flag", ["--host", "--otlp-host"])
def test_serve_on_the_ipv6_loopback(tmp_path: Path, flag: str) -> None:
    db = tmp_path / "t.duckdb"
    # free_port: never the same port twice (a bare bind(0) can give a just-closed port back,
    # and serve refuses equal ports, even one on ::1 and one on 127.0.0.1)
    http_port, grpc_port = free_port("::1"), free_port("::1")
    web_host = "[::1]" if flag == "--host" else "127.0.0.1"
    web_port = free_port("::1") if flag == "--host" else free_port()
    cmd = [sys.executable, "-m", "tokentrace", "-v", "serve", "--db", str(db), flag, "::1",
           "--http-port", str(http_port), "--grpc-port", str(grpc_port),
           "--web-port", str(web_port), "--decode-processes", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True
    )
    out: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # up to the line printed once every server is up
            out.append(line)
            if "OTLP/HTTP on" in line:
                break
        assert proc.poll() is None, "".join(out)
        otlp = f"http://[::1]:{http_port}"
        r = httpx.post(f"{otlp}/v1/traces", content=to_protobuf(request_trace()).SerializeToString(),
                       headers=PB, timeout=10)  # fmt: skip
        assert r.status_code == 200, r.text
        with grpc.insecure_channel(f"[::1]:{grpc_port}") as channel:
            export = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
            export(to_protobuf(request_trace()).SerializeToString(), timeout=10)
        assert httpx.get(f"http://{web_host}:{web_port}/healthz", timeout=10).status_code == 200
        note = read_note(db)  # what `report --db` then tells the user to open
        assert note is not None and note["web"] == f"http://{web_host}:{web_port}"
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    text = "".join(out) + rest
    assert proc.returncode == 0, text
    assert (
        f"OTLP/HTTP [::1]:{http_port}, OTLP/gRPC [::1]:{grpc_port}, web {web_host}:{web_port}"
        in text
    )
    conn = open_read_only(db)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (2,)
    finally:
        conn.close()


def test_a_grpc_bind_failure_does_not_guess_at_a_busy_port(tmp_path: Path) -> None:
    address = "192.0.2.1"  # TEST-NET-1: documentation only, never this machine's
    try:
        with socket.socket() as s:
            s.bind((address, 0))
        pytest.skip(f"{address} is an address of this machine")
    except OSError:
        pass
    collector = Collector(CollectorSettings(db=tmp_path / "g.duckdb", decode_processes=0))
    try:
        with pytest.raises(OSError) as failed:
            start_grpc_server(collector.pipeline, address, 0, 1 << 20)
        assert f"cannot serve OTLP/gRPC on {address}:0" in str(failed.value)
        assert "port in use" not in str(failed.value)
        # the serve start names the OS's reason (check_ports probes the address itself)
        settings = CollectorSettings(db=tmp_path / "s.duckdb", otlp_host=address,
                                     http_port=0, grpc_port=free_port(), web_port=0)  # fmt: skip
        with pytest.raises(OSError, match=rf"OTLP/gRPC on {address}:\d+: [A-Z].*address"):
            CollectorServer(settings)
    finally:
        collector.close()


@needs_ipv6
def test_grpc_serves_an_ipv6_literal(tmp_path: Path) -> None:
    collector = Collector(CollectorSettings(db=tmp_path / "g.duckdb", decode_processes=0))
    try:
        server, port = start_grpc_server(collector.pipeline, "::1", 0, 1 << 20)
        try:
            with grpc.insecure_channel(f"[::1]:{port}") as channel:
                export = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
                export(to_protobuf(request_trace()).SerializeToString(), timeout=10)
        finally:
            server.stop(grace=None).wait(5)
    finally:
        collector.close()


# ---- 2. every address of a name -----------------------------------------------------


def _localhost_addresses() -> list[str]:
    infos = socket.getaddrinfo("localhost", 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    return list(dict.fromkeys(str(sa[0]) for *_, sa in infos))


@pytest.fixture
def two_address_localhost(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """`localhost` resolving to 127.0.0.1 and then ::1, as on a machine whose hosts file
    names both (this one's may name one): only the resolver's answer is made up, every
    bind is real."""
    if _ipv6_loopback() is not None:
        pytest.skip(str(_ipv6_loopback()))
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "localhost":
            return real("127.0.0.1", port, *args, **kwargs) + real("::1", port, *args, **kwargs)
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield ["127.0.0.1", "::1"]


def _held_on(address: str) -> socket.socket:
    """A socket listening on `address` only, on a port free on every loopback address."""
    v6 = ":" in address
    while True:
        sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
        if v6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((address, 0))
        port = sock.getsockname()[1]
        try:  # the other family's loopback address stays free on that port
            with socket.socket(socket.AF_INET if v6 else socket.AF_INET6) as other:
                other.bind(("127.0.0.1" if v6 else "::1", port))
        except OSError:
            sock.close()
            continue
        sock.listen()
        return sock


def _bracketed(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@pytest.mark.parametrize("flag", list(SERVED))
def test_a_busy_second_address_of_a_name_is_named_before_the_start(
    tmp_path: Path, two_address_localhost: list[str], flag: str
) -> None:
    second = two_address_localhost[1]
    with _held_on(second) as held:
        port = held.getsockname()[1]
        ports = {"http_port": free_port(), "grpc_port": free_port(), "web_port": free_port()}
        ports[SETTING[flag]] = port
        db = tmp_path / "t.duckdb"
        settings = CollectorSettings(db=db, host="localhost", decode_processes=0, **ports)
        with pytest.raises(OSError) as failed:
            CollectorServer(settings)
    assert str(failed.value) == (
        f"cannot serve {SERVED[flag]} on localhost:{port} (its address {_bracketed(second)}:{port}): "
        f"Address already in use (choose another port with {flag})"
    )
    assert _store_files(db) == []


@pytest.mark.parametrize("flag", list(SERVED))
def test_a_busy_second_address_of_localhost_stops_a_real_serve(tmp_path: Path, flag: str) -> None:
    addresses = _localhost_addresses()
    if len(addresses) < 2:
        pytest.skip(f"localhost resolves to {addresses} here, one address")
    second = addresses[1]
    with _held_on(second) as held:
        port = held.getsockname()[1]
        ports = {f: str(port if f == flag else free_port()) for f in SERVED}
        db = tmp_path / "t.duckdb"
        cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(db), "--host", "localhost",
               "--decode-processes", "0", *(x for f, p in ports.items() for x in (f, p))]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"{_bracketed(second)}:{port}): Address already in use" in done.stderr, done.stderr
    assert _store_files(db) == []


# ---- 3. a port taken after the check --------------------------------------------------

#: Runs `tokentrace serve ARGS` as `python -c LATE WHEN ARGS...` where another program
#: takes a port between the start's check and its bind.  WHEN: the setting whose port
#: is taken right after `check_ports` (the store and the servers are then being made),
#: or "grpc-bind" for the gRPC port taken at the last moment, inside the gRPC start.
LATE = r"""
import socket, sys

import tokentrace.serve as serving
from tokentrace.cli import main

when, args = sys.argv[1], sys.argv[2:]
taken = []


def take(host, port):
    sock = socket.socket()
    sock.bind((host, port))
    sock.listen()
    taken.append(sock)


if when == "grpc-bind":
    real_start = serving.start_grpc_server

    def start_grpc_server(pipeline, host, port, *rest):
        take(host, port)
        return real_start(pipeline, host, port, *rest)

    serving.start_grpc_server = start_grpc_server
else:
    checked = serving.check_ports

    def check_then_lose_the_port(settings):
        checked(settings)
        take(settings.host if when == "web_port" else settings.otlp_bind_host, getattr(settings, when))

    serving.check_ports = check_then_lose_the_port
sys.exit(main(["serve", *args]))
"""

#: a line grpc's C core logs itself (absl: severity, date, time, thread, file:line)
GRPC_CORE_LOG = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ \S+:\d+\] ")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "when"),
    [
        ("--http-port", "http_port"),
        ("--grpc-port", "grpc_port"),
        ("--web-port", "web_port"),
        ("--grpc-port", "grpc-bind"),
    ],
)
def test_a_port_taken_after_the_check_ends_the_start_with_one_line(
    tmp_path: Path, flag: str, when: str
) -> None:
    ports = {f: free_port() for f in SERVED}
    db = tmp_path / "t.duckdb"
    args = ["--db", str(db), "--decode-processes", "0",
            *(x for f, p in ports.items() for x in (f, str(p)))]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run([sys.executable, "-c", LATE, when, *args],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    # grpc's own log line, where grpc itself tried the bind, is not ours to silence
    lines = [line for line in done.stderr.splitlines() if not GRPC_CORE_LOG.match(line)]
    assert lines == [
        f"tokentrace serve: cannot serve {SERVED[flag]} on 127.0.0.1:{ports[flag]}: "
        f"Address already in use (choose another port with {flag})"
    ], done.stderr
    assert _store_files(db) == []
