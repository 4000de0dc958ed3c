"""The scenarios: each a real server configuration and a load shape from the shipped traces.

Loads are sized for a 2-core CPU: token counts are scaled from the trace rows
(the long/short mix survives), arrival times are the trace's own, compressed
to fit the run, unless the complaint is about a shape (a peak, a batch flood)
that the scenario builds on top of the trace rows. `quick` halves the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokentrace.examples.load.workloads import (
    AZURE_CODE,
    AZURE_CONV,
    MOONCAKE_CONVERSATION,
    RequestSpec,
    Scaling,
    load_workload,
    with_bursts,
    with_peak_window,
    with_poisson_arrivals,
)

LoadFn = Callable[[bool], list[RequestSpec]]


@dataclass(frozen=True)
class Deployment:
    """One server process of a scenario and the load sent to it."""

    load: LoadFn
    server: dict[str, Any] = field(default_factory=dict)  # ServerConfig fields
    proxy_delay_ms: float = 1.0  # one-way network delay through examples/netproxy.py
    environment: str | None = None  # deployment.environment.name
    concurrency: int | None = None  # None: open loop at the specs' arrival times
    instances: int = 1  # >1: the load is split over this many fresh processes, one after another


@dataclass(frozen=True)
class Scenario:
    name: str
    complaint: str | None  # the complaint id the diagnosis should put first; None: no finding
    story: str
    deployments: tuple[Deployment, ...]  # run at the same time

    @property
    def service(self) -> str:
        return f"tiny-llm-{self.name}"


def _rows(trace: str, n: int, scaling: Scaling, skip: int = 0) -> list[RequestSpec]:
    """Return `n` trace rows (after `skip`) with scaled token counts and trace arrivals from 0."""
    specs = load_workload(trace, scaling=scaling, limit=skip + n)[skip:]
    if not specs:
        raise ValueError(f"trace {trace} has fewer than {skip + 1} rows")
    t0 = specs[0].arrival_s
    return [dataclasses.replace(s, arrival_s=s.arrival_s - t0) for s in specs]


def _fit(specs: list[RequestSpec], duration_s: float) -> list[RequestSpec]:
    """Compress the trace's own arrival times so the last request arrives at `duration_s`."""
    span = max(s.arrival_s for s in specs) or 1.0
    return [dataclasses.replace(s, arrival_s=s.arrival_s * duration_s / span) for s in specs]


