"""A query node (`tokentrace serve --lake URI --no-receivers`): the explorer and its JSON API
over the shared lake, and nothing else: no OTLP receivers, no local DuckDB file opened or
created.  It only reads, so any number of them run beside the shards that write the lake
(docs/scale-out.md); `/readyz` says whether the lake's catalog answers."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from typing import Any

from tokentrace._loopback import host_port
from tokentrace.collector.settings import CollectorSettings
from tokentrace.ports import bare_host, bind_sockets, check_bindable
from tokentrace.store.reader import LakeAddress, NoLakeYet, StoreReader

logger = logging.getLogger("tokentrace.query_node")

#: What a probe that finds the catalog unreachable is asked to wait before asking again, s.
RETRY_AFTER_S = 5


class QueryNodeServer:
    """A running query node: the web explorer over the lake, with a `stop()`.

    As `CollectorServer`, the uvicorn server runs on its own event loop in a background
    thread, so the caller's thread stays free to wait for a signal."""

    #: no receivers: `serve` prints these as absent
    http_port: int | None = None
    grpc_port: int | None = None

    def __init__(self, settings: CollectorSettings) -> None:
        if settings.lake is None or settings.receivers:
            raise ValueError(
                "a query node reads a lake and runs no receivers: --lake, --no-receivers"
            )
        self.settings = settings
        self.lake = LakeAddress(settings.lake, settings.lake_data)
        self.web_port = settings.web_port
        self.store = StoreReader(lake=self.lake)
        self._server: Any = None
        self._sockets: list[socket.socket] = []
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def web_url(self) -> str:
        return f"http://{host_port(self.settings.host, self.web_port)}"

    def start(self, timeout_s: float = 60.0) -> QueryNodeServer:
        """Reads the lake once (a catalog that cannot be reached fails the start in one line;
        one that holds no lake yet is waited for: shards and query nodes start in any order),
        then serves the explorer; returns once it accepts connections."""
        import uvicorn

        from tokentrace.serve import _quiet_server_class, _serve_one

        s = self.settings
        try:
            check_bindable(s.host, s.web_port, "web UI")
            try:
                with self.store.cursor():
                    pass  # opens the lake: its errors are the start's
            except NoLakeYet as exc:
                # /readyz says it and the pages answer 503 until the first shard makes the lake
                logger.warning("tokentrace query node: %s; serving, not ready until then", exc)
            app = self._web_app()
            self._sockets = bind_sockets(s.host, s.web_port, "web UI")
            if s.web_port == 0 and self._sockets:  # any free port: the one bound
                self.web_port = int(self._sockets[0].getsockname()[1])
            self._server = _quiet_server_class()(
                uvicorn.Config(
                    app,
                    host=bare_host(s.host),
                    port=self.web_port,
                    log_level="warning",
                    lifespan="off",
                )
            )
            outcome: list[str | None] = []
            self._thread = threading.Thread(
                target=lambda: outcome.append(asyncio.run(_serve_one(self._server, self._sockets))),
                name="tokentrace-query-node",
                daemon=True,
            )
            self._thread.start()
            while not self._server.started:
                self._thread.join(0.02)
                if not self._thread.is_alive():
                    why = (outcome[0] if outcome else None) or "it stopped during start-up"
                    raise RuntimeError(
                        f"cannot serve web UI on {host_port(s.host, self.web_port)}: {why}"
                    )
                timeout_s -= 0.02
                if timeout_s <= 0:
                    raise RuntimeError("the query node's web UI did not start in time")
        except BaseException:
            self.stop()
            raise
        logger.info("tokentrace query node: web %s over %s", self.web_url, self.lake.describe())
        return self

    def _web_app(self) -> Any:
        """The explorer over the lake, plus `/readyz` (open without the token, as `/healthz`)."""
        from fastapi.responses import JSONResponse
        from starlette.concurrency import run_in_threadpool

        from tokentrace.web.app import create_web_app

        app = create_web_app(self.settings, store=self.store)

        async def readyz() -> Any:
            # in the thread pool: a catalog that does not answer must not stall the event loop
            reason = await run_in_threadpool(self.store.readiness)
            if reason is None:
                return JSONResponse({"status": "ready"})
            return JSONResponse(
                {"status": "unavailable", "reason": reason},
                status_code=503,
                headers={"Retry-After": str(RETRY_AFTER_S)},
            )

        app.add_api_route("/readyz", readyz, methods=["GET", "HEAD"], include_in_schema=False)
        return app

    def stop(self) -> None:
        """Stops the web server and closes the lake; runs once."""
        if self._stopped:
            return
        self._stopped = True
        try:
            if self._server is not None:
                self._server.should_exit = True
            if self._thread is not None:
                self._thread.join(30)
            for sock in self._sockets:
                sock.close()
        finally:
            self.store.close()


def next_steps(server: QueryNodeServer) -> str:
    """What `serve` prints under a query node's address: how to read the diagnosis, how to stop."""
    from tokentrace.cli import _local_address

    token = " (with $TOKENTRACE_API_TOKEN set)" if server.settings.api_token else ""
    web = _local_address(server.settings.host)
    return (
        "  a query node: no OTLP receivers here; the shards (tokentrace serve --lake …) take the "
        "traces\n"
        f"  read the diagnosis: tokentrace report --url http://{web}:{server.web_port}{token}\n"
        "  Ctrl-C stops serve"
    )
