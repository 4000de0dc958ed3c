"""Test helpers shared by every test folder: free loopback ports, a real `tokentrace serve`
process, uvicorn in a thread, a file or directory this process cannot write.  Import as
`from tt_testkit import ...` (pyproject puts `tests/` on the path); a uniquely named
module, because `conftest` names collide.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

_given_ports: set[int] = set()
_given_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """Gives a TCP port on `host` (127.0.0.1, or an IPv6 literal such as ::1) that was free a
    moment ago, never the same one twice in a test process, whatever the address: the kernel
    may hand a just-closed port straight back, and a test that asks for three ports in a row
    once started `serve` with its OTLP/HTTP and web ports equal (`serve` refuses two equal
    port numbers even on different addresses)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with _given_lock:
        while True:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _given_ports:
                _given_ports.add(port)
                return port


def bound_socket(port: int = 0) -> socket.socket:
    """Gives a TCP socket bound on 127.0.0.1 (not listening yet), for a server to take over:
    `port` 0, a port of the kernel's choice that `free_port` never gives (it is kept in the
    same registry).  A port picked with bind-and-close and bound again by the server later
    could be taken in between: by any other bind(0) (gRPC's port 0 in `start_live`, another
    test run's `free_port`), and the server then failed to start.

    Made with proto IPPROTO_TCP, as `getaddrinfo` gives it: asyncio sets TCP_NODELAY only on
    connections accepted from such a socket.  Without it, a response written in two parts
    (headers, then body) waited for the client's delayed ACK: 45 ms each keep-alive request."""
    with _given_lock:
        rejected: list[socket.socket] = []
        try:
            while True:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
                try:
                    if port:  # as uvicorn binds a port it is given
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("127.0.0.1", port))
                except BaseException:
                    sock.close()
                    raise
                got = int(sock.getsockname()[1])
                if port or got not in _given_ports:
                    _given_ports.add(got)
                    return sock
                rejected.append(sock)  # held until the loop ends: not given back at once
        finally:
            for sock in rejected:
                sock.close()


