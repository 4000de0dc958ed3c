"""`tokentrace serve`: the composition root that builds the collector, the store's reader
and the web explorer, runs the OTLP/gRPC, OTLP/HTTP and web servers, and stops them on a
signal after deciding and writing everything buffered (docs/collector.md)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tokentrace._loopback import host_port
from tokentrace.collector.collector import Collector
from tokentrace.collector.decode_pool import DecodePool
from tokentrace.collector.gc_tuning import tune_for_ingest
from tokentrace.collector.grpc_receiver import start_grpc_server
from tokentrace.collector.http_receiver import create_http_app
from tokentrace.collector.settings import CollectorSettings
from tokentrace.ports import bare_host, bind_sockets, check_bindable, check_ports
from tokentrace.store.connection import DatabaseHeld, resolve_db_path
from tokentrace.store.reader import StoreReader
from tokentrace.store.schema import ITL_BUCKET_BOUNDS_MS
from tokentrace.store.serve_note import read_note, remove_note, unclean_stop, write_note

#: the collector's logger, as before the servers moved here: log filters name it
logger = logging.getLogger("tokentrace.collector")


def _remove_new_store(db: Path) -> None:
    """Deletes the database file (and its WAL) a failed start created: an empty
    store nobody asked to keep.  Never called for a file that existed before."""
    for path in (db, db.with_name(db.name + ".wal")):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _web_app(settings: CollectorSettings, collector: Collector, db_path: Path) -> Any | None:
    """Gives the web explorer, reading through cursors of the collector's connection
    (DuckDB allows one writing process per file); None where its dependencies are
    not installed."""
    try:
        from tokentrace.web.app import OtlpAddresses, create_web_app
    except ModuleNotFoundError as exc:
        # the explorer is optional where its dependencies are not installed; a
        # broken import of our own code is an error, not a UI that silently never starts
        if not exc.name or exc.name.partition(".")[0] == "tokentrace":
            raise
        logger.warning(
            "tokentrace: no web UI (%s is not installed: pip install 'tokentrace[server]',"
            " in a clone pip install '.[server]')",
            exc.name,
        )
        return None
    otlp_host = settings.otlp_bind_host
    # the configured ports: the web app is made before the OTLP/HTTP sockets are bound
    otlp = OtlpAddresses(
        http_url=f"http://{host_port(otlp_host, settings.http_port)}",
        grpc_address=host_port(otlp_host, settings.grpc_port),
    )
    return create_web_app(settings, store=StoreReader(db_path, collector.conn), otlp=otlp)


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
            web_app = _web_app(s, c, self._db_path)
            if web_app is not None:
                apps.append(("web UI", web_app, s.host, s.web_port))
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
                            app, host=bare_host(host), port=port, log_level="warning", lifespan="off"
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
            if killed is not None and c.wal is not None:
                logger.warning(
                    "tokentrace serve: the previous serve of %s (pid %d) did not stop cleanly "
                    "(killed or crashed): what it had acknowledged and not yet written was "
                    "replayed from its write-ahead log",
                    s.db, killed,
                )  # fmt: skip
            elif killed is not None:
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
                c.pipeline, bare_host(s.otlp_bind_host), s.grpc_port, s.max_body_bytes, c.metrics
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


def start_servers(settings: CollectorSettings) -> Any:
    """Starts the collector and its servers; the handle's `stop()` decides, flushes and closes.
    A query node (`--no-receivers`) starts only the explorer over the lake (app/query_node.py)."""
    if not settings.receivers:
        from tokentrace.query_node import QueryNodeServer

        return QueryNodeServer(settings).start()
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
