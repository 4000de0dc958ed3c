"""The collector process: store, writer, sampler and pipeline wired from settings."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import signal
import socket
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tokentrace._loopback import host_port
from tokentrace.collector.decode_pool import DecodePool, steps_dropped_total
from tokentrace.collector.gc_tuning import tune_for_ingest
from tokentrace.collector.grpc_receiver import start_grpc_server
from tokentrace.collector.http_receiver import create_http_app
from tokentrace.collector.otlp import (
    OtlpDecodeError,
    decode_json,
    parse_trace_request,
    spans_from_request,
)
from tokentrace.collector.pipeline import Pipeline
from tokentrace.collector.retention import Retention
from tokentrace.collector.sampling import P99Tracker, Sampler, SloLimits, parse_rules
from tokentrace.collector.self_metrics import CollectorMetrics
from tokentrace.collector.settings import CollectorSettings
from tokentrace.collector.writer import Writer
from tokentrace.store.connection import DatabaseHeld, open_db, resolve_db_path
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS
from tokentrace.store.serve_note import read_note, remove_note, unclean_stop, write_note

logger = logging.getLogger("tokentrace.collector")


class Collector:
    """Owns the one write connection and the pipeline in front of it."""

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self.metrics = CollectorMetrics(db=settings.db)
        self.conn = open_db(
            settings.db,
            memory_limit=settings.duckdb_memory_limit,
            checkpoint_threshold=settings.duckdb_checkpoint_threshold,
        )
        try:
            self._wire(settings)
        except BaseException:
            # stop the writer thread and close the file: else the file stays
            # locked, and DuckDB's binding reports leaked objects at exit
            if hasattr(self, "writer"):
                self.writer.close()
            self.conn.close()
            raise
        self._closed = False

    def _wire(self, settings: CollectorSettings) -> None:
        self.writer = Writer(
            self.conn,
            max_pending=settings.max_pending_writes,
            on_write=self.metrics.write_latency.observe,
        )
        self.sampler = Sampler(
            baseline=settings.baseline,
            slo=SloLimits(settings.slo_ttft_ms, settings.slo_e2e_ms, settings.slo_itl_ms),
            rules=parse_rules(settings.keep_rules),
            p99=P99Tracker(min_samples=settings.p99_min_samples, warmup=settings.p99_warmup),
        )
        self.pipeline = Pipeline(
            self.writer,
            self.sampler,
            max_buffered_spans=settings.max_buffered_spans,
            max_buffered_bytes=settings.max_buffered_bytes,
            grace_s=settings.grace_s,
            server_wait_s=settings.server_wait_s,
            client_wait_s=settings.client_wait_s,
            decision_wait_s=settings.decision_wait_s,
            metrics=self.metrics,
        )
        self.metrics.on_scrape(self._refresh_gauges)
        # --retention: deletes old rows on its own cursor (collector/retention.py says why that is safe)
        self.retention = Retention(self.conn, settings.retention_s) if settings.retention_s else None
        if self.retention is not None:
            self.metrics.watch_retention(self.retention)

    def _refresh_gauges(self) -> None:
        m = self.metrics
        m.buffered_spans.set(self.pipeline.buffered_spans)
        m.buffered_bytes.set(self.pipeline.buffered_bytes)
        m.buffered_traces.set(self.pipeline.buffered_traces)
        m.writer_queue.set(self.writer.pending)
        m.writer_capacity.set(self.writer.capacity)
        m.write_errors.set(self.writer.write_errors)
        m.requests_written.set(self.writer.requests_written)
        m.spans_written.set(self.writer.spans_written)
        m.requests_already_stored.set(self.writer.requests_already_stored)
        m.spans_already_stored.set(self.writer.spans_already_stored)
        m.rows_lost.set(self.pipeline.stats.rows_lost)
        m.engine_steps_dropped.set(steps_dropped_total())
        if self.sampler.p99 is not None:
            m.p99_shared_requests.set(self.sampler.p99.shared_requests)

    def start(self) -> None:
        self.pipeline.start()
        if self.retention is not None:
            self.retention.start()

    def close(self) -> None:
        """Decides and writes everything buffered, then closes the database; runs once."""
        if self._closed:
            return
        self._closed = True
        if self.retention is not None:
            self.retention.close()  # before the writer's final CHECKPOINT
        self.pipeline.close()
        self.writer.close()
        self.conn.close()


def read_otlp_file(path: Path) -> list[Any]:
    """Gives the spans in one OTLP file: protobuf, JSON, or JSON lines (one export per line)."""
    data = path.read_bytes()
    if not data.strip():
        raise OtlpDecodeError("the file is empty")
    if path.suffix in (".json", ".jsonl", ".ndjson") or data.lstrip()[:1] in (b"{", b"["):
        return _spans_of_json(data)
    try:
        request = parse_trace_request(data)
    except OtlpDecodeError as exc:
        raise OtlpDecodeError(f"neither OTLP/JSON nor OTLP protobuf ({exc})") from exc
    spans, rejected = spans_from_request(request)
    if rejected:
        raise OtlpDecodeError(rejected.message)
    return spans


def _spans_of_json(data: bytes) -> list[Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OtlpDecodeError(f"not UTF-8 text, so not OTLP/JSON: {exc}") from exc
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError as whole:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if not docs:  # not JSON lines but one (pretty-printed) document: its error
                    raise OtlpDecodeError(f"invalid JSON: {whole}") from whole
                raise OtlpDecodeError(f"line {n}, column {exc.colno}: invalid JSON: {exc.msg}") from exc
    spans = []
    for doc in docs:
        for d in doc if isinstance(doc, list) else [doc]:
            spans.extend(decode_json(d))
    return spans


def import_files(settings: CollectorSettings, paths: Iterable[Path]) -> dict[str, int]:
    """Runs OTLP files through the same pipeline as `serve`; gives counts.

    A file that cannot be read stops the import with an error that names it and
    says which files before it were imported (they stay: nothing accepted is lost)."""
    paths = list(paths)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no such file: {p}")
    try:
        collector = Collector(settings)
    except DatabaseHeld as exc:  # a running serve's: send the file to it instead
        raise exc.for_command("import") from exc
    files = spans = 0
    try:
        for p in paths:
            try:
                found = read_otlp_file(p)
            except (OtlpDecodeError, ValueError, RecursionError) as exc:
                done = (
                    f"; the {files} file(s) before it were imported ({spans} spans)"
                    if files
                    else "; nothing was imported"
                )
                raise OtlpDecodeError(f"{p}: {exc}{done}") from exc
            while not collector.pipeline.add(found):
                collector.pipeline.decide_ready(force=True)
            files += 1
            spans += len(found)
        collector.pipeline.decide_ready(force=True)
    finally:
        collector.close()  # writes what is queued: the writer's counts are final after it
    stats = collector.pipeline.stats
    return {
        "files": files,
        "spans": spans,
        "requests": stats.requests_summarized,
        "traces": stats.traces_decided,
        "kept_traces": stats.traces_kept,
        # re-sent copies of requests the database held already (the first copy wins)
        "already_stored": collector.writer.requests_already_stored,
    }


def _bare(host: str) -> str:
    """Gives `host` as sockets take it: an IPv6 literal without its URL brackets."""
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _addresses(host: str, port: int) -> list[tuple[int, int, int, Any]]:
    """Gives every address a server on `host:port` binds, as asyncio's `create_server`
    (uvicorn) and grpc resolve them: all of getaddrinfo's answers, so a name such as
    `localhost` is often two (::1 and 127.0.0.1); "" means every interface."""
    infos = socket.getaddrinfo(
        _bare(host) or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
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
    if address != _bare(host):
        where += f" (its address {host_port(address, port)})"
    hint = f" (choose another port with --{_PORT_FLAG[what]})" if exc.errno == errno.EADDRINUSE else ""
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


_PORT_FLAG = {"OTLP/HTTP": "http-port", "OTLP/gRPC": "grpc-port", "web UI": "web-port"}


def check_ports(settings: CollectorSettings) -> None:
    """Raises OSError naming the first server whose address cannot be bound.

    Runs before the store is opened, so a busy port leaves no new database
    file behind (and an existing one untouched)."""
    otlp = settings.otlp_bind_host
    check_bindable(otlp, settings.http_port, "OTLP/HTTP")
    check_bindable(otlp, settings.grpc_port, "OTLP/gRPC")
    check_bindable(settings.host, settings.web_port, "web UI")


def _remove_new_store(db: Path) -> None:
    """Deletes the database file (and its WAL) a failed start created: an empty
    store nobody asked to keep.  Never called for a file that existed before."""
    for path in (db, db.with_name(db.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _quiet_server_class() -> type:
    import uvicorn

    class QuietServer(uvicorn.Server):
        """A uvicorn server that leaves SIGTERM/SIGINT to the collector.

        Each uvicorn server would otherwise capture the signals itself and
        re-raise them on exit; the collector must instead stop every server
        together and then decide and flush what is buffered.
        """

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

        def install_signal_handlers(self) -> None:  # uvicorn < 0.29
            return None

    return QuietServer


class CollectorServer:
    """A running collector: OTLP/gRPC, OTLP/HTTP and the web explorer, with a `stop()`.

    The uvicorn servers run on their own event loop in a background thread (the
    gRPC server has its own threads), so the caller's thread stays free:
    `serve()` waits there for a signal, `tokentrace demo` runs its scenarios.
    """

    def __init__(self, settings: CollectorSettings) -> None:
        self.settings = settings
        self._db_path = resolve_db_path(settings.db)
        try:
            check_ports(settings)  # before the store: a busy port must not leave a new file behind
        except OSError as exc:
            if read_note(self._db_path) is None:
                raise
            # busy because a serve of this database has them: that is what to say
            raise DatabaseHeld(self._db_path, "", "serve") from exc
        # a start that fails later removes the file only if this open created it.  Not
        # when the open itself fails: the file may then be another process's, made in
        # between (DuckDB's own errors, bad settings included, create no file)
        self._db_is_new = not self._db_path.exists()
        try:
            self.collector = Collector(settings)
        except DatabaseHeld as exc:  # a second serve of the file: name the first
            raise exc.for_command("serve") from exc
        #: the ports served on: the settings' until start, then the bound ones (0: any free)
        self.http_port = settings.http_port
        self.grpc_port = settings.grpc_port
        self.web_port = settings.web_port
        self._grpc: Any = None
        self._servers: list[Any] = []
        #: per uvicorn server: what it serves, where, and the sockets bound for it
        self._listeners: list[tuple[str, str, list[socket.socket]]] = []
        self.decoder = (
            DecodePool(settings.decode_processes, itl_bounds_ms=ITL_BUCKET_BOUNDS_MS)
            if settings.decode_processes
            else None
        )
        if self.decoder is not None:
            self.collector.metrics.watch_decoder(self.decoder)
        self._thread: threading.Thread | None = None
        self._restore_gc: Any = None
        self._stopped = False
        self._web_started = False
        #: the id of the note this server left beside the database; None: it left none,
        #: so a failed start has none to remove (and leaves a killed serve's alone)
        self._note: str | None = None

    @property
    def otlp_http_url(self) -> str:
        return f"http://{host_port(self.settings.otlp_bind_host, self.http_port)}"

    @property
    def web_url(self) -> str:
        return f"http://{host_port(self.settings.host, self.web_port)}"

    def start(self, timeout_s: float = 60.0) -> CollectorServer:
        """Starts every server and returns once all of them accept connections.

        Raises (after stopping whatever did start, and removing the database
        file if this start created it) when one cannot start, e.g. a port in use.
        """
        import uvicorn

        s, c = self.settings, self.collector
        otlp_host = s.otlp_bind_host
        try:
            c.start()
            if self.decoder is not None:
                self.decoder.start()  # in the background: a worker takes 1-4 s to start
            self._start_grpc()
            # the Host check follows the address this server binds, not the web UI's
            otlp_app = create_http_app(c.pipeline, s.max_body_bytes, c.metrics, self.decoder, otlp_host)
            apps: list[tuple[str, Any, str, int]] = [
                ("OTLP/HTTP", otlp_app, otlp_host, s.http_port)
            ]
            try:
                from tokentrace.web.app import create_web_app
            except ModuleNotFoundError as exc:
                # the explorer is optional where its dependencies are not
                # installed; a broken import of our own code is an error, not a
                # UI that silently never starts
                if not exc.name or exc.name.partition(".")[0] == "tokentrace":
                    raise
                logger.warning(
                    "tokentrace: no web UI (%s is not installed: pip install 'tokentrace[server]',"
                    " in a clone pip install '.[server]')",
                    exc.name,
                )
                create_web_app = None  # type: ignore[assignment]
            if create_web_app is not None:
                apps.append(("web UI", create_web_app(s, c), s.host, s.web_port))
                self._web_started = True  # its note names the port bound (--web-port 0: any)
            quiet_server = _quiet_server_class()
            for what, app, host, port in apps:
                # bound here, on the caller's thread: a port taken since the check is
                # then this start's OSError, not uvicorn's SystemExit in the loop thread
                sockets = bind_sockets(host, port, what)
                if port == 0 and sockets:  # any free port: the one bound
                    port = int(sockets[0].getsockname()[1])
                    if app is otlp_app:
                        self.http_port = port
                    else:
                        self.web_port = port
                self._listeners.append((what, host_port(host, port), sockets))
                self._servers.append(
                    quiet_server(
                        uvicorn.Config(
                            app, host=_bare(host), port=port, log_level="warning", lifespan="off"
                        )
                    )
                )
            started = threading.Event()
            errors: list[BaseException] = []
            self._thread = threading.Thread(
                target=self._run, args=(started, errors), name="tokentrace-collector", daemon=True
            )
            self._thread.start()
            if not started.wait(timeout_s):
                raise RuntimeError(
                    f"the collector's servers did not start within {timeout_s:.0f} s"
                )
            if errors:
                raise errors[0]
        except BaseException:
            self.stop()
            self._remove_store_if_new()
            raise
        logger.info(
            "tokentrace serving: OTLP/HTTP %s, OTLP/gRPC %s, web %s, db %s",
            host_port(otlp_host, self.http_port), host_port(otlp_host, self.grpc_port),
            host_port(s.host, self.web_port), s.db,
        )  # fmt: skip
        self._restore_gc = tune_for_ingest()
        if self._web_started:  # `report --db` on the held file then names this URL
            killed = unclean_stop(s.db)  # its note outlived it: it never flushed
            if killed is not None:
                logger.warning(
                    "tokentrace serve: the previous serve of %s (pid %d) did not stop cleanly "
                    "(killed or crashed): what it had acknowledged but not yet decided and "
                    "written (its tail buffer, up to --grace-s after each trace's end) was lost",
                    s.db, killed,
                )  # fmt: skip
            self._note = write_note(
                s.db, self.web_url, token_required=bool(s.api_token), otlp_url=self.otlp_http_url
            )
        return self

    def _start_grpc(self) -> None:
        """Starts the OTLP/gRPC server, or raises OSError naming the cause.

        grpc says none when it cannot bind, and its C core logs a line of its own:
        the address is probed first, as `check_ports` did, so a port taken since
        is named plainly, and again after a failure for the OS's reason."""
        s, c = self.settings, self.collector
        check_bindable(s.otlp_bind_host, s.grpc_port, "OTLP/gRPC")
        try:
            self._grpc, self.grpc_port = start_grpc_server(
                c.pipeline, _bare(s.otlp_bind_host), s.grpc_port, s.max_body_bytes, c.metrics
            )
        except OSError:
            check_bindable(s.otlp_bind_host, s.grpc_port, "OTLP/gRPC")
            raise

    def _remove_store_if_new(self) -> None:
        """After a failed start: deletes the database file if this start created it."""
        if self._db_is_new:
            _remove_new_store(self._db_path)

    def _run(self, started: threading.Event, errors: list[BaseException]) -> None:
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(self._serve_all(started, errors))
        except Exception as exc:  # a bug of ours: still the start's error, never the thread's
            errors.append(RuntimeError(f"the collector's servers stopped: {exc!r}"))
            for server in self._servers:
                server.should_exit = True
        finally:
            started.set()
            loop.close()

    async def _serve_all(self, started: threading.Event, errors: list[BaseException]) -> None:
        tasks = [
            asyncio.create_task(_serve_one(server, sockets))
            for server, (_, _, sockets) in zip(self._servers, self._listeners, strict=True)
        ]
        try:
            while not all(server.started for server in self._servers):
                stopped = [i for i, task in enumerate(tasks) if task.done()]
                if stopped:
                    what, where, _ = self._listeners[stopped[0]]
                    why = tasks[stopped[0]].result() or "it stopped during start-up"
                    errors.append(RuntimeError(f"cannot serve {what} on {where}: {why}"))
                    for server in self._servers:
                        server.should_exit = True
                    break
                await asyncio.sleep(0.02)
        finally:
            started.set()
        await asyncio.gather(*tasks)

    def stop(self) -> None:
        """Stops every server, then decides and flushes everything buffered; runs once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._note is not None:
                remove_note(self.settings.db, self._note)
            if self._restore_gc is not None:
                self._restore_gc()
            # stop taking data first (gRPC lets in-flight exports finish), then
            # decide and flush everything buffered
            if self._grpc is not None:
                self._grpc.stop(grace=5).wait(10)
            for server in self._servers:
                server.should_exit = True
            if self._thread is not None:
                self._thread.join(30)
            for _, _, sockets in self._listeners:  # uvicorn closes those it served
                for sock in sockets:
                    sock.close()
            if self.decoder is not None:
                self.decoder.close()
        finally:
            self.collector.close()


async def _serve_one(server: Any, sockets: list[socket.socket]) -> str | None:
    """Runs one uvicorn server on its bound sockets; gives why it could not start,
    None when it ran and stopped.  uvicorn ends a failed start with SystemExit
    (after logging the cause): caught here, or it would leave the loop and its
    other tasks pending."""
    try:
        await server.serve(sockets=sockets)
    except (Exception, SystemExit) as exc:
        if server.started:  # a server that ran, then failed: no start to fail, so say it here
            logger.error("tokentrace: a collector server stopped: %r", exc, exc_info=exc)
        if isinstance(exc, SystemExit):
            return f"uvicorn exited during start-up (status {exc.code})"
        return str(exc) or type(exc).__name__
    return None


def start_servers(settings: CollectorSettings) -> CollectorServer:
    """Starts the collector and its servers; the handle's `stop()` decides, flushes and closes."""
    return CollectorServer(settings).start()


def serve(settings: CollectorSettings, ready: Any = None) -> None:
    """Runs the collector until SIGTERM/SIGINT, then decides and flushes everything.
    `ready(server)` is called once every server accepts connections."""
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
        except ValueError:  # not the main thread: the caller owns the signals
            pass
    try:
        server = start_servers(settings)
        try:
            if ready is not None:
                ready(server)
            # a timeout keeps the main thread responsive to signals on every platform
            while not stop.wait(0.5):
                pass
        finally:
            server.stop()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
