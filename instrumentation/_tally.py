"""Forward-pass time accumulated on a request or an engine step."""

from __future__ import annotations


class DeviceTally:
    """Sums host and device time of the forward passes that ran for one owner.

    The owners (an engine step, a request) are tallies themselves: a forward
    adds to the object already at hand, with no tally to make per step.  They
    zero the five fields in their own `__init__` (no call to this class's).
    `fwd_count`, `fwd_host_ns` and `fwd_launched` (forwards timed with CUDA events) are
    written only by the thread running the model, `fwd_resolved` and `fwd_device_ns`
    only by the timing worker: no lock is needed, and the owner knows its
    device time is complete when both counts agree.
    """

    __slots__ = ("fwd_count", "fwd_host_ns", "fwd_launched", "fwd_resolved", "fwd_device_ns")
    fwd_count: int
    fwd_host_ns: int
    fwd_launched: int
    fwd_resolved: int
    fwd_device_ns: int

    @property
    def fwd_complete(self) -> bool:
        """Whether every CUDA-timed forward's device time has been read."""
        return self.fwd_resolved >= self.fwd_launched
