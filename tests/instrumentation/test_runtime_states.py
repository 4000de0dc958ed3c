"""The SDK runtime's states and transitions: configure, first use, shutdown, and a fork in each."""

from __future__ import annotations

import json
import logging
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _cold_start, _safety
from tokentrace.instrumentation._runtime import Runtime, State, runtime

pytestmark = [
    # Python 3.12+ warns when a process with threads forks: the SDK's own daemon threads
    pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning"),
]
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")
#: a forked child not done by then is taken as hung (killed by SIGALRM)
CHILD_TIMEOUT_S = 60
USED_AFTER_SHUTDOWN = "used after tt.shutdown()"


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.fixture(autouse=True)
def _fresh(unconfigured: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
    """Unconfigured, nothing from the environment, every log site new."""
    for name in ("TOKENTRACE_ENDPOINT", "TOKENTRACE_DISABLED", "OTEL_SDK_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_safety, "_seen", set())


# ---- transitions in one process ---------------------------------------------------


def test_configure_then_configure_again_closes_the_first() -> None:
    assert runtime.state is State.UNCONFIGURED
    assert not runtime.exports_nothing()
    first = tt.configure(service_name="one", exporter=InMemorySpanExporter())
    assert runtime.state is State.CONFIGURED
    assert tt.get_tracing() is first
    second = tt.configure(service_name="two", exporter=InMemorySpanExporter())
    assert runtime.state is State.CONFIGURED
    assert tt.get_tracing() is second
    assert first.closed and not second.closed


def test_first_use_configures_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRACE_DISABLED", "1")
    tracing = tt.get_tracing()
    assert runtime.state is State.CONFIGURED
    assert tracing.settings.disabled
    assert runtime.exports_nothing()
    assert tt.get_tracing() is tracing


def test_use_after_shutdown_exports_nothing_until_configure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tokentrace")
    configured = tt.configure(service_name="ended", exporter=InMemorySpanExporter())
    tt.shutdown()
    assert runtime.state is State.SHUT_DOWN
    assert configured.closed and runtime.exports_nothing()
    # the invalid use: after shutdown(), a request still works, exports nothing, says so once
    with tt.request(model="m") as req:
        req.token()
    after = tt.get_tracing()
    assert after is not configured and after is tt.get_tracing()
    assert after.settings.disabled and after.settings.service_name == "ended"
    assert sum(USED_AFTER_SHUTDOWN in m for m in _warnings(caplog)) == 1
    assert runtime.flush_before_exit(1.0)  # nothing to flush, nothing made
    tt.shutdown()  # twice: nothing changes
    assert runtime.state is State.SHUT_DOWN and tt.get_tracing() is after
    again = tt.configure(service_name="again", exporter=InMemorySpanExporter())
    assert runtime.state is State.CONFIGURED and tt.get_tracing() is again
    assert not runtime.exports_nothing()


def test_shutdown_of_nothing_configured_stays_unconfigured() -> None:
    tt.shutdown()
    assert runtime.state is State.UNCONFIGURED
    assert not runtime.exports_nothing()


def test_an_unusable_environment_disables_until_configure(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="tokentrace")
    monkeypatch.setenv("TOKENTRACE_ENDPOINT", "http://")  # no host
    disabled = tt.get_tracing()
    assert runtime.state is State.DISABLED
    assert disabled.settings.disabled and runtime.exports_nothing()
    assert sum("not configured, nothing is exported" in m for m in _warnings(caplog)) == 1
    tt.shutdown()  # nothing of its own to end: it stays in force
    assert runtime.state is State.DISABLED and tt.get_tracing() is disabled
    monkeypatch.delenv("TOKENTRACE_ENDPOINT")
    tracing = tt.configure(exporter=InMemorySpanExporter())
    assert runtime.state is State.CONFIGURED and tt.get_tracing() is tracing
    assert not disabled.closed  # not a configuration of the host's: nothing to end


def test_the_runtime_refuses_a_state_with_what_another_keeps() -> None:
    fresh = Runtime()
    with pytest.raises(RuntimeError, match="keeps no configuration"):
        fresh._become(State.SHUT_DOWN, tt.configure(exporter=InMemorySpanExporter()))
    with pytest.raises(RuntimeError, match="keeps no ended settings"):
        fresh._become(State.UNCONFIGURED, ended=tt.get_tracing().settings)
    assert fresh.state is State.UNCONFIGURED


# ---- the one at-fork handler ------------------------------------------------------


def _in_child(body: Callable[[], dict[str, object]]) -> dict[str, object]:
    """Forks; gives what `body` gave in the child (as JSON), or fails with its error."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_end)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)  # (pytest-timeout's handler)
            signal.alarm(CHILD_TIMEOUT_S)
            try:
                out = body()
            except Exception as exc:
                out = {"error": repr(exc)}
            os.write(write_end, json.dumps(out).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        got = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, f"the child failed ({status})"
    result: dict[str, object] = json.loads(got)
    assert "error" not in result, result["error"]
    return result


@needs_fork
def test_a_child_of_an_unconfigured_parent_is_unconfigured() -> None:
    got = _in_child(lambda: {"state": runtime.state.value})
    assert got == {"state": "unconfigured"}


@needs_fork
def test_a_child_of_a_configured_parent_configures_again_as_its_own_instance() -> None:
    parent = tt.configure(service_name="workers", exporter=InMemorySpanExporter())
    _cold_start.tracker.observe(1, 300.0)  # the parent's first request took the cold start

    def body() -> dict[str, object]:
        forked = runtime.state.value
        tracing = tt.get_tracing()
        resource = tracing.provider.resource.attributes
        return {
            "forked": forked,
            "state": runtime.state.value,
            "new": tracing is not parent,
            "service": resource["service.name"],
            "pid_is_own": resource["process.pid"] == os.getpid(),
            "cold": _cold_start.tracker.observe(1, 300.0),
        }

    got = _in_child(body)
    assert got == {
        "forked": "forked",
        "state": "configured",
        "new": True,
        "service": "workers",
        "pid_is_own": True,
        "cold": True,
    }
    assert runtime.state is State.CONFIGURED and tt.get_tracing() is parent  # the parent's own
    _cold_start.tracker.reset()


@needs_fork
def test_a_child_keeps_the_hosts_provider() -> None:
    host = tt.configure(tracer_provider=TracerProvider())
    got = _in_child(lambda: {"state": runtime.state.value, "same": tt.get_tracing() is host})
    assert got == {"state": "configured", "same": True}


@needs_fork
def test_a_child_of_a_disabled_parent_stays_disabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRACE_ENDPOINT", "http://")
    disabled = tt.get_tracing()
    got = _in_child(lambda: {"state": runtime.state.value, "same": tt.get_tracing() is disabled})
    assert got == {"state": "disabled", "same": True}


@needs_fork
def test_a_child_of_a_shut_down_parent_exports_nothing() -> None:
    tt.configure(service_name="ended", exporter=InMemorySpanExporter())
    tt.shutdown()

    def body() -> dict[str, object]:
        tracing = tt.get_tracing()
        return {"state": runtime.state.value, "disabled": tracing.settings.disabled}

    assert _in_child(body) == {"state": "shut down", "disabled": True}


@needs_fork
def test_a_grandchild_of_a_configured_parent_is_forked_too() -> None:
    tt.configure(service_name="workers", exporter=InMemorySpanExporter())

    def child() -> dict[str, object]:
        return {
            "child": runtime.state.value,
            **_in_child(lambda: {"grandchild": runtime.state.value}),
        }

    assert _in_child(child) == {"child": "forked", "grandchild": "forked"}


@needs_fork
def test_the_fork_handler_runs_each_part_in_order_past_a_failing_one() -> None:
    fresh = Runtime()
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("a part's own failure")

    fresh.on_fork_in_child(lambda: ran.append("first"))
    fresh.on_fork_in_child(broken)
    fresh.on_fork_in_child(lambda: ran.append("last"))

    def body() -> dict[str, object]:
        fresh.after_fork_in_child()
        return {"ran": ran, "logged": any("broken" in site for site in _safety._seen)}

    assert _in_child(body) == {"ran": ["first", "last"], "logged": True}


def test_only_the_runtime_registers_an_at_fork_handler() -> None:
    package = Path(tt.__file__).parent
    registering = sorted(
        p.name for p in package.glob("*.py") if "os.register_at_fork" in p.read_text("utf-8")
    )
    assert registering == ["_runtime.py"]