def wait_for_port(
    port: int, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read().decode() if proc.stdout else ""
            raise RuntimeError(f"server exited with {proc.returncode}: {out}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError(f"port {port} did not open in {timeout} s")


@dataclass
class ServeProcess:
    proc: subprocess.Popen[bytes]
    db: Path
    http_port: int
    grpc_port: int
    web_port: int

    @property
    def otlp_http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def otlp_grpc(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def rows(self, sql: str, params: list[object] | None = None) -> list[tuple[object, ...]]:
        """Gives the rows of `sql` on the stopped server's database (opened read-only)."""
        from tokentrace.store.connection import open_read_only

        conn = open_read_only(self.db)
        try:
            return conn.execute(sql, params or []).fetchall()
        finally:
            conn.close()

    def stop(self, timeout: float = 30.0) -> str:
        """SIGTERMs the server (it decides and flushes everything) and gives its output."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is None or self.proc.stdout.closed:
            return ""
        out = self.proc.stdout.read().decode()
        self.proc.stdout.close()
        return out


#: how many times `start_serve` starts `serve` on new ports when one of its ports was taken
SERVE_START_TRIES = 3


def start_serve(tmp_path: Path, *extra: str, db: Path | None = None) -> ServeProcess:
    """Starts `tokentrace serve` as a real subprocess on free loopback ports.

    The ports were free when picked, and `serve` binds them a second or more later (its
    start): another program (another test run on this machine) may bind one in between.
    That start ends with "Address already in use" and is tried again on new ports."""
    for tries_left in range(SERVE_START_TRIES - 1, -1, -1):
        try:
            return _start_serve_once(tmp_path, extra, db)
        except _PortTaken:
            if not tries_left:
                raise
    raise AssertionError("unreachable")


class _PortTaken(RuntimeError):
    """`serve` could not start: one of its ports was taken before it bound it."""


def serve_port_args(ports: tuple[int, int, int] | list[int] | None = None) -> list[str]:
    """Gives `serve`'s port options for (OTLP/HTTP, OTLP/gRPC, web) `ports`; free ones if None."""
    http, grpc, web = ports or (free_port(), free_port(), free_port())
    return ["--http-port", str(http), "--grpc-port", str(grpc), "--web-port", str(web)]


def _start_serve_once(tmp_path: Path, extra: tuple[str, ...], db: Path | None) -> ServeProcess:
    db = db or tmp_path / "tokentrace.duckdb"
    ports = [free_port(), free_port(), free_port()]
    cmd = [
        sys.executable, "-m", "tokentrace", "serve",
        "--db", str(db),
        *serve_port_args(ports),
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    server = ServeProcess(proc, db, *ports)
    try:
        wait_started(server)
    except Exception as exc:
        out = server.stop()
        if server.proc.returncode != 0 and "Address already in use" in f"{exc} {out}":
            raise _PortTaken(f"{exc} {out}") from exc
        raise
    return server


def wait_started(server: ServeProcess, timeout: float = 60.0) -> None:
    """Waits until `server` has finished starting: every port accepts connections and its
    note beside the database names its pid (written last, once every server is up; what
    `report --db` reads to name the server's URL).  The OTLP/HTTP port opens before the
    rest of the start is done: when only it was waited for, the note was not there yet at
    every one of 20 starts tried, and a test's next step raced the end of the start."""
    deadline = time.monotonic() + timeout
    for port in (server.http_port, server.grpc_port, server.web_port):
        wait_for_port(port, max(0.0, deadline - time.monotonic()), server.proc)
    from tokentrace.store.serve_note import read_note

    while (note := read_note(server.db)) is None or note["pid"] != server.proc.pid:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited with {server.proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise TimeoutError(f"serve wrote no note beside {server.db} in {timeout} s")
        time.sleep(0.02)


@contextmanager
def machine_share(run_dir: Path, alone: bool) -> Iterator[None]:
    """Holds the machine shared with the other pytest-xdist workers of the run whose files
    are in `run_dir`, or to itself (`alone`) while the block runs.

    A test marked `alone` (the demo's real-time load) waits for the tests running on other
    workers to end, and they wait for it: a file lock that every test holds shared and an
    `alone` test holds exclusive.  The turnstile lets an `alone` test in before tests that
    asked after it, or the other workers' stream of tests would hold it off."""
    with open(run_dir / "machine.turnstile", "a") as turnstile, open(run_dir / "machine.lock", "a") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(turnstile, fcntl.LOCK_UN)


@contextmanager
def unwritable(path: Path) -> Iterator[None]:
    """Makes the file or directory `path` unwritable to this process and its children
    while the block runs, undone in a `finally`: `chattr +i` (immutable) as root, whom
    file modes do not stop (the tests run as root here), `chmod a-w` otherwise.  Skips
    the test where the file system takes no immutable attribute."""
    import pytest

    if os.geteuid() != 0:
        mode = stat.S_IMODE(path.stat().st_mode)
        path.chmod(mode & ~0o222)
        try:
            yield
        finally:
            path.chmod(mode)
        return
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip(f"no chattr to make {path} immutable")
    done = subprocess.run([chattr, "+i", str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot make {path} immutable: {done.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True, capture_output=True)


class ThreadServer:
    """Runs an ASGI app under uvicorn in a daemon thread on 127.0.0.1; a context manager.

    Its socket is bound here, before the thread starts (`bound_socket`): uvicorn serves on
    that socket, so no other bind can take the port between the pick and the start.
    `sock`: a socket from `bound_socket` to serve on (the caller needed its port first)."""

    def __init__(
        self, app: object, port: int | None = None, sock: socket.socket | None = None
    ) -> None:
        import uvicorn

        self.sock = sock if sock is not None else bound_socket(port or 0)
        self.port = int(self.sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,  # type: ignore[arg-type]
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        # a loaded machine may take seconds to start uvicorn's thread
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                self.__exit__()
                raise RuntimeError("server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        if not self.thread.is_alive():  # (uvicorn closes it as it stops: never under its feet)
            self.sock.close()  # closed already when uvicorn served on it; not when it never did


class OtlpHttpSink:
    """An OTLP/HTTP endpoint on 127.0.0.1 that keeps each export's path and body (what
    the SDK sent where); answers 200, or 404 on a path outside `paths` (None: any path).

    With `gated`, an export is kept at once but answered only once `gate` is set (a
    collector slower than the spans that end, held as long as a test needs; at most
    `GATE_HOLD_AT_MOST_S`).  Bound on port 0 at once: a port picked first could be taken
    before the bind."""

    #: the longest an export waits on a closed gate (a safety net: tests open it)
    GATE_HOLD_AT_MOST_S = 60.0

    def __init__(self, paths: tuple[str, ...] | None = None, gated: bool = False) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.posts: list[tuple[str, bytes]] = []
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self._lock = lock = threading.Lock()
        self._received = received = threading.Condition(lock)
        posts, gate, hold_s = self.posts, self.gate, self.GATE_HOLD_AT_MOST_S

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a collector answers

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                kept = paths is None or self.path in paths
                if kept:
                    with received:
                        posts.append((self.path, body))
                        received.notify_all()
                    gate.wait(hold_s)
                self.send_response(200 if kept else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wait_for_posts(self, count: int, timeout_s: float = 30.0) -> bool:
        """Waits until `count` exports have come in (held at the gate or answered)."""
        with self._received:
            return self._received.wait_for(lambda: len(self.posts) >= count, timeout_s)

    def span_names(self, path: str = "/v1/traces") -> list[str]:
        """The names of the spans exported to `path`, in order."""
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
        )

        return [
            span.name
            for body in self.bodies(path)
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        ]

    def bodies(self, path: str | None = None) -> list[bytes]:
        """The bodies sent (to `path`, or anywhere), in order."""
        with self._lock:
            return [body for p, body in self.posts if path is None or p == path]

    def paths(self) -> set[str]:
        with self._lock:
            return {p for p, _ in self.posts}

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def build_wheel(out: Path) -> Path:
    """Gives the path of a wheel of this checkout, built into `out` (offline, no dependencies)."""
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)]
    try:
        import setuptools  # noqa: F401

        cmd.insert(4, "--no-build-isolation")  # build with what is installed: fast, offline
    except ImportError:
        pass
    subprocess.run(cmd, check=True, capture_output=True)
    (whl,) = out.glob("tokentrace-*.whl")
    return whl


def install_wheel(wheel: Path, site: Path) -> dict[str, str]:
    """Installs `wheel` alone into `site`; gives an environment whose `tokentrace` is that copy.

    The copy comes first on the path, ahead of the editable install's finder;
    dependencies still come from site-packages."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    return {**os.environ, "PYTHONPATH": str(site)}


def explorer(db: Path, api_token: str | None = None, host: str = "127.0.0.1") -> AbstractContextManager[str]:
    """Serves the explorer over `db` while the block runs and gives its URL (`host`: the
    address `serve` would bind, for its Host check)."""
    from tokentrace.collector.settings import CollectorSettings
    from tokentrace.web.app import create_web_app

    return serving(create_web_app(CollectorSettings(db=db, api_token=api_token, host=host)))


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serves the explorer `app` (from `create_web_app`) while the block runs; gives its URL."""
    server = ThreadServer(app)
    with server:
        try:
            yield server.url
        finally:
            state = server.server.config.app.state  # type: ignore[attr-defined]
            # wait for a report still computing: DuckDB refuses to close a connection it runs on
            state.reports.close(wait=True)
            state.db.close()

