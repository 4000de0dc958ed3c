"""The four buckets add up to E exactly, whatever the inputs (docs/design.md §2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.buckets import partition

from . import spanfactory as f

ns = st.integers(min_value=-10**10, max_value=10**12)


@settings(deadline=None)  # what is checked is arithmetic: a loaded machine's 200 ms pause is no failure
@given(server=ns, prefill=ns, decode=ns, client=st.none() | ns, wait=ns, tokenize=ns)
def test_partition_adds_up_exactly(server, prefill, decode, client, wait, tokenize) -> None:  # type: ignore[no-untyped-def]
    p = partition(server_ns=server, prefill_ns=prefill, decode_ns=decode, client_ns=client,
                  queue_wait_ns=wait, tokenize_ns=tokenize)
    assert min(p.queue_ns, p.prefill_ns, p.decode_ns, p.queue_wait_ns, p.tokenize_ns, p.other_ns) >= 0
    assert p.network_ns is None or p.network_ns >= 0
    assert p.queue_ns + p.prefill_ns + p.decode_ns + (p.network_ns or 0) == p.e2e_ns
    assert p.queue_wait_ns + p.tokenize_ns + p.other_ns == p.queue_ns
    clamped = prefill < 0 or decode < 0 or prefill + decode > max(server, 0)
    assert (s.FLAG_BUCKET_EXCEEDS_E2E in p.flags) >= clamped
    if client is not None and client < max(server, 0):
        assert s.FLAG_NEGATIVE_NETWORK in p.flags


ms = st.floats(min_value=0.0, max_value=60_000.0, allow_nan=False)
wire = st.none() | st.floats(min_value=0.0, max_value=2_000.0)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["vllm", "sglang", "tgi"]), a=ms, b=ms, c=ms, wire=wire,
       tokens=st.integers(min_value=2, max_value=40))
def test_whole_traces_partition_exactly(kind: str, a: float, b: float, c: float,
                                        wire: float | None, tokens: int) -> None:
    if kind == "vllm":
        spans, _ = f.vllm_trace(a, b, c, tokens=tokens, wire=wire)
    elif kind == "sglang":
        spans, _ = f.sglang_trace(1.0, a, b, c, tokens=tokens, wire=wire)
    else:
        spans, _ = f.tgi_trace(1.0, a, b, c / tokens, tokens, wire=wire)
    (r,) = summarize_trace(spans).requests
    parts = r.queue_ms + r.prefill_ms + r.decode_ms + (r.network_ms or 0.0)
    assert abs(parts - r.e2e_ms) <= 1e-6 * max(1.0, r.e2e_ms)
    assert min(r.queue_ms, r.prefill_ms, r.decode_ms) >= 0
    assert abs(r.queue_wait_ms + r.tokenize_ms + r.other_ms - r.queue_ms) <= 1e-6 * max(1.0, r.queue_ms)
