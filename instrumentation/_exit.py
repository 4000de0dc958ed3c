"""The exit flush: what the SDK's queues hold is built into spans and exported as the process ends.

Where the process ends decides what runs: atexit in a plain interpreter exit;
a multiprocessing child ends with `os._exit` after its target returns, so only
multiprocessing's own finalizers run there; and `Resource.create` (making a
configuration) needs a thread pool that takes no work once the interpreter began
joining its threads, before atexit.  `ExitFlush` registers the runtime's
shutdown in each place it is needed, once a process.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable

from tokentrace.instrumentation._safety import log_once


class ExitFlush:
    """The runtime's exit handlers, and the checks that say whether work waits in a queue."""

    def __init__(
        self, shutdown: Callable[[], object], configure_for_waiting_work: Callable[[], object]
    ) -> None:
        self._shutdown = shutdown
        self._configure_for_waiting_work = configure_for_waiting_work
        #: whether work waits in a queue (engine steps, finished requests, GPU samples):
        #: added as each queue's daemon thread starts (`register_queue`)
        self._waiting_checks: list[Callable[[], object]] = []
        #: the pid whose queues registered the exit flush (once per process)
        self._queues_pid: int | None = None
        #: the pid whose multiprocessing exit runs the flush (once per process)
        self._finalizer_pid: int | None = None
        self._lock = threading.Lock()

    def after_configure(self) -> None:
        """Has exit run the flush before the atexit handlers registered so far, and a
        multiprocessing child run it too.

        At exit, what waits in the SDK's queues (finished requests, engine steps)
        must become spans before a host provider's own atexit shutdown exports the
        last batch: atexit runs last-registered first, so ours moves after it.
        """
        atexit.unregister(self.at_exit)
        atexit.register(self.at_exit)
        self._flush_at_multiprocessing_exit()

    def register_queue(self, work_waits: Callable[[], object]) -> None:
        """Has this process's exit build and export what its queues hold, also where
        nothing configured the SDK: called when a queue's daemon thread starts (once a
        queue and process: never on the hot path, never at import).

        Recording an engine step or a GPU sample configures nothing (the flusher's
        first pass did, a second later), and without `configure()` no exit handler
        was registered: a process that only records steps (an engine core, forked or
        spawned) and exits before lost them all.  `work_waits` says whether anything
        waits; where it does and nothing configured the SDK, it is configured as first
        use would when the main thread ends, or in `shutdown()` (which atexit, or a
        multiprocessing child's exit finalizers, run).
        """
        if work_waits not in self._waiting_checks:
            self._waiting_checks.append(work_waits)
        pid = os.getpid()
        if self._queues_pid == pid:
            return
        try:
            with self._lock:
                if self._queues_pid == pid:
                    return
                self._queues_pid = pid
                # after a host provider's atexit shutdown registered before, so run before it
                atexit.unregister(self.at_exit)
                atexit.register(self.at_exit)
            self._configure_when_the_main_thread_ends()
            self._flush_at_multiprocessing_exit()  # where atexit does not run
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("exit flush", exc)

    def work_waits(self) -> bool:
        """Whether any queue holds work that exit must still build and export."""
        for check in list(self._waiting_checks):
            try:
                if check():
                    return True
            except Exception as exc:  # the SDK's own failure must never reach the host
                log_once("exit flush: what waits", exc)
        return False

    def at_exit(self) -> None:
        """At interpreter exit: what waits becomes spans, and leaves within `SHUTDOWN_TIMEOUT_S`."""
        try:
            self._shutdown()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("shutdown at exit", exc)

    def after_fork_in_child(self) -> None:
        """In a forked child: a new lock, and the exit flush registered for a
        multiprocessing child once its after-fork callbacks run."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        util = sys.modules.get("multiprocessing.util")
        if util is None:
            return
        # a multiprocessing child clears its finalizers before its target runs, then
        # calls the after-fork callbacks: the exit flush is registered there (a host
        # provider's child, configured from the parent, never calls configure());
        # multiprocessing holds `self` weakly, the runtime holds it for good
        try:
            util.register_after_fork(self, ExitFlush._flush_at_multiprocessing_exit)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("exit flush in a multiprocessing child", exc)

    def _configure_when_the_main_thread_ends(self) -> None:
        """Has the SDK configured, where work waits and nothing configured it, when the
        main thread ends: by atexit it can no longer be (`Resource.create` runs its
        detectors on a `ThreadPoolExecutor`, which takes no work once the interpreter
        began joining its threads, before atexit).  `threading`'s own exit callbacks
        run then, last registered first: `concurrent.futures`' (which shuts its executors)
        is registered before this one, so runs after it."""
        import concurrent.futures.thread  # noqa: F401 - registers its exit callback now

        register = getattr(threading, "_register_atexit", None)  # CPython 3.9+
        if register is not None:
            register(self._configure_at_exit)

    def _configure_at_exit(self) -> None:
        try:
            self._configure_for_waiting_work()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("configure at exit", exc)

    def _flush_at_multiprocessing_exit(self) -> None:
        """Has a multiprocessing child run the exit flush: it ends with `os._exit` after
        its target returns, so atexit never runs there (a fork child's spans, up to a
        second of them, were lost).  multiprocessing runs its own `util.Finalize`
        callbacks first (`util._exit_function`); registered once per process, and
        only where the host imported multiprocessing itself."""
        util = sys.modules.get("multiprocessing.util")
        process = sys.modules.get("multiprocessing.process")
        if util is None or process is None or self._finalizer_pid == os.getpid():
            return
        try:
            if process.parent_process() is None:
                return  # not a multiprocessing child: atexit runs
            # exit priority 0: after the host's own finalizers of higher priority, before
            # multiprocessing joins this process's children and its queues' feeder threads
            util.Finalize(None, self.at_exit, exitpriority=0)
            self._finalizer_pid = os.getpid()
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("exit flush in a multiprocessing child", exc)
