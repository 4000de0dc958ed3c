"""No request disappears from the percentiles: each convention's traces, mutated the way
real senders differ, still give their requests, summarized soundly (docs/design.md §2, §3).

The collector calls `summarize_trace` once per trace; an adapter that raises makes
its request vanish, or be summarized by a weaker adapter.  Each case below takes a
realistic trace, mutates it with a seeded `random`, and checks: nothing raises or
is logged as an adapter failure, every request the trace had is still there from
the same convention, and every summary keeps the bucket invariants (buckets ≥ 0,
adding up to E; impossible data flagged, never dropped).  A failure names its seed.
"""

from __future__ import annotations

import copy
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tokentrace.analyzer import summary as s
from tokentrace.analyzer.attribution import summarize_trace
from tokentrace.analyzer.spans import KIND_CLIENT, KIND_SERVER, Span, list_attr
from tokentrace.instrumentation import semconv as sc

from . import spanfactory as f

FLAGS = {
    s.FLAG_NEGATIVE_NETWORK, s.FLAG_BUCKET_EXCEEDS_E2E, s.FLAG_SOURCES_DISAGREE,
    s.FLAG_NO_TOKEN_TIMES, s.FLAG_ROOT_MISSING, s.FLAG_SERVER_UNSEEN, s.FLAG_IMPOSSIBLE_COUNT,
    *(v for k, v in vars(s).items() if k.startswith("FLAG_")),
}
INT64_MAX = 2**63 - 1
SEEDS = 12


def _ms(rng: random.Random, lo: float = 0.5, hi: float = 800.0) -> float:
    return round(rng.uniform(lo, hi), 3)


# ---- realistic traces of each convention --------------------------------------------------

Builder = Callable[[random.Random], list[Span]]

BASES: dict[str, Builder] = {
    "vllm": lambda r: f.vllm_trace(_ms(r), _ms(r), _ms(r), tokens=r.randint(2, 60))[0],
    "vllm_client": lambda r: f.vllm_trace(_ms(r), _ms(r), _ms(r), wire=_ms(r, 1, 50))[0],
    "sglang": lambda r: f.sglang_trace(_ms(r, 0.1, 5), _ms(r), _ms(r), _ms(r))[0],
    "sglang_client": lambda r: f.sglang_trace(_ms(r, 0.1, 5), _ms(r), _ms(r), _ms(r), wire=_ms(r, 1, 50))[0],
    "sglang_attrs_only": lambda r: f.sglang_trace(0.0, _ms(r), _ms(r), _ms(r), other=0.0)[0][:1],
    "tgi": lambda r: f.tgi_trace(_ms(r, 0.1, 3), _ms(r), _ms(r), _ms(r, 5, 40), r.randint(2, 12))[0],
    "tgi_client": lambda r: f.tgi_trace(_ms(r, 0.1, 3), _ms(r), _ms(r), _ms(r, 5, 40), 6,
                                        handler="chat_completions", wire=_ms(r, 1, 50))[0],
    "tgi_attrs_only": lambda r: f.tgi_trace(1.0, _ms(r), _ms(r), _ms(r, 5, 40), 8, attrs_only=True)[0],
    "openllmetry": lambda r: f.genai_client_trace(_ms(r, 50), _ms(r, 5, 40), r.randint(2, 12))[0],
    "openinference": lambda r: f.genai_client_trace(_ms(r, 50), 20.0, 5, style="openinference")[0],
    "genai_ttfc": lambda r: f.genai_client_trace(_ms(r, 50), 20.0, 5, style="genai")[0],
    "genai_server": lambda r: f.genai_client_trace(400.0, 20.0, 8, server_ms=_ms(r, 100, 500))[0],
    "sdk": lambda r: f.sdk_trace(_ms(r, 0.1, 5), _ms(r), _ms(r), _ms(r, 5, 40), r.randint(2, 30))[0],
    "sdk_no_offsets": lambda r: f.sdk_trace(1.0, _ms(r), _ms(r), 20.0, 8, offsets=False)[0],
    "sdk_client": lambda r: f.sdk_trace(1.0, _ms(r), _ms(r), 20.0, 8, wire=_ms(r, 1, 50))[0],
}


