"""A TCP proxy that adds real one-way delay: how the demo makes "network distance" real.

Bytes read on one side are held for `delay_ms` and then written to the other
side, in order, per direction. Throughput is not capped: chunks in flight are
pipelined, as on a long but fat link.

Library:  handle = start_proxy(8001, 8000, delay_ms=40); ...; handle.stop()
CLI:      python -m tokentrace.examples.netproxy --listen 8001 --target 8000 --delay-ms 40
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_READ_SIZE = 65536
_EOF = b""


@dataclass(frozen=True)
class ProxyConfig:
    listen_port: int
    target_port: int
    # One-way delay per direction; a round trip pays upstream + downstream.
    upstream_delay_ms: float
    downstream_delay_ms: float
    listen_host: str = "127.0.0.1"
    target_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.upstream_delay_ms < 0 or self.downstream_delay_ms < 0:
            raise ValueError("delays must be >= 0 ms")


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay_s: float) -> None:
    """Copy reader → writer, each chunk delivered `delay_s` after it was read, order kept."""
    in_flight: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def receive() -> None:
        try:
            while True:
                data = await reader.read(_READ_SIZE)
                in_flight.put_nowait((time.monotonic() + delay_s, data))
                if not data:
                    return
        except (ConnectionError, OSError):
            in_flight.put_nowait((time.monotonic() + delay_s, _EOF))

    async def deliver() -> None:
        while True:
            due, data = await in_flight.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                if writer.can_write_eof():
                    with contextlib.suppress(OSError):
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    receiver = asyncio.create_task(receive())
    try:
        await deliver()
    finally:
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await receiver


class _Proxy:
    def __init__(self, config: ProxyConfig) -> None:
        self.config = config
        self.server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> int:
        self.server = await asyncio.start_server(
            self._on_client, self.config.listen_host, self.config.listen_port
        )
        return int(self.server.sockets[0].getsockname()[1])

    async def _on_client(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        cfg = self.config
        try:
            target_reader, target_writer = await asyncio.open_connection(
                cfg.target_host, cfg.target_port
            )
        except OSError as exc:
            logger.warning("proxy could not reach %s:%s: %s", cfg.target_host, cfg.target_port, exc)
            client_writer.close()
            return
        try:
            await asyncio.gather(
                _pipe(client_reader, target_writer, cfg.upstream_delay_ms / 1000.0),
                _pipe(target_reader, client_writer, cfg.downstream_delay_ms / 1000.0),
                return_exceptions=True,
            )
        except asyncio.CancelledError:
            # Only close() cancels a connection: end it quietly instead of leaving
            # asyncio's stream callback to log the cancellation as an error.
            pass
        finally:
            # both closed before any wait: close() may cancel this task during a wait, and a
            # writer left open warned "loop is closed" when collected after the loop stopped
            for writer in (client_writer, target_writer):
                writer.close()
            for writer in (client_writer, target_writer):
                with contextlib.suppress(Exception):
                    await writer.wait_closed()
            if task is not None:
                self._connections.discard(task)

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self.server is not None:
            await self.server.wait_closed()


class ProxyHandle:
    """A running proxy on its own event-loop thread."""

    def __init__(
        self, proxy: _Proxy, loop: asyncio.AbstractEventLoop, thread: threading.Thread, port: int
    ) -> None:
        self._proxy = proxy
        self._loop = loop
        self._thread = thread
        self.port = port
        self.config = proxy.config

    @property
    def url(self) -> str:
        return f"http://{self.config.listen_host}:{self.port}"

    def stop(self, timeout: float = 5.0) -> None:
        """Close the listener and every open connection; safe to call twice."""
        if not self._thread.is_alive():
            return
        future = asyncio.run_coroutine_threadsafe(self._proxy.close(), self._loop)
        with contextlib.suppress(Exception):
            future.result(timeout)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    def __enter__(self) -> ProxyHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_proxy(
    listen_port: int,
    target_port: int,
    delay_ms: float,
    *,
    downstream_delay_ms: float | None = None,
    listen_host: str = "127.0.0.1",
    target_host: str = "127.0.0.1",
) -> ProxyHandle:
    """Start a delaying proxy on a background thread; listen_port=0 picks a free port (see `.port`).

    `delay_ms` is the one-way delay client → target, and also target → client
    unless `downstream_delay_ms` is given.
    """
    config = ProxyConfig(
        listen_port=listen_port,
        target_port=target_port,
        upstream_delay_ms=delay_ms,
        downstream_delay_ms=delay_ms if downstream_delay_ms is None else downstream_delay_ms,
        listen_host=listen_host,
        target_host=target_host,
    )
    proxy = _Proxy(config)
    loop = asyncio.new_event_loop()
    outcome: list[int | BaseException] = []
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            outcome.append(loop.run_until_complete(proxy.start()))
        except BaseException as exc:  # report to the caller's thread
            outcome.append(exc)
            ready.set()
            loop.close()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()

    thread = threading.Thread(
        target=run, name=f"netproxy-{listen_port}->{target_port}", daemon=True
    )
    thread.start()
    ready.wait()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise RuntimeError(f"proxy could not listen on {listen_host}:{listen_port}") from result
    return ProxyHandle(proxy, loop, thread, result)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="TCP proxy adding a one-way delay per direction")
    parser.add_argument("--listen", type=int, required=True, help="port to listen on (127.0.0.1)")
    parser.add_argument("--target", type=int, required=True, help="port to forward to (127.0.0.1)")
    parser.add_argument(
        "--delay-ms", type=float, default=50.0, help="one-way delay, client → target"
    )
    parser.add_argument(
        "--downstream-delay-ms", type=float, default=None, help="target → client (default: same)"
    )
    args = parser.parse_args(argv)
    handle = start_proxy(
        args.listen, args.target, args.delay_ms, downstream_delay_ms=args.downstream_delay_ms
    )
    print(
        f"netproxy 127.0.0.1:{handle.port} -> 127.0.0.1:{args.target}, delay {args.delay_ms} ms each way"
    )
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()


if __name__ == "__main__":
    main()
