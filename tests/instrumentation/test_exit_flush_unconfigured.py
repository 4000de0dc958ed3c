"""What a process queued leaves it at exit even where nothing called `tt.configure()`.

Recording an engine step (`tt.engine_step()`, `tt.record_step`) or a GPU sample
configures nothing: the flusher's first pass did, ~1 s later.  A steps-only
process (an engine core, forked or spawned, a script) that ended before it lost
every step, silently; a fork child of a configured parent lost them even at
`tt.shutdown()`.  Real child processes export over OTLP/HTTP to a real receiver:
`tokentrace serve`, or one kept here that records what it is sent.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from tt_testkit import OtlpHttpSink, free_port

from tokentrace.instrumentation import semconv as sc

#: what the exit of a child may take here, its interpreter's start and teardown included
#: (as test_export_collector_down.py bounds it: far from a wait on the collector)
BOUND_S = 10.0
STEPS = 5


class Receiver(OtlpHttpSink):
    """A sink for what children export: the spans (name, attributes, resource attributes)
    and the number of GPU sample points."""

    @property
    def spans(self) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
        return [
            (s.name, _attrs(s.attributes), _attrs(rs.resource.attributes))
            for body in self.bodies("/v1/traces")
            for rs in ExportTraceServiceRequest.FromString(body).resource_spans
            for ss in rs.scope_spans
            for s in ss.spans
        ]

    @property
    def metric_points(self) -> int:
        return sum(
            len(m.gauge.data_points)
            for body in self.bodies("/v1/metrics")
            for rm in ExportMetricsServiceRequest.FromString(body).resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
        )

    def steps(self, request_id: str) -> list[dict[str, Any]]:
        """Gives the resource of every step naming `request_id`, one entry a step."""
        got = []
        for name, attrs, resource in self.spans:
            if name != sc.SPAN_ENGINE_STEPS:
                continue
            ids = sc.unpack_list(attrs[sc.STEP_REQUEST_IDS])
            got += [resource for step_ids in ids if request_id in step_ids.split(",")]
        return got

    def names(self) -> list[str]:
        return [name for name, _, _ in self.spans]


def _attrs(key_values: Any) -> dict[str, Any]:
    return {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in key_values}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _run(tmp_path: Path, script: str, env: dict[str, str], *args: str) -> str:
    """Runs `script` as a file (a spawn child imports its main module) with only `env`'s
    SDK variables; gives its output once it has ended (its exit flush done)."""
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(script))
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TOKENTRACE_", "OTEL_"))}
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, str(path), *args],
        env={**environ, **env},
        capture_output=True,
        timeout=120,
    )
    took = time.monotonic() - started
    out = proc.stdout.decode() + proc.stderr.decode()
    assert proc.returncode == 0, out
    assert took < BOUND_S, out
    return out


_STEPS_ONLY = """
import sys, time
from tokentrace import instrumentation as tt

for i in range(3):
    with tt.engine_step(decode=["r1", "r2"]) as step:
        step.prefill("r3", 16)
        time.sleep(0.005)
for i in range(2):
    now = time.time_ns()
    tt.record_step(start_ns=now - 1_000_000, end_ns=now, prefill_tokens=0, decode_seqs=1,
                   batch_size=1, queue_depth=0, request_ids=["r1"])
print("recorded; exiting", flush=True)
"""


def test_a_steps_only_script_configured_by_the_environment_sends_every_step(
    serve,  # type: ignore[no-untyped-def]
    tmp_path: Path,
) -> None:
    """The reviewer's case: an engine configured only by OTEL_* variables, exiting at once."""
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": serve.otlp_http, "OTEL_SERVICE_NAME": "engine"}
    out = _run(tmp_path, _STEPS_ONLY, env)
    serve.stop()
    assert serve.rows("SELECT service, count(*) FROM engine_steps GROUP BY ALL") == [
        ("engine", 5)
    ], out


def test_a_steps_only_script_exits_quickly_with_the_collector_refused(tmp_path: Path) -> None:
    """Configured at exit, it is bounded as the exit of a configured SDK is."""
    env = {"TOKENTRACE_ENDPOINT": f"http://127.0.0.1:{free_port()}"}  # nothing listens
    out = _run(tmp_path, _STEPS_ONLY, env)  # (bounded by BOUND_S there)
    assert "recorded; exiting" in out