# ---- the ways real senders differ ---------------------------------------------------------

def _odd_values(v: Any) -> list[Any]:
    out: list[Any] = ["", None, True, False, [v], [], "abc", "0.25", " 0.25 ", "1,5", "-1",
                      "nan", "inf", "1e400", float("nan"), float("inf"), float("-inf"), 2**63 - 1,
                      -(2**63), 2**64, 0, -1, -0.5, b"\x00\xff", {"k": 1}, "<b>ü</b>"]
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        out += [str(v), int(v), float(v), -v, v * 1e12]
    return out


def _pick_attr(spans: list[Span], rng: random.Random) -> tuple[Span, str] | None:
    holders = [x for x in spans if x.attributes]
    if not holders:
        return None
    x = rng.choice(holders)
    return x, rng.choice(sorted(x.attributes))


def drop_attr(spans: list[Span], rng: random.Random) -> list[Span]:
    picked = _pick_attr(spans, rng)
    if picked:
        del picked[0].attributes[picked[1]]
    return spans


def retype_attr(spans: list[Span], rng: random.Random) -> list[Span]:
    picked = _pick_attr(spans, rng)
    if picked:
        x, key = picked
        x.attributes[key] = rng.choice(_odd_values(x.attributes[key]))
    return spans


def every_attr_odd(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in spans:
        for key in list(x.attributes):
            x.attributes[key] = rng.choice(_odd_values(x.attributes[key]))
    return spans


def huge_values(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in spans:
        for key, v in list(x.attributes.items()):
            if isinstance(v, (int, float)) and not isinstance(v, bool) and rng.random() < 0.7:
                x.attributes[key] = rng.choice([2**63 - 1, 1e300, float(2**63)])
    return spans


def time_warp(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in rng.sample(spans, rng.randint(1, len(spans))):
        how = rng.randrange(7)
        if how == 0:  # end before start
            x.start_ns, x.end_ns = x.end_ns, x.start_ns - rng.randint(1, 10**9)
        elif how == 1:  # zero-length
            x.end_ns = x.start_ns
        elif how == 2:  # an unset start (0) or end
            if rng.random() < 0.5:
                x.start_ns = 0
            else:
                x.end_ns = 0
        elif how == 3:
            x.end_ns = INT64_MAX
        elif how == 4:
            x.start_ns = -x.start_ns
        elif how == 5:  # skewed clock: moved by seconds
            d = rng.randint(-5 * 10**9, 5 * 10**9)
            x.start_ns += d
            x.end_ns += d
        else:
            x.end_ns = x.start_ns - 1
    return spans


def duplicate_root(spans: list[Span], rng: random.Random) -> list[Span]:
    roots = [x for x in spans if not x.parent_span_id] or spans
    twin = copy.deepcopy(rng.choice(roots))
    twin.span_id = f.new_id()
    return [*spans, twin]


def orphan(spans: list[Span], rng: random.Random) -> list[Span]:
    children = [x for x in spans if x.parent_span_id]
    if children:
        rng.choice(children).parent_span_id = "deadbeefdeadbeef"
    return spans


def parent_loop(spans: list[Span], rng: random.Random) -> list[Span]:
    """Parent ids that loop: a span its own parent, or a root under its own descendant."""
    x = rng.choice(spans)
    if rng.random() < 0.5 or len(spans) == 1:
        x.parent_span_id = x.span_id
    else:
        root = next((r for r in spans if not r.parent_span_id), spans[0])
        root.parent_span_id = rng.choice([c for c in spans if c is not root]).span_id
    return spans


def odd_list_elements(spans: list[Span], rng: random.Random) -> list[Span]:
    """Token-time lists (packed or plain) with elements that are no times, or out of order."""
    for x in spans:
        for key in (sc.TOKEN_OFFSETS_US, sc.CLIENT_CHUNK_OFFSETS_US):
            values = list_attr(x.attributes, key)
            if values:
                values.insert(rng.randrange(len(values) + 1), rng.choice(["x", None, -5, 1e400, [], 2**70]))
                if rng.random() < 0.5:
                    rng.shuffle(values)
                x.attributes[key] = sc.pack_list(values) if rng.random() < 0.5 else values
        for e in x.events:
            if rng.random() < 0.3:
                e.time_ns = x.start_ns - rng.randint(1, 10**9)  # a chunk before the request began
    return spans


def drop_span(spans: list[Span], rng: random.Random) -> list[Span]:
    """A span lost on the way (not the request's own span: that one is the request)."""
    inner = [x for x in spans[1:] if x.parent_span_id and not _is_request_span(x)
             and x.kind != KIND_CLIENT and x.parent_span_id != x.span_id]
    if inner:
        gone = rng.choice(inner)
        return [x for x in spans if x is not gone]
    return spans


def odd_names(spans: list[Span], rng: random.Random) -> list[Span]:
    weird = ["<script>alert(1)</script>", "ü∂ƒ 日本語 🚀", "", "a" * 5000, "\x00\n\t"]
    for x in spans:
        x.resource = {**x.resource, "service.name": rng.choice(weird)}
        for key in (sc.REQUEST_MODEL, "gen_ai.response.model", "gen_ai.request.id", sc.REQUEST_ID,
                    "tenant.id", sc.TRAFFIC_CLASS):
            if key in x.attributes or rng.random() < 0.2:
                x.attributes[key] = rng.choice(weird)
        if not _is_request_span(x) and x.kind != KIND_SERVER and rng.random() < 0.3 and not x.events:
            # spans that only name a phase keep their names; others may be called anything
            if x.name not in {"queued", "infer", "tokenize", "prefill_waiting", "prefill_forward",
                              "decode_forward", "decode_waiting", "chunked_prefill", "decode_loop",
                              "generate_stream", *_PHASES} and not x.name.startswith(("Tokenizer", "Sched")):
                x.name = rng.choice(weird[:2])
    return spans


_PHASES = {sc.SPAN_TOKENIZE, sc.SPAN_QUEUE, sc.SPAN_PREFILL, sc.SPAN_DECODE}
TGI_DURATIONS = ["1.5ms", "2m3s", "", "abc", "1h2m3.5s", " 12ms ", "12 ms", "-5ms", "1.5e3ms",
                 "NaNs", "infs", "1e400s", "5", 5, 0.25, "3.1s ", "1.5 s", "0ns", "٣ms", "12.3µs",
                 "12.3μs", "1m", "PT1.5S", "1.5sec", None, True, 2**63 - 1, "99999999999999999999h"]
TGI_KEYS = ("total_time", "validation_time", "queue_time", "inference_time", "time_per_token")


def tgi_durations(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in spans:
        for key in TGI_KEYS:
            if key in x.attributes and rng.random() < 0.6:
                x.attributes[key] = rng.choice(TGI_DURATIONS)
    return spans


SGLANG_NAMES = ["Req {rid}", "  Req {rid}", " Req  {rid}", " Req {rid} ", "\tReq {rid}",
                "prefill  Req {rid}", " Req {rid}-ü", " Req ü{rid}", " Req <b>{rid}</b>", " Req ",
                " Req {rid}.retry", "decode Req {rid}", "Req\u00a0{rid}"]


def sglang_names(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in spans:
        if "Req " in x.name and not x.parent_span_id or x.name.strip().startswith("Req"):
            rid = x.name.split()[-1]
            x.name = rng.choice(SGLANG_NAMES).format(rid=rid)
    return spans


VLLM_STRINGS = ["0.25", " 0.25", "0.25 ", "nan", "inf", "-inf", "", "1,5", "0.3s", "1e-3", "-0.1",
                "1e400", "0x10", "None", "null", "12"]


def vllm_strings(spans: list[Span], rng: random.Random) -> list[Span]:
    for x in spans:
        if x.name == "llm_request":
            for key, v in list(x.attributes.items()):
                if rng.random() < 0.5:
                    x.attributes[key] = rng.choice([str(v), rng.choice(VLLM_STRINGS)])
    return spans


def _is_request_span(x: Span) -> bool:
    return x.name in ("llm_request", sc.SPAN_REQUEST, "generate", "generate_stream",
                      "chat_completions", "completions") or "Req " in x.name


MUTATIONS: dict[str, Callable[[list[Span], random.Random], list[Span]]] = {
    "drop_attr": drop_attr,
    "retype_attr": retype_attr,
    "every_attr_odd": every_attr_odd,
    "huge_values": huge_values,
    "time_warp": time_warp,
    "duplicate_root": duplicate_root,
    "orphan": orphan,
    "drop_span": drop_span,
    "parent_loop": parent_loop,
    "odd_list_elements": odd_list_elements,
    "odd_names": odd_names,
    "tgi_durations": tgi_durations,
    "sglang_names": sglang_names,
    "vllm_strings": vllm_strings,
}


# ---- what every summary promises ------------------------------------------------------------

_FLOAT_FIELDS = ("e2e_ms", "server_ms", "queue_ms", "prefill_ms", "decode_ms", "queue_wait_ms",
                 "tokenize_ms", "other_ms")
_OPTIONAL_MS = ("network_ms", "ttft_ms", "ttft_client_ms", "tpot_ms", "itl_p50_ms", "itl_p95_ms",
                "itl_p99_ms", "itl_max_ms")
_STR_FIELDS = ("trace_id", "request_id", "model", "tenant", "traffic_class", "service", "instance",
               "environment", "route", "source")


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def assert_sound(r: s.RequestSummary) -> None:
    """The bucket invariants of docs/buckets.md, and values the `requests` table can hold."""
    where = f"{r.source} {r.request_id!r}: {r}"
    for name in _FLOAT_FIELDS:
        v = getattr(r, name)
        assert _is_number(v) and math.isfinite(v) and v >= 0, (name, v, where)
    for name in _OPTIONAL_MS:
        v = getattr(r, name)
        assert v is None or (_is_number(v) and math.isfinite(v) and v >= 0), (name, v, where)
    parts = r.queue_ms + r.prefill_ms + r.decode_ms + (r.network_ms or 0.0)
    assert abs(parts - r.e2e_ms) <= 1e-9 * max(1.0, r.e2e_ms), where
    assert abs(r.queue_wait_ms + r.tokenize_ms + r.other_ms - r.queue_ms) <= 1e-9 * max(1.0, r.queue_ms), where
    assert abs(r.server_ms + (r.network_ms or 0.0) - r.e2e_ms) <= 1e-9 * max(1.0, r.e2e_ms), where
    for name in ("prompt_tokens", "output_tokens", "stall_count"):
        v = getattr(r, name)
        assert v is None or (type(v) is int and 0 <= v <= s.MAX_TOKEN_COUNT), (name, v, where)
    assert r.gpu_util_mean is None or (_is_number(r.gpu_util_mean) and math.isfinite(r.gpu_util_mean)), where
    assert r.gpu_mem_max_bytes is None or (type(r.gpu_mem_max_bytes) is int
                                           and 0 <= r.gpu_mem_max_bytes <= INT64_MAX), where
    assert type(r.start_ns) is int and -(2**63) <= r.start_ns <= INT64_MAX, where
    for name in _STR_FIELDS:
        assert type(getattr(r, name)) is str, (name, where)
    assert r.request_id, where
    assert type(r.cold_start) is bool and type(r.error) is bool, where
    assert set(r.flags) <= FLAGS and len(set(r.flags)) == len(r.flags), where
    assert all(_is_number(g) and math.isfinite(g) for g in r.itl_gaps_ms), where
    assert tuple(r.as_row()) == s.COLUMNS


def _summaries(spans: list[Span], caplog: pytest.LogCaptureFixture) -> list[s.RequestSummary]:
    caplog.clear()
    with caplog.at_level(logging.ERROR, logger="tokentrace.analyzer"):
        found = summarize_trace(spans).requests
    failed = [rec.getMessage() for rec in caplog.records if rec.levelno >= logging.ERROR]
    assert not failed, failed  # an adapter raised: its request went missing or to a weaker one
    return found


def check_case(base: str, mutate: Callable[[list[Span], random.Random], list[Span]], seed: int,
               caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(f"{base}/{seed}")
    original = BASES[base](rng)
    before = _summaries(copy.deepcopy(original), caplog)
    assert before, base
    mutated = mutate(copy.deepcopy(original), rng)
    after = _summaries(mutated, caplog)
    # each request is still there, from its own convention (a client span the mutation
    # cut loose may add a client-only request beside it: a call of its own)
    kept = Counter(r.source for r in after)
    assert kept & Counter(r.source for r in before) == Counter(r.source for r in before), (
        base, seed, [(r.source, r.request_id) for r in after], [x.name for x in mutated])
    assert set(kept) <= {before[0].source, "genai_client"}, (base, seed)
    for r in after:
        assert_sound(r)


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
@pytest.mark.parametrize("base", sorted(BASES))
def test_mutated_trace_keeps_its_requests(base: str, mutation: str, caplog: pytest.LogCaptureFixture) -> None:
    for seed in range(SEEDS):
        try:
            check_case(base, MUTATIONS[mutation], seed, caplog)
        except AssertionError as exc:
            raise AssertionError(f"{base} × {mutation}, seed {seed}: {exc}") from exc


@pytest.mark.parametrize("base", sorted(BASES))
def test_mixed_mutations(base: str, caplog: pytest.LogCaptureFixture) -> None:
    names = sorted(MUTATIONS)
    for seed in range(40):
        rng = random.Random(f"mix/{base}/{seed}")
        chosen = [MUTATIONS[n] for n in rng.sample(names, rng.randint(2, 4))]

        def mutate(spans: list[Span], r: random.Random, chosen: list = chosen) -> list[Span]:  # type: ignore[type-arg]
            for m in chosen:
                spans = m(spans, r)
            return spans

        try:
            check_case(base, mutate, seed, caplog)
        except AssertionError as exc:
            raise AssertionError(f"{base} mixed, seed {seed}: {exc}") from exc


@pytest.mark.parametrize("base", sorted(BASES))
def test_two_requests_in_one_trace(base: str, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(base)
    first = BASES[base](rng)
    second = BASES[base](rng)
    for x in second:
        x.trace_id = first[0].trace_id
        if "Req " in x.name:  # SGLang's rid8 is random; the factory's ids share a prefix
            x.name = x.name.replace("Req ", "Req z")
    found = _summaries([*first, *second], caplog)
    assert len(found) == 2, [(r.source, r.request_id) for r in found]
    for r in found:
        assert_sound(r)


@pytest.mark.parametrize("served", ["vllm", "sglang", "tgi", "sdk"])
@pytest.mark.parametrize("untraced", ["openllmetry", "openinference", "genai_ttfc"])
def test_agent_trace_with_two_backends(served: str, untraced: str, caplog: pytest.LogCaptureFixture) -> None:
    """An agent's trace calls a backend that traces its side and one that does not: both count."""
    rng = random.Random(served + untraced)
    first = BASES[f"{served}_client"](rng)
    second = BASES[untraced](rng)
    root = f.span(first[0].trace_id, "agent.run", -10.0, 9_000.0, resource={"service.name": "agent"})
    for x in [*first, *second]:
        x.trace_id = root.trace_id
        if not x.parent_span_id:
            x.parent_span_id = root.span_id
    found = _summaries([root, *first, *second], caplog)
    assert sorted(r.source for r in found) == sorted([before.source for before in
                                                      _summaries(first, caplog)] + ["genai_client"])
    for r in found:
        assert_sound(r)
