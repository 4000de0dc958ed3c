"""Forward-pass time accumulated on a request or an engine step."""

from __future__ import annotations


class DeviceTally:
    """Sums host and device time of the forward passes that ran for one owner.

    `count`, `host_ns` and `launched` (forwards timed with CUDA events) are
    written only by the thread running the model, `resolved` and `device_ns`
    only by the timing worker: no lock is needed, and the owner knows its
    device time is complete when both counts agree.
    """

    __slots__ = ("count", "host_ns", "launched", "resolved", "device_ns")

    def __init__(self) -> None:
        self.count = 0
        self.launched = 0
        self.host_ns = 0
        self.resolved = 0
        self.device_ns = 0

    @property
    def complete(self) -> bool:
        return self.resolved >= self.launched
