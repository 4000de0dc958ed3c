"""Fuzzed bodies get a 4xx (or a partial success), never a 5xx, and the server keeps serving."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from otlp_traces import request_trace, to_json, to_protobuf

PB = {"Content-Type": "application/x-protobuf"}
JSON_H = {"Content-Type": "application/json"}
VALID = to_protobuf(request_trace(tokens=30)).SerializeToString()
FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def server(tmp_path_factory):  # type: ignore[no-untyped-def]
    from collector_testkit import start_live

    live, stop = start_live(tmp_path_factory.mktemp("fuzz"), max_body_bytes=256 * 1024)
    client = httpx.Client(base_url=live.http)
    yield client
    client.close()
    stop()


def _ok_or_4xx(r: httpx.Response) -> None:
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:200])


def _still_serving(client: httpx.Client) -> None:
    r = client.post("/v1/traces", content=VALID, headers=PB)
    assert r.status_code == 200


@FUZZ
@given(cut=st.integers(min_value=1, max_value=len(VALID) - 1))
def test_truncated_protobuf(server, cut: int) -> None:  # type: ignore[no-untyped-def]
    _ok_or_4xx(server.post("/v1/traces", content=VALID[:cut], headers=PB))


@FUZZ
@given(body=st.binary(max_size=2048))
def test_random_bytes_as_protobuf_and_metrics(server, body: bytes) -> None:  # type: ignore[no-untyped-def]
    _ok_or_4xx(server.post("/v1/traces", content=body, headers=PB))
    _ok_or_4xx(server.post("/v1/metrics", content=body, headers=PB))


_json_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False),
                       st.text(max_size=20))  # fmt: skip
_json = st.recursive(
    _json_leaf,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=30,
)


@FUZZ
@given(path=st.lists(st.sampled_from(["resourceSpans", 0, "scopeSpans", "spans", "attributes",
                                      "traceId", "spanId", "kind", "status", "value", "resource"]),
                     min_size=1, max_size=6),  # fmt: skip
       value=_json)
def test_wrong_types_in_json(server, path: list, value: object) -> None:  # type: ignore[no-untyped-def,type-arg]
    doc = to_json(request_trace(tokens=3))
    node: object = doc
    for key in path[:-1]:  # walk as far as the path goes, then overwrite there
        try:
            node = node[key]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            break
    try:
        node[path[-1]] = value  # type: ignore[index]
    except (IndexError, TypeError):
        pass
    r = server.post("/v1/traces", content=json.dumps(doc), headers=JSON_H)
    _ok_or_4xx(r)
    _ok_or_4xx(server.post("/v1/metrics", content=json.dumps({"resourceMetrics": value}),
                           headers=JSON_H))  # fmt: skip


@FUZZ
@given(raw=st.binary(min_size=1, max_size=64))
def test_invalid_utf8(server, raw: bytes) -> None:  # type: ignore[no-untyped-def]
    body = b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "' + raw + b'\xff\xfe"}]}]}]}'
    _ok_or_4xx(server.post("/v1/traces", content=body, headers=JSON_H))
    # and inside protobuf strings (proto3 strings must be UTF-8)
    pb = VALID.replace(b"tokentrace.request", b"tokentrace.\xff\xfequest")
    _ok_or_4xx(server.post("/v1/traces", content=pb, headers=PB))


def test_huge_attributes_and_gzip_bombs_then_still_serving(server) -> None:  # type: ignore[no-untyped-def]
    spans = request_trace()
    spans[-1].attributes["tokentrace.prompt"] = "x" * 200_000
    big = to_protobuf(spans).SerializeToString()
    _ok_or_4xx(server.post("/v1/traces", content=big, headers=PB))
    over = to_protobuf(request_trace(attributes={"blob": "y" * 400_000})).SerializeToString()
    assert server.post("/v1/traces", content=over, headers=PB).status_code == 413
    bomb = gzip.compress(b"{" * 50_000_000)
    r = server.post("/v1/traces", content=bomb, headers={**JSON_H, "Content-Encoding": "gzip"})
    assert r.status_code == 413
    r = server.post("/v1/traces", content=b"\x1f\x8b garbage", headers={**PB, "Content-Encoding": "gzip"})
    assert r.status_code == 400
    deep = "[" * 100_000 + "]" * 100_000
    _ok_or_4xx(server.post("/v1/traces", content=deep, headers=JSON_H))
    _still_serving(server)
