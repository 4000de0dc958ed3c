"""The SDK's runtime: one object holding its state, its locks and threads, and its transitions.

`runtime` is the one instance.  Its state is one of `State`; each transition
(`configure`, first use, `shutdown`, the exit flush, a fork) is a method, and
`_become` is the one place a state and what it keeps are set.  The parts that
hold per-process work (the request finisher, the engine-step recorder, the CUDA
timer, the GPU sampler) register with it: a flush hook that builds what they
hold before spans are flushed, a check that says whether work waits at exit,
and a callback the one at-fork handler runs in a forked child.
"""

from __future__ import annotations

import enum
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter

from tokentrace.instrumentation import _pending_span, _safety, _tracing
from tokentrace.instrumentation._exit import ExitFlush
from tokentrace.instrumentation._export import SHUTDOWN_TIMEOUT_S
from tokentrace.instrumentation._safety import log_once
from tokentrace.instrumentation._settings import (
    DEFAULT_HTTP_ENDPOINT,
    PROTOCOLS,
    Settings,
    disabled_by_env,
    service_name_from_env,
)
from tokentrace.instrumentation._tracing import Tracing


class State(enum.Enum):
    """Where the runtime stands; `Runtime.get_tracing()` says what each gives."""

    #: nothing configured yet: first use configures from the environment
    UNCONFIGURED = "unconfigured"
    #: `configure()` (or first use) made the configuration in force; it exports
    #: unless its settings say disabled (`TOKENTRACE_DISABLED`, `disabled=True`)
    CONFIGURED = "configured"
    #: first use could not configure from the environment (a bad endpoint): a
    #: configuration that records but exports nothing is in force until `configure()`
    DISABLED = "disabled"
    #: `shutdown()` ended the configuration: what is recorded is not exported until `configure()`
    SHUT_DOWN = "shut down"
    #: a forked child of a parent configured with its own provider, not used yet:
    #: first use configures again from the parent's `configure()` arguments
    FORKED = "forked"


