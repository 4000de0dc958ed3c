"""The test kit's own promises: the ports it hands out never repeat in one test process,
`serve` started on ports taken meanwhile is started again on others, and a test marked
`alone` has the machine to itself among pytest-xdist's workers."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import tt_testkit

#: how long a test that must stay held is given to get in anyway
HELD_S = 0.2


class _KernelGivingBackTheSamePort:
    """A socket whose `bind(0)` gets the ports listed, as a kernel that reuses a just-closed
    port does (the flake CI saw: `serve` started with http_port == web_port)."""

    ports = [40001, 40001, 40001, 40002, 40003]

    def __init__(self, *args: Any) -> None:
        self.port = 0

    def __enter__(self) -> _KernelGivingBackTheSamePort:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def bind(self, address: tuple[str, int]) -> None:
        self.port = self.ports.pop(0)

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)


def test_free_port_never_gives_a_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tt_testkit, "_given_ports", set())
    monkeypatch.setattr(socket, "socket", _KernelGivingBackTheSamePort)
    assert [tt_testkit.free_port(), tt_testkit.free_port(), tt_testkit.free_port()] == [
        40001,
        40002,
        40003,
    ]


def test_free_port_on_ipv6_never_gives_a_port_given_on_ipv4(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`serve --host ::1` takes its ports from ::1 (the same flake, and `serve` refuses two equal
    port numbers even on different addresses): one registry for both families."""

    class Kernel(_KernelGivingBackTheSamePort):
        ports = [40001, 40001, 40001, 40002]
        families: list[int] = []

        def __init__(self, family: int = socket.AF_INET, *args: Any) -> None:
            super().__init__()
            self.families.append(family)

    monkeypatch.setattr(tt_testkit, "_given_ports", set())
    monkeypatch.setattr(socket, "socket", Kernel)
    assert [tt_testkit.free_port(), tt_testkit.free_port("::1")] == [40001, 40002]
    assert Kernel.families == [socket.AF_INET] + [socket.AF_INET6] * 3


@pytest.mark.slow
def test_start_serve_starts_again_on_new_ports_when_one_was_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A port `free_port` gave can be bound by another program before `serve` binds it (its
    start takes a second or more): `start_serve` tries again on new ports."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        real = tt_testkit.free_port
        first = [busy]
        monkeypatch.setattr(tt_testkit, "free_port", lambda *a: first.pop() if first else real(*a))
        server = tt_testkit.start_serve(tmp_path)
        try:
            assert busy not in (server.http_port, server.grpc_port, server.web_port)
            assert server.proc.poll() is None
        finally:
            server.stop()


def test_a_test_alone_waits_for_the_running_ones_and_holds_off_those_that_ask_after_it(
    tmp_path: Path,
) -> None:
    import threading

    entered = {name: threading.Event() for name in ("running", "alone", "later")}
    leave = {name: threading.Event() for name in entered}
    order: list[str] = []

    def run(name: str) -> None:
        with tt_testkit.machine_share(tmp_path, alone=name == "alone"):
            order.append(name)
            entered[name].set()
            leave[name].wait(30)

    threads = {name: threading.Thread(target=run, args=(name,), daemon=True) for name in entered}
    try:
        threads["running"].start()
        assert entered["running"].wait(10)
        threads["alone"].start()
        assert not entered["alone"].wait(HELD_S)  # a test still runs: alone waits
        threads["later"].start()
        assert not entered["later"].wait(HELD_S)  # asked after alone: waits for it
        leave["running"].set()
        assert entered["alone"].wait(10)
        assert not entered["later"].wait(HELD_S)  # nothing beside a test alone
        leave["alone"].set()
        assert entered["later"].wait(10)
        assert order == ["running", "alone", "later"]
    finally:
        for event in leave.values():
            event.set()
        for thread in threads.values():
            thread.join(10)
