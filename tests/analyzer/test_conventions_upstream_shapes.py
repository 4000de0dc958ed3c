"""Shapes the serving stacks emit that a review reproduced against their sources:
SGLang's tensor-parallel ranks, retracts and aborts, vLLM's parallel sampling, TGI's
several-prompt completions and its default span tree (docs/design.md §2, §3).

Each test cites the upstream code it mirrors, so the next engineer can re-check it.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, STATUS_ERROR, Span, SpanEvent

from . import spanfactory as f

T0 = 1_700_000_000 * 10**9


def _one(spans: list[Span], source: str) -> s.RequestSummary:
    (r,) = summarize_trace(spans).requests
    assert r.source == source
    return r


def _buckets(r: s.RequestSummary) -> tuple[float, ...]:
    return (r.e2e_ms, r.queue_ms, r.queue_wait_ms, r.prefill_ms, r.decode_ms)


# ---------------------------------------------------------------------------- SGLang


def _with_rank(spans: list[Span], rank: int) -> list[Span]:
    """The spans another tensor-parallel rank's scheduler adds: its own thread span
    `Scheduler [TP <rank>] (host:… | pid:…)` (attribute `tp_rank`) with the same slices
    (python/sglang/srt/observability/trace.py `__create_thread_context`, run by every
    rank's scheduler process; PR sgl-project/sglang#9962, "TP>1")."""
    (rank0,) = [x for x in spans if x.name.startswith("Scheduler [TP 0]")]
    subtree, ids = [rank0], {rank0.span_id}
    for x in spans:  # parents come before their children in the factories' lists
        if x.parent_span_id in ids:
            subtree.append(x)
            ids.add(x.span_id)
    new_ids = {x.span_id: f.new_id() for x in subtree}
    added = [
        dataclasses.replace(
            x,
            span_id=new_ids[x.span_id],
            attributes=dict(x.attributes),
            parent_span_id=new_ids.get(x.parent_span_id, x.parent_span_id),
        )
        for x in subtree
    ]
    added[0].name = rank0.name.replace("[TP 0]", f"[TP {rank}]").replace("pid:8", f"pid:{8 + rank}")
    if "tp_rank" in rank0.attributes:
        added[0].attributes["tp_rank"] = rank
    return spans + added


@pytest.mark.parametrize(
    "ranks", [(0, 1), (0, 1, 2, 3), (1, 0), (2, 3)], ids=["tp2", "tp4", "rank1_first", "no_rank0"]
)
@pytest.mark.parametrize("by", ["attribute", "name"])
def test_sglang_tensor_parallel_ranks_count_once(ranks: tuple[int, ...], by: str) -> None:
    """With --tp-size 2 (or more) every rank's scheduler records the whole set of slices:
    summed, prefill read 200 for a truth of 100 and the queue 0 (the review's
    sglang_tp2: prefill 200, queue 0, bucket_exceeds_e2e).  Rank 0's slices count, by its
    `tp_rank` attribute or else the `[TP 0]` in its name; without rank 0's spans, the
    lowest rank's."""
    spans, truth = f.sglang_trace(2.0, 50.0, 100.0, 302.0, other=8.0, tokens=21)
    single = _one(list(spans), "sglang")
    for rank in ranks:
        if rank:
            spans = _with_rank(spans, rank)
    if 0 not in ranks:  # rank 0's thread span and slices were lost
        (rank0,) = [x for x in spans if x.name.startswith("Scheduler [TP 0]")]
        lost = {rank0.span_id}
        for x in spans:
            if x.parent_span_id in lost:
                lost.add(x.span_id)
        spans = [x for x in spans if x.span_id not in lost]
    if ranks[0] != 0:  # the spans arrive in any order
        spans.reverse()
    if by == "name":
        for x in spans:
            x.attributes.pop("tp_rank", None)
    r = _one(spans, "sglang")
    assert _buckets(r) == pytest.approx(_buckets(single))
    assert r.prefill_ms == pytest.approx(truth.prefill) and r.decode_ms == pytest.approx(
        truth.decode
    )
    assert r.queue_wait_ms == pytest.approx(50.0)
    assert s.FLAG_BUCKET_EXCEEDS_E2E not in r.flags
    assert r.tpot_ms == pytest.approx(single.tpot_ms)


def test_sglang_tensor_parallel_ranks_count_once_in_older_releases() -> None:
    """The older releases' `decode_loop` steps directly under each rank's thread span (no
    `decode_forward`): one rank's steps are the decode."""
    spans, truth = f.sglang_trace(2.0, 50.0, 100.0, 300.0, tokens=21, decode_wait=0.0)
    (forward,) = [x for x in spans if x.name == "decode_forward"]
    for x in spans:
        if x.parent_span_id == forward.span_id:
            x.parent_span_id = forward.parent_span_id
    spans = [x for x in spans if x is not forward and x.name != "decode_waiting"]
    spans = _with_rank(spans, 1)
    r = _one(spans, "sglang")
    assert r.decode_ms == pytest.approx(truth.decode)
    assert r.prefill_ms == pytest.approx(truth.prefill)
    assert r.queue_wait_ms == pytest.approx(50.0)


def _retracted() -> list[Span]:
    """A request retracted (preempted) after 5 decode steps, 40 ms back in the queue,
    prefilled again (150 ms), then 5 more steps.  req_time_stats.py: the retract is an
    event (`set_retract_time`), and `set_prefill_finished_time`'s retract branch emits a
    second `prefill_forward` with `trace_slice` while `decode_forward` is still open on
    the slice stack, so the re-prefill is decode_forward's child (trace.py `trace_slice`:
    its parent is the top of the stack)."""
    tid = f.new_id(16)
    tok, disp, proc, wait, prefill, dwait, itl = 2.0, 2.0, 1.0, 10.0, 100.0, 2.0, 15.0
    sched0 = tok + disp
    first = sched0 + proc + wait + prefill  # 115: the first token
    d0 = first + dwait
    retract_at = d0 + 5 * itl
    re0, re1 = retract_at + 40.0, retract_at + 190.0
    last = re1 + 5 * itl  # 457
    e2e = last + 3.0
    rid = "a1b2c3d4" * 4
    root = f.span(
        tid,
        f" Req {rid[:8]}",
        0,
        e2e,
        resource={"service.name": "sglang"},
        attrs={
            "rid": rid,
            "gen_ai.request.id": rid,
            "gen_ai.usage.completion_tokens": 11,
            "gen_ai.response.finish_reasons": '["stop"]',
            "gen_ai.latency.e2e": e2e / 1000,
            "gen_ai.latency.time_to_first_token": (first + 1.0) / 1000,
        },
    )
    th = f.span(
        tid,
        "Tokenizer(host:0a1b2c3d | pid:7)",
        0,
        sched0,
        root,
        attrs={"host_id": "0a1b2c3d", "pid": 7, "thread_label": "Tokenizer"},
    )
    sc = f.span(
        tid,
        "Scheduler [TP 0] (host:0a1b2c3d | pid:8)",
        sched0,
        last - sched0,
        root,
        attrs={"host_id": "0a1b2c3d", "pid": 8, "thread_label": "Scheduler", "tp_rank": 0},
    )
    pf = f.span(tid, "prefill_forward", sched0 + proc + wait, prefill, sc)
    df = f.span(
        tid,
        "decode_forward",
        d0,
        last - d0,
        sc,
        events=[SpanEvent("retract", T0 + round(retract_at * f.MS))],
    )
    spans = [
        root,
        th,
        sc,
        f.span(tid, "tokenize", 0, tok, th),
        f.span(tid, "dispatch", tok, disp, th),
        f.span(tid, "request_process", sched0, proc, sc),
        f.span(tid, "prefill_waiting", sched0 + proc, wait, sc),
        pf,
        f.span(tid, "chunked_prefill", sched0 + proc + wait, prefill, pf),
        f.span(tid, "decode_waiting", first, dwait, sc),
        df,
        f.span(tid, "prefill_forward", re0, re1 - re0, df),
    ]
    spans += [
        f.span(tid, "decode_loop", d0 + k * itl, itl, df, attrs={"decode_ct": k}) for k in range(5)
    ]
    spans += [
        f.span(tid, "decode_loop", re1 + k * itl, itl, df, attrs={"decode_ct": 5 + k})
        for k in range(5)
    ]
    return spans


def test_sglang_retracted_request_prefill_is_the_first_only() -> None:
    """Decode runs first token → last token (docs/design.md §2): the re-prefill after a retract
    lies inside it.  Counted as prefill too it read prefill 250 and queue 0 for a truth of
    100 and 18 (the review's sglang_retract)."""
    r = _one(_retracted(), "sglang")
    assert r.prefill_ms == pytest.approx(100.0)
    assert r.decode_ms == pytest.approx(342.0)
    assert r.queue_ms == pytest.approx(18.0) and r.queue_wait_ms == pytest.approx(10.0)
    assert s.FLAG_BUCKET_EXCEEDS_E2E not in r.flags
    # without the TTFT attribute the end of the first prefill stands in, not the re-prefill's
    spans = _retracted()
    del spans[0].attributes["gen_ai.latency.time_to_first_token"]
    assert _one(spans, "sglang").ttft_ms == pytest.approx(115.0)


def _aborted(status: bool, finish: str) -> list[Span]:
    """A request refused while queued (Scheduler._abort_on_queued_limit):
    `trace_ctx.abort(abort_info=…)` (trace.py `TraceReqContext.abort`) sets Status(ERROR)
    and the abort's `type` / `status_code` / `message` on the scheduler's *thread* span;
    the root gets no status, only the finish reason `["abort"]` (the tokenizer manager's
    span attributes: `json.dumps([finish_reason["type"]])`)."""
    tid = f.new_id(16)
    rid = "ab0r7ed0" * 4
    root = f.span(
        tid,
        f" Req {rid[:8]}",
        0,
        12.0,
        resource={"service.name": "sglang"},
        attrs={
            "rid": rid,
            "gen_ai.request.id": rid,
            "gen_ai.usage.completion_tokens": 0,
            "gen_ai.usage.prompt_tokens": 200,
            "gen_ai.latency.e2e": 0.012,
            "gen_ai.response.finish_reasons": json.dumps([finish]),
        },
    )
    th = f.span(
        tid, "Tokenizer(host:0a1b2c3d | pid:7)", 0, 4.0, root, attrs={"thread_label": "Tokenizer"}
    )
    sc = f.span(
        tid,
        "Scheduler [TP 0] (host:0a1b2c3d | pid:8)",
        4.0,
        2.0,
        root,
        attrs={"thread_label": "Scheduler", "tp_rank": 0},
    )
    if status:
        sc.status_code = STATUS_ERROR
        sc.attributes.update(
            {"type": "abort", "status_code": 503, "message": "The request queue is full."}
        )
    return [
        root,
        th,
        sc,
        f.span(tid, "tokenize", 0, 2.0, th),
        f.span(tid, "dispatch", 2.0, 2.0, th),
        f.span(tid, "request_process", 4.0, 1.0, sc),
    ]


@pytest.mark.parametrize(
    ("status", "finish", "error"),
    [(True, "abort", True), (False, "abort", True), (True, "stop", True), (False, "stop", False)],
    ids=["both", "finish_reason_only", "status_only", "served"],
)
def test_sglang_abort_is_an_error(status: bool, finish: str, error: bool) -> None:
    """An ERROR status on any span of the request (the thread span's) or a finish reason
    `abort` makes it an error, as an ERROR status on its own spans does for every
    convention (the review's sglang_abort: error false)."""
    r = _one(_aborted(status, finish), "sglang")
    assert r.error is error
    assert r.ttft_ms is None and r.output_tokens == 0


@pytest.mark.parametrize("key", ["reason", "abort_info"])  # today's / older releases
def test_sglang_span_auto_closed_by_its_context_is_no_error(key: str) -> None:
    """`TraceReqContext.__del__` aborts a context collected with a span still open, with
    reason "have unclosed span, auto closed": tracing's bookkeeping, not a failed request."""
    spans = _aborted(False, "stop")
    scheduler = spans[2]
    scheduler.status_code = STATUS_ERROR
    scheduler.attributes[key] = "have unclosed span, auto closed"
    assert _one(spans, "sglang").error is False


# ------------------------------------------------------------------------------ vLLM


def _vllm_sample(
    tid: str,
    parent: Span | None,
    queue: float,
    prefill: float,
    decode: float,
    tokens: int,
    *,
    ttft: bool = True,
) -> Span:
    """One sample's `llm_request` span (vllm/v1/engine/output_processor.py `do_tracing`),
    3 ms before the queue (the frontend) and 0.8 ms of output processing after decode."""
    e2e = 3.0 + queue + prefill + decode + 0.8
    attrs = {
        "gen_ai.latency.e2e": e2e / 1000,
        "gen_ai.latency.time_in_queue": queue / 1000,
        "gen_ai.latency.time_in_model_prefill": prefill / 1000,
        "gen_ai.latency.time_in_model_decode": decode / 1000,
        "gen_ai.latency.time_in_model_inference": (prefill + decode) / 1000,
        "gen_ai.usage.prompt_tokens": 120,
        "gen_ai.usage.completion_tokens": tokens,
        "gen_ai.request.id": "cmpl-review-vllm-n2",
        "gen_ai.request.n": 1,  # the child's
        "gen_ai.response.finish_reasons": '["stop"]',
    }
    if ttft:
        attrs["gen_ai.latency.time_to_first_token"] = (3.0 + queue + prefill) / 1000
    return f.span(
        tid,
        "llm_request",
        0,
        e2e,
        parent,
        kind=KIND_SERVER,
        attrs=attrs,
        resource=dict(f.VLLM_RESOURCE),
    )


def _vllm_n2(client: bool = True, ttft: bool = True) -> list[Span]:
    """n=2 parallel sampling: the V1 engine runs one child request per sample
    (vllm/v1/engine/async_llm.py `add_request`: a copy of the request each, child sampling
    params with n=1, vllm/v1/engine/parallel_sampling.py), each finishing with its own
    `do_tracing`: two `llm_request` spans in one trace, from the one arrival, with the
    request's one `gen_ai.request.id` (`external_req_id`)."""
    tid = f.new_id(32)
    c = None
    if client:
        c = f.span(
            tid,
            "chat m",
            -5.0,
            805.0,
            kind=KIND_CLIENT,
            resource={"service.name": "app"},
            attrs={"gen_ai.operation.name": "chat", "gen_ai.request.model": "m"},
        )
    s1 = _vllm_sample(tid, c, 40.0, 120.0, 600.0, 31)
    s2 = _vllm_sample(tid, c, 40.0, 121.0, 560.0, 29, ttft=ttft)
    return [s2, s1] + ([c] if c is not None else [])


@pytest.mark.parametrize("client", [True, False])
def test_vllm_parallel_samples_are_one_request(client: bool) -> None:
    """One row per request (trace, request id: the store's rows, the explorer's look-ups):
    the server's time is the samples' together (the longest, 763.8 ms), the tokens their
    sum, and the network is measured against that (the review's vllm_n2: two rows of one
    id, network 41.2 and 80.2 for a truth of 41.2)."""
    spans = _vllm_n2(client)
    requests = summarize_trace(spans).requests
    assert len({(r.trace_id, r.request_id) for r in requests}) == len(requests) == 1
    r = requests[0]
    assert r.request_id == "cmpl-review-vllm-n2"
    assert r.server_ms == pytest.approx(763.8)
    assert r.e2e_ms == pytest.approx(805.0 if client else 763.8)
    assert r.network_ms == (pytest.approx(805.0 - 763.8) if client else None)
    assert (r.prefill_ms, r.decode_ms, r.queue_wait_ms) == (
        pytest.approx(120.0),
        pytest.approx(600.0),
        pytest.approx(40.0),
    )
    # TTFT (server) is queue + prefill, 763.8 − 600: the samples' own figures (163.0) are
    # vLLM's front end's clock, which also holds the 0.8 ms after the last token
    assert r.ttft_ms == pytest.approx(163.8)
    assert r.output_tokens == 60 and r.prompt_tokens == 120
    # each stream's time per token: the decode holds the longest sample's 31 tokens
    assert r.tpot_ms == pytest.approx(20.0)
    assert s.FLAG_SOURCES_DISAGREE not in r.flags


def test_vllm_parallel_samples_without_a_ttft_take_the_last_to_end() -> None:
    """Without a sample's TTFT its place on the request's time line is unknown: the
    sample that ended last stands for the phases."""
    r = _one(_vllm_n2(client=False, ttft=False), "vllm")
    assert r.server_ms == pytest.approx(763.8)
    assert (r.prefill_ms, r.decode_ms) == (pytest.approx(120.0), pytest.approx(600.0))
    assert r.output_tokens == 60


def test_vllm_requests_of_their_own_stay_apart() -> None:
    """Two requests in one trace (an agent's two calls) keep their rows: two calls that
    share an id (the client's `X-Request-Id`) arrive apart, and a span without an id is
    a request of its own."""
    a, _ = f.vllm_trace(10.0, 50.0, 200.0)
    b, _ = f.vllm_trace(20.0, 60.0, 300.0, t0_ns=T0 + 500 * f.MS)
    for x in b:
        x.trace_id = a[0].trace_id
    b[0].attributes["gen_ai.request.id"] = a[0].attributes["gen_ai.request.id"]
    requests = summarize_trace(a + b).requests
    assert sorted(r.server_ms for r in requests) == [pytest.approx(260.0), pytest.approx(380.0)]
    del b[0].attributes["gen_ai.request.id"]
    requests = summarize_trace(a + b).requests
    assert sorted(r.server_ms for r in requests) == [pytest.approx(260.0), pytest.approx(380.0)]


# ------------------------------------------------------------------------------- TGI


def _completions_two_prompts() -> list[Span]:
    """/v1/completions with `prompt: [a, b]` (router/src/server.rs `completions`): one
    generation per prompt, each given a clone of the handler's span, so two
    `async_stream` subtrees hang under the one handler, and both `span.record` the
    timing fields on it: the last one (prompt b's) wins."""
    tid = f.new_id(32)
    h_end = 420.0
    h = f.span(
        tid, "completions", 0, h_end, resource={"service.name": "text-generation-inference.router"}
    )
    spans = [h]
    for queue, prefill, itl, tokens in ((10.0, 100.0, 20.0, 12), (40.0, 150.0, 20.0, 8)):
        a = f.span(tid, "async_stream", 1, h_end - 2, h)
        g = f.span(tid, "generate_stream", 1, h_end - 2, a)
        sch = f.span(tid, "schedule", 3, h_end - 5, g)
        spans += [a, g, f.span(tid, "validate", 1, 2, g), sch, f.span(tid, "queued", 3, queue, sch)]
        at = prev = 3 + queue
        for k in range(tokens):
            e = at + prefill + k * itl
            spans.append(f.span(tid, "infer", prev, e - prev, sch))
            prev = e
        inference = prefill + (tokens - 1) * itl
        h.attributes = {
            "total_time": f.rust(3 + queue + inference),
            "validation_time": f.rust(2.0),
            "queue_time": f.rust(queue),
            "inference_time": f.rust(inference),
            "time_per_token": f.rust(inference / tokens),
            "seed": "None",
        }
    return spans


def test_tgi_completions_with_several_prompts_is_one_request_of_their_streams() -> None:
    """The prompts run side by side: the queue wait is the call's wait before its first
    prompt was scheduled (10: prompt b's 40 lie inside prompt a's prefill, and TTFT is
    the queue then prefill), the tokens all the prompts' infer steps (20, not prompt b's
    fields' 8), the TPOT and ITL each stream's (20 ms) (the review's
    tgi_completions_two_prompts; one rule with vLLM's prompts, docs/conventions.md)."""
    r = _one(_completions_two_prompts(), "tgi")
    assert r.queue_wait_ms == pytest.approx(10.0)
    assert r.output_tokens == 20
    assert r.ttft_ms == pytest.approx(113.0)
    assert r.prefill_ms == pytest.approx(100.0) and r.decode_ms == pytest.approx(220.0)
    assert r.tpot_ms == pytest.approx(20.0)
    assert (r.itl_p50_ms, r.itl_max_ms, r.stall_count) == (
        pytest.approx(20.0),
        pytest.approx(20.0),
        0,
    )
    assert len(r.itl_gaps_ms) == 11 + 7
    assert r.tokenize_ms == pytest.approx(2.0)


@pytest.mark.parametrize("caller", [False, True], ids=["root", "under_client"])
def test_tgi_default_shape_without_the_axum_server_span(caller: bool) -> None:
    """TGI's default: axum's OpenTelemetry layer makes its `POST /…` span at TRACE level
    (tracing-opentelemetry-instrumentation-sdk), which the router's `info` filter drops:
    the handler is the trace's root, or, since TGI PR #2648, the child of the caller's
    span whose traceparent came in.  The handler then times the server side."""
    spans, truth = f.tgi_trace(3.0, 80.0, 110.0, 20.0, 12, wire=8.0 if caller else None)
    (http,) = [x for x in spans if x.kind == KIND_SERVER]
    handler = spans[0]
    handler.parent_span_id = http.parent_span_id
    spans = [x for x in spans if x is not http]
    r = _one(spans, "tgi")
    assert r.server_ms == pytest.approx(handler.duration_ns / f.MS)
    assert r.queue_wait_ms == pytest.approx(80.0) and r.tokenize_ms == pytest.approx(3.0)
    assert (r.prefill_ms, r.decode_ms) == (
        pytest.approx(truth.prefill),
        pytest.approx(truth.decode),
    )
    assert r.ttft_ms == pytest.approx(193.0) and r.output_tokens == 12
    if caller:
        (client,) = [x for x in spans if x.kind == KIND_CLIENT]
        assert r.e2e_ms == pytest.approx(client.duration_ns / f.MS)
        assert r.network_ms == pytest.approx((client.duration_ns - handler.duration_ns) / f.MS)
    else:
        assert r.network_ms is None and r.e2e_ms == pytest.approx(r.server_ms)
    assert s.FLAG_ROOT_MISSING not in r.flags