class Runtime:
    """The SDK's state and its transitions; `runtime` is the one instance."""

    def __init__(self) -> None:
        self.state = State.UNCONFIGURED
        #: the configuration in force, read without a lock (CONFIGURED and DISABLED only)
        self._current: Tracing | None = None
        #: SHUT_DOWN: the settings of the configuration `shutdown()` ended
        self._ended: Settings | None = None
        #: SHUT_DOWN: the configuration that exports nothing, once first asked for
        self._after_shutdown: Tracing | None = None
        #: FORKED: the parent's `configure()` arguments
        self._parent_arguments: dict[str, Any] | None = None
        #: held while a transition sets the state
        self._lock = threading.Lock()
        #: held while first use configures (re-entrant: configure() logs, and a host's
        #: log handler may be instrumented); the other threads wait for that one
        self._first_use_lock = threading.RLock()
        #: cold-path flushes (engine steps, CUDA timings, GPU sampler, finished requests)
        #: run before the provider flushes, so their last spans still leave the process
        self._flush_hooks: list[Callable[[], object]] = []
        #: what a forked child resets, in the order registered (`on_fork_in_child`)
        self._fork_callbacks: list[Callable[[], object]] = []
        #: replaced configurations ending on a thread of their own (`configure()`)
        self._ending: set[threading.Thread] = set()
        self._ending_lock = threading.Lock()
        self._exit = ExitFlush(self.shutdown, self._configure_for_waiting_work)

    # ---- the public transitions ---------------------------------------------
    def configure(
        self,
        endpoint: str | None = None,
        service_name: str | None = None,
        protocol: str | None = None,
        *,
        record_content: bool | None = None,
        resource_attributes: dict[str, Any] | None = None,
        tracer_provider: TracerProvider | None = None,
        exporter: SpanExporter | None = None,
        disabled: bool | None = None,
        cold_start_requests: int | None = None,
        cold_start_idle_s: float | None = None,
    ) -> Tracing:
        """Gives the configured SDK: spans go over OTLP to a tokentrace collector.

        Pass `tracer_provider` to reuse the host's own OpenTelemetry set-up, or
        `exporter` to export somewhere else (tests use an in-memory exporter).
        Calling it again replaces the previous configuration, which is shut down on a
        background thread (its last spans still leave; `shutdown()` and exit wait for it).
        `cold_start_requests` (default 1) requests after process start, or after
        `cold_start_idle_s` (default 300) idle seconds, are marked cold starts.
        """
        arguments = dict(
            endpoint=endpoint, service_name=service_name, protocol=protocol,
            record_content=record_content, resource_attributes=resource_attributes,
            exporter=exporter, disabled=disabled, cold_start_requests=cold_start_requests,
            cold_start_idle_s=cold_start_idle_s,
        )  # fmt: skip
        settings = Settings.resolve(
            endpoint,
            service_name,
            protocol,
            record_content,
            disabled,
            cold_start_requests,
            cold_start_idle_s,
        )
        tracing = _tracing.build(
            settings,
            resource_attributes=resource_attributes,
            tracer_provider=tracer_provider,
            exporter=exporter,
            before_flush=self.run_flush_hooks,
        )
        if tracer_provider is None:
            tracing.configured_with = arguments
        self._exit.after_configure()
        if self.state is State.CONFIGURED:
            self.run_flush_hooks()  # pending data belongs to the old configuration
        with self._lock:
            previous = self._current if self.state is State.CONFIGURED else None
            self._become(State.CONFIGURED, tracing)
        if previous is not None:
            # off the caller's thread: a dead collector must not hold up configure();
            # tt.shutdown() and exit give it the time left to send its last spans
            previous.closed = True
            self._end_in_background(previous)
        return tracing

    def get_tracing(self) -> Tracing:
        """Gives the current SDK state, configuring from the environment on first use.

        After `shutdown()` (until `configure()` is called again) it gives a
        configuration that exports nothing, and says so once in the log: a
        request that ends while the host shuts down must not start an exporter
        to the default endpoint.  Threads whose first requests come at once
        configure it once: the others wait for that one (no provider is made and
        shut down again on a request's thread).
        """
        tracing = self._current
        if tracing is not None:
            return tracing
        with self._first_use_lock:
            tracing = self._current
            if tracing is not None:
                return tracing
            state = self.state
            if state is State.FORKED:  # the parent's configuration, the child's own resource
                return self.configure(**(self._parent_arguments or {}))
            if state is State.SHUT_DOWN:
                return self._exporting_nothing_after_shutdown()
            try:
                return self.configure()
            except ValueError as exc:  # the environment's mistake must not fail a request
                return self._disable(f"not configured, nothing is exported: {exc}")

    def shutdown(self) -> None:
        """Flushes and stops the exporter; safe to call twice.

        What waits in the SDK's queues is built into spans and exported first: where
        nothing configured the SDK in this process (only engine steps or GPU samples
        recorded, or a fork child that has not used it yet) it is configured for that
        as first use would, from the environment (a fork child: from the parent's
        `configure()` arguments); unless disabled.  Returns within `SHUTDOWN_TIMEOUT_S`
        (5 s) plus the flush hooks, collector down or not: what is not sent by then is
        dropped.  Until `configure()` is called again, what the SDK records is not
        exported.
        """
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S
        self._configure_for_waiting_work()  # queued, never configured: as first use would
        if self.state is State.CONFIGURED:
            self.run_flush_hooks()
        with self._lock:
            tracing = self._current if self.state is State.CONFIGURED else None
            if tracing is not None:
                self._become(State.SHUT_DOWN, ended=tracing.settings)
        if tracing is not None:
            _tracing.end(tracing, int(max(0.0, deadline - time.monotonic()) * 1000))
        # configurations replaced by configure() end in the background: give them the time left
        self._wait_for_ending(deadline)

    def flush_before_exit(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> bool:
        """Gives whether everything the SDK holds left the process: what waits is built
        into spans and exported, as at exit, but the SDK stays configured.

        For a server's own shutdown (the ASGI middleware calls it when the app's
        lifespan shutdown completes): uvicorn then raises the SIGTERM it caught
        again and the process dies by it, so no atexit handler runs.  Not
        `shutdown()`: a host may go on using the SDK after an app's lifespan ends
        (Starlette's `TestClient` runs one per `with`, a program may serve again).
        Waits on the collector `timeout_s` at most; building the waiting spans runs
        on the caller's thread.  Nothing is configured here but where work waits that
        nothing configured (engine steps only: `shutdown()`'s case).
        """
        deadline = time.monotonic() + timeout_s
        ok = True
        self._configure_for_waiting_work()
        tracing = self._current if self.state is State.CONFIGURED else None
        if tracing is not None:
            ok = tracing.force_flush(int(timeout_s * 1000))
        # configurations replaced by configure() still end in the background
        return self._wait_for_ending(deadline) and ok

    def exports_nothing(self) -> bool:
        """Whether nothing is exported now, known without configuring anything: after
        `shutdown()` (until `configure()`), or disabled.  For the SDK's background
        threads, which must not make a configuration (a `TracerProvider`) at exit."""
        tracing = self._current
        if tracing is not None:
            return tracing.settings.disabled or tracing.closed
        return self.state is State.SHUT_DOWN

    def reset(self) -> None:
        """Forgets the configuration without ending it: unconfigured again, as a new
        process starts (tests start from there)."""
        with self._lock:
            self._become(State.UNCONFIGURED)

    # ---- what the SDK's parts register --------------------------------------
    def add_flush_hook(self, hook: Callable[[], object]) -> None:
        """Registers `hook` to run before spans are flushed at shutdown / reconfigure."""
        if hook not in self._flush_hooks:
            self._flush_hooks.append(hook)

    def run_flush_hooks(self) -> None:
        """Builds what waits in the SDK's queues into spans (each hook's failure logged once)."""
        for hook in list(self._flush_hooks):
            try:
                hook()
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once(f"flush hook {getattr(hook, '__qualname__', hook)!s}", exc)

    def register_exit_flush(self, work_waits: Callable[[], object]) -> None:
        """Has exit build and export what a queue holds, configured or not (`ExitFlush.register_queue`)."""
        self._exit.register_queue(work_waits)

    def on_fork_in_child(self, callback: Callable[[], object]) -> None:
        """Registers `callback` to run in a forked child, after the runtime's own reset:
        it drops the parent's threads and queued work, and makes its locks again
        (another thread may have held one at the fork)."""
        if callback not in self._fork_callbacks:
            self._fork_callbacks.append(callback)

    def after_fork_in_child(self) -> None:
        """The one at-fork handler: makes a forked child its own instance.

        In this order: the locks every later step may take (`log_once`'s, the
        runtime's, pending spans'); the configuration (a parent configured with its
        own provider: the child configures again on first use, from the parent's
        `configure()` arguments, so that its resource says its own `process.pid`;
        a provider the host passed in is the host's to remake); each registered
        part, in the order it registered; the exit flush of a multiprocessing child.
        Kept as the parent's, every worker's spans and engine steps would read as
        one instance's.
        """
        _safety.after_fork_in_child()
        self._lock = threading.Lock()
        self._first_use_lock = threading.RLock()
        self._ending_lock = threading.Lock()
        self._ending.clear()  # the parent's threads do not exist here
        _pending_span.after_fork_in_child()
        tracing = self._current
        arguments = None if tracing is None else tracing.configured_with
        if self.state is State.CONFIGURED and arguments is not None:
            self._become(State.FORKED, parent_arguments=arguments)
        for callback in list(self._fork_callbacks):
            try:
                callback()
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once(f"after fork {getattr(callback, '__qualname__', callback)!s}", exc)
        self._exit.after_fork_in_child()

    # ---- inside the transitions ---------------------------------------------
    def _become(
        self,
        state: State,
        current: Tracing | None = None,
        *,
        ended: Settings | None = None,
        parent_arguments: dict[str, Any] | None = None,
    ) -> None:
        """Sets `state` and what it keeps, nothing of any other state: under `_lock`
        (or in a forked child, where only this thread runs)."""
        if (current is not None) != (state in (State.CONFIGURED, State.DISABLED)):
            raise RuntimeError(f"tokentrace: the {state.value} state keeps no configuration")
        if (ended is not None) != (state is State.SHUT_DOWN):
            raise RuntimeError(f"tokentrace: the {state.value} state keeps no ended settings")
        if (parent_arguments is not None) != (state is State.FORKED):
            raise RuntimeError(f"tokentrace: the {state.value} state keeps no parent arguments")
        self.state = state
        self._current = current
        self._ended = ended
        self._after_shutdown = None
        self._parent_arguments = parent_arguments

    def _disable(self, why: str) -> Tracing:
        """Gives a configuration that records but exports nothing, in force until
        `configure()`, and says `why` once."""
        tracing = _tracing.build_exporting_nothing(self._unusable_settings(), self.run_flush_hooks)
        with self._lock:
            if self.state is State.UNCONFIGURED:
                self._become(State.DISABLED, tracing)
            elif self._current is not None:  # configure() came meanwhile, on another thread
                tracing = self._current
        log_once(why)
        return tracing

    def _exporting_nothing_after_shutdown(self) -> Tracing:
        """Gives the configuration that exports nothing after `shutdown()` (made once,
        with the ended configuration's settings), and says so once."""
        with self._lock:
            if self.state is not State.SHUT_DOWN and self._current is not None:
                return self._current  # configure() came meanwhile, on another thread
            tracing = self._after_shutdown
            if tracing is None:
                settings = self._ended or self._unusable_settings()
                tracing = _tracing.build_exporting_nothing(settings, self.run_flush_hooks)
                if self.state is State.SHUT_DOWN:
                    self._after_shutdown = tracing
        log_once(
            "used after tt.shutdown(): spans, engine steps and samples from here on are "
            "not exported (call tt.configure() to start again)"
        )
        return tracing

    @staticmethod
    def _unusable_settings() -> Settings:
        """Gives the settings of a configuration made without usable ones: defaults, disabled."""
        return Settings(
            endpoint=DEFAULT_HTTP_ENDPOINT,
            service_name=service_name_from_env(),
            protocol=PROTOCOLS[0],
            record_content=False,
            disabled=True,
        )

    def _configure_for_waiting_work(self) -> None:
        """Configures the SDK as its first use would where work waits in its queues and
        nothing configured it in this process: a process that only recorded engine steps
        or GPU samples, or a fork child (whose configuration is made again on first use).
        Not after `shutdown()`, nor where the SDK is disabled: nothing is made then."""
        state = self.state
        if state not in (State.UNCONFIGURED, State.FORKED) or not self._exit.work_waits():
            return
        parent = self._parent_arguments if state is State.FORKED else None
        disabled = None if parent is None else parent.get("disabled")
        if disabled if disabled is not None else disabled_by_env():
            return
        self.get_tracing()

    def _end_in_background(self, tracing: Tracing) -> None:
        """Ends a replaced configuration on a daemon thread, remembered until it ends
        so that `_wait_for_ending` can give it the time left."""

        def end() -> None:
            try:
                tracing.shutdown()
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("replaced-shutdown", exc)
            finally:
                with self._ending_lock:
                    self._ending.discard(thread)

        thread = threading.Thread(target=end, name="tokentrace-replaced-shutdown", daemon=True)
        with self._ending_lock:
            self._ending.add(thread)
        thread.start()

    def _wait_for_ending(self, deadline: float) -> bool:
        """Waits until `deadline` (monotonic seconds) at most for replaced configurations
        to end; gives whether all did."""
        with self._ending_lock:
            threads = list(self._ending)
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in threads)


runtime = Runtime()
if hasattr(os, "register_at_fork"):  # POSIX: the SDK's one at-fork handler
    os.register_at_fork(after_in_child=runtime.after_fork_in_child)

# the public transitions (`tt.configure`, `tt.get_tracing`, `tt.shutdown`)
configure = runtime.configure
get_tracing = runtime.get_tracing
shutdown = runtime.shutdown
