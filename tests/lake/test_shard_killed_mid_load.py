"""The product owner's check: the same traces sent to one collector, and through a trace-id
router to two shards writing one lake while one shard is killed with -9 mid-load and
restarted, give the same request rows (same buckets, same flags), each once.

What carries it: the killed shard's write-ahead log (every export it answered 200 is replayed
at restart), its local file (what it had committed and not yet moved moves after the restart),
the lake's ledger (nothing moved twice), and the router's retries (what the dead shard never
acknowledged is sent again, as the loadbalancing exporter's retry queue does)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from lake_testkit import lake_connection
from otlp_router import OtlpRouter
from otlp_traces import new_id, request_trace, to_protobuf
from tt_testkit import free_port, start_serve

pytestmark = [pytest.mark.slow, pytest.mark.alone]

EXPORTS = 40
TRACES_PER_EXPORT = 25
#: the columns that say where a request's time went and what was marked on it
COMPARED = "trace_id, request_id, e2e_ms, queue_ms, prefill_ms, decode_ms, network_ms, ttft_ms, tpot_ms, error, flags"


def _export(i: int) -> bytes:
    start = time.time_ns()
    spans = []
    for k in range(TRACES_PER_EXPORT):
        spans += request_trace(
            new_id(16), start_ns=start + k * 1_000_000, tokens=5 + (i * 7 + k) % 40,
            ttft_ms=20.0 + (k * 13) % 90, queue_ms=1.0 + (i + k) % 30, error=(i * k) % 53 == 1,
        )  # fmt: skip
    return to_protobuf(spans).SerializeToString()


class Shard:
    """A `serve --lake` on fixed ports, so it restarts where the router sends."""

    def __init__(self, root: Path, name: str, lake: tuple[str, str]) -> None:
        self.root, self.name, self.lake = root, name, lake
        self.ports = [free_port(), free_port(), free_port()]
        root.mkdir(parents=True, exist_ok=True)
        self.proc = self._start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.ports[0]}"

    def _start(self) -> subprocess.Popen[bytes]:
        http, grpc, web = self.ports
        with open(self.root / "serve.log", "ab") as log:  # the child keeps its own copy
            proc = subprocess.Popen(
                [sys.executable, "-m", "tokentrace", "serve", "--db", str(self.root / "shard.duckdb"),
                 "--http-port", str(http), "--grpc-port", str(grpc), "--web-port", str(web),
                 "--lake", self.lake[0], "--lake-data", self.lake[1], "--shard", self.name],
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert proc.poll() is None, (self.root / "serve.log").read_text()
            try:
                with urllib.request.urlopen(self.url + "/readyz", timeout=5) as r:
                    if r.status == 200:
                        return proc
            except OSError:
                time.sleep(0.1)
        raise TimeoutError(f"shard {self.name} did not get ready")

    def kill_and_restart(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.proc = self._start()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)


def _route(router: OtlpRouter, body: bytes) -> None:
    """Sends one export through the router until every part is taken (a dead shard refuses
    connections: the part is sent again, as the exporter's retry queue does)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if router.route("/v1/traces", body) == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise TimeoutError("an export was never taken")


def test_a_shard_killed_mid_load_leaves_the_lake_equal_to_one_collector(
    lake: tuple[str, str], tmp_path: Path
) -> None:
    (tmp_path / "one").mkdir()
    one = start_serve(tmp_path / "one")
    shards = [Shard(tmp_path / name, name, lake) for name in ("a", "b")]
    router = OtlpRouter([s.url for s in shards])
    try:
        for i in range(EXPORTS):
            body = _export(i)
            request = urllib.request.Request(
                one.otlp_http + "/v1/traces", data=body,
                headers={"Content-Type": "application/x-protobuf"},
            )  # fmt: skip
            with urllib.request.urlopen(request, timeout=30) as r:
                assert r.status == 200
            _route(router, body)
            if i == EXPORTS // 2:
                shards[0].kill_and_restart()
    finally:
        for s in shards:
            s.stop()
        one.stop()
    conn = lake_connection(*lake, one.db)
    try:
        [(stored, distinct)] = conn.execute(
            "SELECT count(*), count(DISTINCT request_id) FROM lake.requests"
        ).fetchall()
        assert stored == distinct == EXPORTS * TRACES_PER_EXPORT  # every request, once
        for a, b in (("local0", "lake"), ("lake", "local0")):
            [(differ,)] = conn.execute(
                f"SELECT count(*) FROM (SELECT {COMPARED} FROM {a}.requests"  # noqa: S608 - fixed names
                f" EXCEPT ALL SELECT {COMPARED} FROM {b}.requests)"
            ).fetchall()
            assert differ == 0, (a, b)
    finally:
        conn.close()
    assert "replayed" in (tmp_path / "a" / "serve.log").read_text()  # what was acknowledged
