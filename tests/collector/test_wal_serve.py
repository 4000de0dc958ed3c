"""The write-ahead log in a real `tokentrace serve`: a serve killed with -9 loses nothing
it acknowledged, and stores nothing twice when the next one replays its log (issue 23)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

import httpx
import pytest
from otlp_traces import new_id, request_trace, to_json, to_protobuf
from tt_testkit import ServeProcess, start_serve, unwritable, wait_started

from tokentrace.collector.wal import wal_dir
from tokentrace.collector.wal_format import segment_paths
from tokentrace.instrumentation import semconv as sc

PROTOBUF = {"Content-Type": "application/x-protobuf"}
#: grace short, so the test's early traces are committed within it; a server span whose
#: client never comes waits a minute, so it holds the log's checkpoint back
FAST = ("--grace-s", "0.2", "--client-wait-s", "60", "--decode-processes", "0")


def _post(client: httpx.Client, serve: ServeProcess, ids: list[str], json: bool = False) -> None:
    """Posts one export holding one request per id; asserts it was acknowledged."""
    spans = [s for rid in ids for s in request_trace(attributes={sc.REQUEST_ID: rid})]
    url = f"{serve.otlp_http}/v1/traces"
    if json:
        reply = client.post(url, json=to_json(spans))
    else:
        reply = client.post(url, content=to_protobuf(spans).SerializeToString(), headers=PROTOBUF)
    assert reply.status_code == 200, reply.text


def _metric(serve: ServeProcess, name: str) -> float:
    for line in httpx.get(f"{serve.otlp_http}/metrics").text.splitlines():
        if line.startswith((name + " ", name + "_total ")):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


def _wait_written(serve: ServeProcess, requests: int) -> None:
    deadline = time.monotonic() + 30
    while _metric(serve, "tokentrace_requests_written") < requests:
        assert time.monotonic() < deadline, "the requests were not written in time"
        time.sleep(0.1)


def _killed(serve: ServeProcess) -> None:
    serve.proc.kill()
    serve.proc.wait()
    serve.stop()  # reads its output, closes the pipe


def _stored(serve: ServeProcess) -> collections.Counter[str]:
    return collections.Counter(str(rid) for (rid,) in serve.rows("SELECT request_id FROM requests"))


@pytest.mark.slow
def test_a_serve_killed_with_9_loses_nothing_it_acknowledged_and_stores_nothing_twice(
    tmp_path: Path,
) -> None:
    serve = start_serve(tmp_path, "--wal", "on", *FAST)
    posted: list[str] = []
    with httpx.Client(timeout=30) as client:
        # committed before the kill
        early = [f"early-{i}" for i in range(20)]
        _post(client, serve, early)
        posted += early
        _wait_written(serve, len(early))
        # a server span whose client span never comes: pending, it holds the checkpoint
        orphan = request_trace(parent_span_id=new_id(8), attributes={sc.REQUEST_ID: "orphan"})
        reply = client.post(
            f"{serve.otlp_http}/v1/traces",
            content=to_protobuf(orphan).SerializeToString(),
            headers=PROTOBUF,
        )
        assert reply.status_code == 200
        posted.append("orphan")
        # committed after the checkpoint: the replay holds them again
        middle = [f"middle-{i}" for i in range(20)]
        _post(client, serve, middle, json=True)
        posted += middle
        _wait_written(serve, len(early) + len(middle))
        # acknowledged, still in the tail buffer when the serve is killed
        for n in range(150):
            ids = [f"tail-{n}-{i}" for i in range(1 + n % 4)]
            _post(client, serve, ids, json=n % 5 == 0)
            posted += ids
    _killed(serve)
    assert segment_paths(wal_dir(serve.db))

    again = start_serve(tmp_path, "--wal", "on", *FAST, db=serve.db)
    wait_started(again)
    out = again.stop()
    assert "replayed" in out and "write-ahead log" in out, out
    stored = _stored(again)
    twice = {rid: n for rid, n in stored.items() if n > 1}
    assert not twice, f"stored more than once: {twice}"
    missing = set(posted) - set(stored)
    assert not missing, f"{len(missing)} acknowledged requests lost, e.g. {sorted(missing)[:5]}"
    assert len(stored) == len(posted)


@pytest.mark.slow
def test_a_clean_stop_leaves_nothing_to_replay(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--wal", "on", *FAST)
    with httpx.Client(timeout=30) as client:
        _post(client, serve, ["one", "two"])
    serve.stop()
    again = start_serve(tmp_path, "--wal", "on", *FAST, db=serve.db)
    wait_started(again)
    out = again.stop()
    assert "replayed" not in out, out
    assert _stored(again) == {"one": 1, "two": 1}


@pytest.mark.slow
def test_with_wal_off_a_killed_serve_loses_its_tail_buffer_as_before(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--wal", "off", "--grace-s", "60")
    with httpx.Client(timeout=30) as client:
        _post(client, serve, ["buffered"])
    _killed(serve)
    assert not wal_dir(serve.db).exists()
    again = start_serve(tmp_path, "--wal", "off", db=serve.db)
    wait_started(again)
    out = again.stop()
    assert "tail buffer" in out and "was lost" in out, out
    assert _stored(again) == {}


@pytest.mark.slow
def test_an_export_the_log_cannot_write_is_answered_503_with_the_reason(tmp_path: Path) -> None:
    serve = start_serve(tmp_path, "--wal", "on", *FAST)
    log = wal_dir(serve.db)
    spans = request_trace(attributes={sc.REQUEST_ID: "not-logged"})
    with httpx.Client(timeout=30) as client:
        _post(client, serve, ["before"])
        [segment] = segment_paths(log)
        with unwritable(segment), unwritable(log):  # (as a full disk refuses the write)
            reply = client.post(f"{serve.otlp_http}/v1/traces", json=to_json(spans))
            ready = client.get(f"{serve.otlp_http}/readyz")
        assert reply.status_code == 503, reply.text
        assert "write-ahead log" in reply.json()["message"]
        assert reply.headers["Retry-After"] == "1"
        assert ready.status_code == 503
        assert "write-ahead log" in ready.json()["reason"]
        _post(client, serve, ["after"])  # it writes again
        assert client.get(f"{serve.otlp_http}/readyz").status_code == 200
        assert _metric(serve, "tokentrace_wal_writable") == 1
    out = serve.stop()
    assert "cannot be written" in out and "written again" in out, out
    stored = _stored(serve)
    assert stored["before"] == stored["after"] == 1
    assert stored["not-logged"] <= 1  # taken into the buffer: stored once, or not at all