def _size(quick: bool, full: int) -> int:
    return max(32, full // 2) if quick else full


# ---- the loads ----------------------------------------------------------------

SHORT_CHAT = Scaling(prompt_scale=0.05, output_scale=0.2, min_prompt_tokens=16,
                     max_prompt_tokens=128, min_output_tokens=8, max_output_tokens=32)  # fmt: skip


#: healthy chats: short prompts and answers, so a busy CPU's scheduling hiccups (a
#: 50 ms pause in some process) rarely land inside a stream and read as a stall
HEALTHY_CHAT = Scaling(prompt_scale=0.05, output_scale=0.1, min_prompt_tokens=16,
                       max_prompt_tokens=64, min_output_tokens=4, max_output_tokens=12)  # fmt: skip


def healthy_load(quick: bool) -> list[RequestSpec]:
    n = _size(quick, 72)
    return _fit(_rows(AZURE_CONV, n, HEALTHY_CHAT), n / 3.0)


def tiny_prompts_load(quick: bool) -> list[RequestSpec]:
    tiny = Scaling(prompt_scale=0.01, output_scale=0.02, min_prompt_tokens=4,
                   max_prompt_tokens=16, min_output_tokens=2, max_output_tokens=6)  # fmt: skip
    n = _size(quick, 72)
    return _fit(_rows(AZURE_CONV, n, tiny), n / 3.5)


def long_wait_load(quick: bool) -> list[RequestSpec]:
    # Mooncake's long-context conversations (RAG-like): prompts of thousands of tokens.
    rag = Scaling(prompt_scale=0.06, output_scale=0.05, min_prompt_tokens=800,
                  max_prompt_tokens=950, min_output_tokens=8, max_output_tokens=16)  # fmt: skip
    n = _size(quick, 60)
    return _fit(with_poisson_arrivals(_rows(MOONCAKE_CONVERSATION, n, rag), 1.0), n / 1.0)


def stutter_load(quick: bool) -> list[RequestSpec]:
    # Code completions (long context) mixed with chat streams (long answers).
    streams = Scaling(prompt_scale=0.05, output_scale=0.5, min_prompt_tokens=16,
                      max_prompt_tokens=64, min_output_tokens=64, max_output_tokens=96)  # fmt: skip
    code = Scaling(prompt_scale=0.3, output_scale=0.5, min_prompt_tokens=400,
                   max_prompt_tokens=800, min_output_tokens=4, max_output_tokens=8)  # fmt: skip
    # Chat streams are the majority: the typical request is a stream, so its freezes
    # are the complaint.  Half and half put the TTFT median on the edge between the
    # streams' ~15 ms and the completions' ~500 ms, and "the first token is late"
    # (long_wait_then_fast) could outrank the stutter on a slow machine.
    # The finding needs 20 streams (analyzer/diagnosis/stutter.py MIN_STREAMS): a quick run of
    # 32 requests had exactly 20 chat streams and found no stutter in about one run in two
    # (a stream short of the bar, or one frozen stream short of the share); 48 give 30.
    n = 48 if quick else 64
    n_code = n * 3 // 8
    chat = _fit(_rows(AZURE_CONV, n - n_code, streams), n / 5.0)
    completions = _fit(_rows(AZURE_CODE, n_code, code), n / 5.0)
    return sorted(chat + completions, key=lambda s: s.arrival_s)


def peak_load(quick: bool) -> list[RequestSpec]:
    # A flash crowd: arrivals jump from 1.5 to 30 req/s for about two seconds (3x what one
    # sequence at a time serves on a quiet CPU, 6x on a busy one), then nobody comes for
    # a few seconds while the backlog drains, then the calm traffic returns.  Calm
    # traffic uses a fifth of the capacity, so outside the crowd nothing queues.
    # The answers are 64-128 tokens (~0.1 s a request here): at 24-48 a quiet machine served
    # ~25 req/s, the crowd hardly queued, and a clean-clone run found no peak (E2E p50 in the
    # busy slices under 1.5x the rest's).
    n = _size(quick, 112)
    chat = Scaling(prompt_scale=0.05, output_scale=0.3, min_prompt_tokens=16,
                   max_prompt_tokens=96, min_output_tokens=64, max_output_tokens=128)  # fmt: skip
    base, peak, lull_s = 1.5, 30.0, 4.0
    calm = n * 0.2 / base  # a fifth of the requests before the peak
    peak_end = calm + n * 0.5 / peak
    specs = with_peak_window(
        _rows(AZURE_CONV, n, chat), base, peak, peak_start_s=calm, peak_duration_s=peak_end - calm
    )
    return [
        dataclasses.replace(s, arrival_s=s.arrival_s + lull_s) if s.arrival_s >= peak_end else s
        for s in specs
    ]


def tenants_load(quick: bool) -> list[RequestSpec]:
    # bigcorp runs document jobs in bursts; small tenants chat at random times.
    # Two fifths of the requests are bigcorp's, in bursts of 16 (four batches' worth); the
    # small tenants alternate, so each has enough requests (>= 10 in quick mode) to count.
    n = _size(quick, 80)
    duration = n / 5.0
    big = Scaling(prompt_scale=0.3, output_scale=1.0, min_prompt_tokens=200,
                  max_prompt_tokens=500, min_output_tokens=24, max_output_tokens=32)  # fmt: skip
    n_heavy = n * 2 // 5
    bursts = max(1, n_heavy // 16)
    heavy = [
        # the first burst comes after the small tenants' first chats: a server's very
        # first request being a burst of long jobs would read as a cold start
        dataclasses.replace(s, tenant="bigcorp", arrival_s=s.arrival_s + 1.0)
        for s in with_bursts(
            _rows(AZURE_CODE, n_heavy, big), burst_size=16, interval_s=duration / bursts
        )
    ]
    small = ("small-co", "tiny-startup")
    light = [
        dataclasses.replace(s, tenant=small[i % 2])
        for i, s in enumerate(_fit(_rows(AZURE_CONV, n - n_heavy, SHORT_CHAT, skip=200), duration))
    ]
    return sorted(heavy + light, key=lambda s: s.arrival_s)


def batch_mode_load(quick: bool) -> list[RequestSpec]:
    # Live chat all along; a batch job (long generations) submitted through the last 40 %.
    # Last, not in the middle: a slow machine's batch backlog then runs on past the live
    # chat instead of into live requests "without batch jobs" (slices with no batch arrival),
    # so the generations can be long enough for a fast machine too.
    n = _size(quick, 120)
    live_n = n * 3 // 5
    duration = live_n / 3.0
    live = _fit(_rows(AZURE_CONV, live_n, SHORT_CHAT), duration)
    # long generations: a live chat that arrives behind a running batch waits for them.
    # 192-256 tokens ran out in ~0.5 s where a decode step took 1-2 ms: live TTFT gained as
    # little as 40-70 ms, under the 100 ms a wait still feels instant in (no finding);
    # 320-384 gained 0.3-2 s on the same machine.
    gen = Scaling(prompt_scale=0.05, output_scale=1.0, min_prompt_tokens=32,
                  max_prompt_tokens=128, min_output_tokens=320, max_output_tokens=384)  # fmt: skip
    batch_rows = _rows(AZURE_CODE, n - live_n, gen, skip=100)
    start, window = duration * 0.6, duration * 0.4
    batch = [
        dataclasses.replace(
            s, traffic_class="batch", tenant="nightly-jobs", arrival_s=s.arrival_s + start
        )
        for s in with_poisson_arrivals(batch_rows, rate_per_s=len(batch_rows) / window)
        if s.arrival_s <= window
    ]
    return sorted(live + batch, key=lambda s: s.arrival_s)


def staging_load(quick: bool) -> list[RequestSpec]:
    n = _size(quick, 48) // 2 + 8
    return _fit(_rows(AZURE_CONV, n, SHORT_CHAT), n / 4.0)  # production's request mix


def production_load(quick: bool) -> list[RequestSpec]:
    # Steady production traffic at 25 req/s: just over what one sequence at a time serves
    # on a quiet 2-core CPU (~45 ms a request), so its queue builds even on a quiet machine.
    n = _size(quick, 192)
    return _fit(with_poisson_arrivals(_rows(AZURE_CONV, n, SHORT_CHAT), 25.0), n / 25.0)


def cold_start_load(quick: bool) -> list[RequestSpec]:
    # tiny prompts: a warm request's TTFT is little compute, the cold one's is the load
    chat = Scaling(prompt_scale=0.01, output_scale=0.1, min_prompt_tokens=4,
                   max_prompt_tokens=8, min_output_tokens=4, max_output_tokens=6)  # fmt: skip
    n = _size(quick, 72)
    return _fit(_rows(AZURE_CONV, n, chat, skip=400), n / 2.5)


# ---- the scenarios ------------------------------------------------------------

SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        "healthy",
        None,
        "A well-sized server near its users: chunked prefill, room in the batch, modest load.",
        (Deployment(healthy_load, {"max_batch_size": 8, "prefill_chunk_size": 64}),),
    ),
    Scenario(
        "tiny_prompts_slow",
        "tiny_prompts_slow",
        "Users far from the serving region (120 ms each way) send short prompts.",
        (Deployment(tiny_prompts_load, {"max_batch_size": 8}, proxy_delay_ms=120.0),),
    ),
    Scenario(
        "long_wait_then_fast",
        "long_wait_then_fast",
        "RAG prompts of 800-950 tokens, one at a time, on a mid-size model, unchunked, short answers: TTFT is the prefill.",
        (
            Deployment(
                long_wait_load,
                {
                    # a mid-size model (d_model 512, 6 layers): prefill of ~800 tokens is real work
                    "d_model": 512,
                    "n_heads": 8,
                    "n_layers": 6,
                    "d_ff": 2048,
                    "max_batch_size": 4,
                    "max_tokens_per_step": 4096,
                    "prefill_interrupts_decode": False,
                    # one thread: two intra-op threads on a 2-core machine that is busy
                    # elsewhere wait on each other and slow every decode step ~5x
                    "threads": 1,
                },
                # one request at a time (closed loop): however slow the CPU, nothing
                # queues, so the wait before the first token is the prefill itself
                concurrency=1,
            ),
        ),
    ),
    Scenario(
        "stutter",
        "stutter",
        "Long code prompts are prefilled in the same steps as running chat streams (no chunking).",
        (
            Deployment(
                stutter_load,
                {
                    "max_batch_size": 16,
                    "max_tokens_per_step": 2048,
                    "prefill_interrupts_decode": True,
                },
            ),
        ),
    ),
    Scenario(
        "peak_hours",
        "peak_hours",
        "Arrivals jump 20x for about two seconds; the server serves one sequence at a time and queues the rest.",
        (Deployment(peak_load, {"max_batch_size": 1}),),
    ),
    Scenario(
        "big_tenants_slower",
        "big_tenants_slower",
        "One tenant sends bursts of long jobs; the shared queue admits the shortest prompts first.",
        (
            Deployment(
                tenants_load,
                {
                    "max_batch_size": 4,
                    "prefill_chunk_size": 32,
                    "max_tokens_per_step": 64,
                    "shortest_prompt_first": True,
                },
            ),
        ),
    ),
    Scenario(
        "batch_mode_breaks_live",
        "batch_mode_breaks_live",
        "A batch job shares the server with live chat under aggressive batching (batch 16, 50 ms batch delay, a running batch finishes before new requests join).",
        (
            Deployment(
                batch_mode_load,
                {
                    "max_batch_size": 16,
                    # a batch delay longer than the wait behind a running batch would
                    # hide that wait: every request already pays the delay alone
                    "batch_delay_ms": 50.0,
                    "prefill_chunk_size": 16,
                    "max_tokens_per_step": 96,
                    # batch-mode engines fill a batch and run it out before admitting
                    # more: a live chat that arrives behind a batch job's long
                    # generations waits for them (TTFT), then decodes beside them (TPOT)
                    "prefill_interrupts_decode": False,
                },
            ),
        ),
    ),
    Scenario(
        "bad_in_production",
        "bad_in_production",
        "The same build (one sequence at a time) in staging (4 req/s) and production (25 req/s), both steady: the queue shows up in production.",
        (
            Deployment(staging_load, {"max_batch_size": 1}, environment="staging"),
            Deployment(production_load, {"max_batch_size": 1}, environment="production"),
        ),
    ),
    Scenario(
        "cold_start",
        "cold_start",
        "Three fresh instances of a larger model that load their weights and run a profiling pass on the first request, no warm-up.",
        (
            Deployment(
                cold_start_load,
                {
                    # a bigger model: loading its weights is the cold start
                    "d_model": 768,
                    "n_heads": 12,
                    "n_layers": 12,
                    "d_ff": 3072,
                    "threads": 1,  # warm requests stay fast when the other core is busy
                    "max_batch_size": 8,
                    "warmup": False,
                    "lazy_load": True,
                    # the cold start's profiling pass runs one step's most tokens
                    # (examples/tiny_llm/engine.py `_cold_start`): ~1 s here
                    "max_tokens_per_step": 256,
                },
                # two requests at a time (closed loop): however slow the CPU, warm
                # requests do not queue, so the first token's wait once warm stays the
                # compute, not a backlog that would hide the cold start (open loop, a
                # busy machine's warm TTFT grew to a third of the cold one; four at a
                # time, to a quarter)
                concurrency=2,
                instances=3,
            ),
        ),
    ),
)


def get_scenario(name: str) -> Scenario:
    for scenario in SCENARIOS:
        if scenario.name == name:
            return scenario
    raise ValueError(f"unknown scenario {name!r}; known: {[s.name for s in SCENARIOS]}")