_CHILD = """
import multiprocessing as mp, os, sys, time
from tokentrace import instrumentation as tt

def engine_core():
    for i in range({steps}):
        with tt.engine_step(decode=["child"]):
            time.sleep(0.005)

if __name__ == "__main__":
    method, endpoint = sys.argv[1], sys.argv[2]
    tt.configure(endpoint=endpoint, service_name="engine")
    print("parent", os.getpid(), flush=True)
    if method == "os.fork":
        pid = os.fork()
        if pid == 0:
            engine_core()
            sys.exit(0)  # a normal exit: the atexit handlers it inherited run
        assert os.waitpid(pid, 0)[1] == 0
    else:
        p = mp.get_context(method).Process(target=engine_core)
        p.start()
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    tt.shutdown()
"""


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("method", ["fork", "spawn", "os.fork"])
def test_an_engine_core_child_sends_its_steps(
    method: str, receiver: Receiver, tmp_path: Path
) -> None:
    """A configured parent; its child (vLLM V1's engine core) only records steps and
    returns: it was never configured itself (a fork child makes its configuration on
    first use; a spawn child reads the environment, here as the parent's deployment sets it)."""
    env = {"TOKENTRACE_ENDPOINT": receiver.url, "TOKENTRACE_SERVICE_NAME": "engine"}
    out = _run(tmp_path, _CHILD.format(steps=STEPS), env, method, receiver.url)
    resources = receiver.steps("child")
    assert len(resources) == STEPS, out
    parent = int(out.split("parent ", 1)[1].split()[0])
    # the child's own resource: its steps read as its own instance, not the parent's
    assert {r["process.pid"] for r in resources} != {parent}, out


_ENDING = """
import os, sys, time
from tokentrace import instrumentation as tt
from tokentrace.instrumentation._runtime import runtime

for i in range({steps}):
    with tt.engine_step(decode=["ended"]):
        time.sleep(0.005)
if sys.argv[1] == "shutdown":
    tt.shutdown()
else:
    assert runtime.flush_before_exit(5.0)
os._exit(0)  # no atexit: only what the call above sent arrives
"""


@pytest.mark.slow
@pytest.mark.parametrize("call", ["shutdown", "flush_before_exit"])
def test_shutdown_and_flush_before_exit_send_steps_never_configured(
    call: str, receiver: Receiver, tmp_path: Path
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url}
    out = _run(tmp_path, _ENDING.format(steps=STEPS), env, call)
    assert len(receiver.steps("ended")) == STEPS, out


_REQUESTS_ONLY = """
from tokentrace import instrumentation as tt

for i in range(3):
    with tt.request(model="m") as req:
        req.start_phase("prefill"); req.token(); req.end_phase("prefill")
        req.token()
print("exiting", flush=True)
"""


@pytest.mark.slow
def test_a_requests_only_script_sends_its_request_spans(receiver: Receiver, tmp_path: Path) -> None:
    out = _run(tmp_path, _REQUESTS_ONLY, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    names = receiver.names()
    assert names.count(sc.SPAN_REQUEST) == 3, out
    assert names.count(sc.SPAN_PREFILL) == 3, out


_FAKE_GPU = """
from tokentrace import instrumentation as tt

class Gpus:
    def device_count(self): return 2
    def read(self, index): return tt.GpuReading(50.0, 1 << 30, 80 << 30, 1410.0, 250.0)
    def close(self): pass
"""

_GPU_ONLY = (
    _FAKE_GPU
    + """
sampler = tt.start_gpu_sampler(backend=Gpus())
sampler.sample_once()
print("exiting", flush=True)
"""
)


@pytest.mark.slow
def test_a_gpu_sampler_never_configured_sends_its_samples_at_exit(
    receiver: Receiver, tmp_path: Path
) -> None:
    """The sampler's exporter ships every second: at exit it ships what waits."""
    out = _run(tmp_path, _GPU_ONLY, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    assert receiver.metric_points >= 2 * 5, out  # one sample of two GPUs, five gauges each


_EVERYTHING = (
    _FAKE_GPU
    + """
import time
sampler = tt.start_gpu_sampler(backend=Gpus())
sampler.sample_once()
for i in range(3):
    with tt.engine_step(decode=["off"]):
        time.sleep(0.005)
with tt.request(model="m") as req:
    req.token()
print("exiting", flush=True)
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("variable", ["TOKENTRACE_DISABLED", "OTEL_SDK_DISABLED"])
def test_disabled_sends_nothing_and_exits_quickly(
    variable: str, receiver: Receiver, tmp_path: Path
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, variable: "true"}
    out = _run(tmp_path, _EVERYTHING, env)  # (bounded by BOUND_S there)
    assert "exiting" in out
    assert receiver.spans == [], out
    assert receiver.metric_points == 0, out


@pytest.mark.slow
def test_the_same_script_enabled_sends_all_of_it(receiver: Receiver, tmp_path: Path) -> None:
    """The script the disabled test runs, enabled: it is not silent for another reason."""
    out = _run(tmp_path, _EVERYTHING, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url})
    assert len(receiver.steps("off")) == 3, out
    assert receiver.names().count(sc.SPAN_REQUEST) == 1, out
    assert receiver.metric_points >= 2 * 5, out
