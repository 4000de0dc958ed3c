"""The demo's collector starts even when a port it found free is taken before it binds it."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from tokentrace import demo_cli


@pytest.mark.slow
def test_a_port_taken_in_between_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # another program takes a port between the demo's check and the collector's bind:
    # here the check gives a port this test holds, once
    squatter = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    held = squatter.getsockname()[1]
    real_port = demo_cli._port
    calls: list[int] = []

    def port(preferred: int, taken: set[int]) -> Any:
        calls.append(preferred)
        return held if len(calls) == 1 else real_port(0, taken)

    monkeypatch.setattr(demo_cli, "_port", port)
    try:
        settings, servers = demo_cli.start_collector(tmp_path / "d.duckdb")
        try:
            assert held not in (settings.http_port, settings.grpc_port, settings.web_port)
            assert len(calls) == 6  # a second try, on other ports
        finally:
            servers.stop()
    finally:
        squatter.close()


def test_only_an_address_in_use_is_retried() -> None:
    import errno

    in_use = OSError(errno.EADDRINUSE, "Address already in use")
    named = OSError("cannot serve OTLP/HTTP on 127.0.0.1:4318: Address already in use")
    named.__cause__ = in_use  # as the collector's start raises it
    assert demo_cli._port_taken(in_use) and demo_cli._port_taken(named)
    assert not demo_cli._port_taken(OSError(errno.EACCES, "Permission denied"))
    assert not demo_cli._port_taken(RuntimeError("the collector's servers did not start"))
