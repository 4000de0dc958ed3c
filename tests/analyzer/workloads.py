"""Generated workloads, one per complaint, with realistic (noisy) distributions.

A small discrete-event model of an inference server: Poisson arrivals at a rate
that may change over time, `slots` requests served at once, lognormal prompt
and output sizes, compute time from per-token costs with jitter, and the queue
wait that falls out of the arrivals.  Each scenario bends one thing (load at
peak minutes, prompt size, network, tenants, batch traffic, stalls, cold
instances, GPU) and leaves the rest ordinary, so the detectors are tested on
the shape of the problem, not on hand-placed numbers.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokentrace.analyzer.buckets import NS_PER_MS, partition
from tokentrace.analyzer.engine_steps import EngineStep
from tokentrace.analyzer.itl import apply_token_times, apply_tpot
from tokentrace.analyzer.summary import RequestSummary

T0_NS = 1_750_000_000 * 10**9
S = 10**9


@dataclass
class Req:
    arrival_ns: int
    prompt: int
    output: int
    tenant: str = "t0"
    traffic_class: str = "interactive"
    environment: str = ""
    instance: str = "i0"
    cold: bool = False
    network_ms: float | None = None
    tokenize_ms: float = 1.0
    queue_ms: float = 0.0
    prefill_ms: float = 0.0
    gaps_ms: list[float] = field(default_factory=list)

    @property
    def decode_ms(self) -> float:
        return sum(self.gaps_ms)


@dataclass
class Server:
    slots: int = 8
    prefill_ms_per_token: float = 0.08
    prefill_base_ms: float = 15.0
    tpot_ms: float = 20.0
    jitter: float = 0.15


@dataclass
class Workload:
    requests: list[RequestSummary]
    engine_steps: list[EngineStep] = field(default_factory=list)
    gpu_samples: list[dict[str, Any]] = field(default_factory=list)
    raw: list[Req] = field(default_factory=list)


def arrivals(rng: random.Random, seconds: float, rate: Callable[[float], float]) -> list[int]:
    """Poisson arrivals (ns) over `seconds` with a time-varying rate (thinning)."""
    peak = max(rate(t / 10) for t in range(int(seconds * 10) + 1))
    out, t = [], 0.0
    while True:
        t += rng.expovariate(peak)
        if t >= seconds:
            return out
        if rng.random() < rate(t) / peak:
            out.append(T0_NS + int(t * S))


def lognormal(rng: random.Random, median: float, sigma: float, lo: int = 1, hi: int = 32_000) -> int:
    return max(lo, min(hi, round(rng.lognormvariate(0, sigma) * median)))


def serve(rng: random.Random, reqs: list[Req], server: Server,
          slots_of: Callable[[Req], str] = lambda r: r.instance) -> None:
    """Fills each request's queue wait, prefill and token gaps (FIFO over `slots` per pool)."""
    pools: dict[str, list[int]] = {}
    for r in sorted(reqs, key=lambda r: r.arrival_ns):
        j = lambda: rng.uniform(1 - server.jitter, 1 + server.jitter)  # noqa: E731
        r.prefill_ms = (server.prefill_base_ms + server.prefill_ms_per_token * r.prompt) * j()
        if not r.gaps_ms:
            r.gaps_ms = [server.tpot_ms * j() for _ in range(r.output - 1)]
        busy = pools.setdefault(slots_of(r), [0] * server.slots)
        free_at = heapq.heappop(busy)
        start = max(free_at, r.arrival_ns + int(r.tokenize_ms * NS_PER_MS))
        r.queue_ms += (start - r.arrival_ns) / NS_PER_MS - r.tokenize_ms
        end = start + int((r.prefill_ms + r.decode_ms) * NS_PER_MS)
        heapq.heappush(busy, end)


def summarize(rng: random.Random, reqs: list[Req], keep_fraction: float = 0.05) -> list[RequestSummary]:
    """Turns served requests into request summaries, as the collector would write them."""
    out = []
    for i, r in enumerate(reqs):
        server_ns = round((r.tokenize_ms + r.queue_ms + r.prefill_ms + r.decode_ms) * NS_PER_MS)
        client_ns = None if r.network_ms is None else server_ns + round(r.network_ms * NS_PER_MS)
        part = partition(
            server_ns=server_ns, client_ns=client_ns,
            prefill_ns=round(r.prefill_ms * NS_PER_MS), decode_ns=round(r.decode_ms * NS_PER_MS),
            queue_wait_ns=round(r.queue_ms * NS_PER_MS), tokenize_ns=round(r.tokenize_ms * NS_PER_MS),
        )
        s = RequestSummary(
            trace_id=f"{rng.getrandbits(128):032x}", request_id=f"req-{i}",
            start_ns=r.arrival_ns, e2e_ms=0, queue_ms=0, prefill_ms=0, decode_ms=0,
            prompt_tokens=r.prompt, output_tokens=r.output, model="tiny", tenant=r.tenant,
            traffic_class=r.traffic_class, service="llm", instance=r.instance,
            environment=r.environment, cold_start=r.cold, source="tokentrace",
        )
        part.apply(s)
        s.ttft_ms = r.tokenize_ms + r.queue_ms + r.prefill_ms
        if r.network_ms is not None:
            s.ttft_client_ms = s.ttft_ms + r.network_ms
        offsets = [s.ttft_ms]
        for g in r.gaps_ms:
            offsets.append(offsets[-1] + g)
        apply_token_times(s, offsets)
        apply_tpot(s)
        s.kept = rng.random() < keep_fraction
        s.sample_reason = "baseline" if s.kept else "dropped"
        out.append(s)
    # the tail sampler keeps the slowest percent whole
    for s in sorted(out, key=lambda s: s.e2e_ms)[-max(1, len(out) // 100):]:
        s.kept, s.sample_reason = True, "p99_e2e"
    return out


def _base(rng: random.Random, seconds: float, rate: Callable[[float], float], **kw: Any) -> list[Req]:
    return [
        Req(a, lognormal(rng, kw.get("prompt", 400), 0.8), lognormal(rng, kw.get("output", 120), 0.6, lo=4, hi=2000),
            network_ms=kw.get("network", rng.uniform(8, 30)))
        for a in arrivals(rng, seconds, rate)
    ]


def healthy(seed: int = 1) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 2.0)
    for r in reqs:
        r.tenant = rng.choice(["acme", "globex", "initech", "umbrella"])
        r.network_ms = rng.uniform(8, 30)
    serve(rng, reqs, Server(slots=16))
    return Workload(summarize(rng, reqs), raw=reqs)


def peak_hours(seed: int = 2) -> Workload:
    rng = random.Random(seed)
    # 20 minutes; two busy stretches at 4x the usual arrival rate
    rate = lambda t: 8.0 if (300 <= t < 360 or 900 <= t < 960) else 1.6  # noqa: E731
    reqs = _base(rng, 1200, rate)
    serve(rng, reqs, Server(slots=16))
    return Workload(summarize(rng, reqs), raw=reqs)


def bad_in_production(seed: int = 3) -> Workload:
    rng = random.Random(seed)
    staging = _base(rng, 600, lambda t: 0.5)
    prod = _base(rng, 600, lambda t: 2.5)
    for r in staging:
        r.environment, r.instance = "staging", "s0"
    for r in prod:
        r.environment, r.instance = "production", "p0"
    serve(rng, staging + prod, Server(slots=8))
    return Workload(summarize(rng, staging + prod), raw=staging + prod)


def tiny_prompts_slow(seed: int = 4) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.5, prompt=60, output=12)
    for r in reqs:
        r.network_ms = rng.gauss(260, 40)  # a cross-region hop, both ways
        r.tokenize_ms = rng.uniform(20, 60)  # a slow gateway
    serve(rng, reqs, Server(slots=16, tpot_ms=8.0))
    return Workload(summarize(rng, reqs), raw=reqs)


def long_wait_then_fast(seed: int = 5) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 0.4, prompt=5000, output=150)
    serve(rng, reqs, Server(slots=8, prefill_ms_per_token=0.4, tpot_ms=18.0))
    return Workload(summarize(rng, reqs), raw=reqs)


def stutter(seed: int = 6) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.5, output=150)
    serve(rng, reqs, Server(slots=16))
    steps: list[EngineStep] = []
    # large prefills arrive now and then and freeze the decodes running beside them
    big = sorted(T0_NS + int(rng.uniform(0, 600) * S) for _ in range(60))
    for b in big:
        steps.append(EngineStep("llm", "i0", b, 900_000, 6000, 12, 13, 2, 0.5, None, []))
    for t in range(0, 600, 2):
        steps.append(EngineStep("llm", "i0", T0_NS + t * S, 20_000, rng.choice([0, 0, 120, 300]), 12, 12, 1, 0.4, None, []))
    for r in reqs:
        d0 = r.arrival_ns + int((r.tokenize_ms + r.queue_ms + r.prefill_ms) * NS_PER_MS)
        t = d0
        for i, g in enumerate(r.gaps_ms):
            hit = [b for b in big if t <= b < t + int(g * NS_PER_MS) + 900 * 10**6]
            if hit:
                r.gaps_ms[i] = g + 900.0 * rng.uniform(0.8, 1.2)
            t += int(r.gaps_ms[i] * NS_PER_MS)
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def big_tenants_slower(seed: int = 7) -> Workload:
    rng = random.Random(seed)
    light = _base(rng, 600, lambda t: 1.2, prompt=200, output=60)
    for r in light:
        r.tenant = rng.choice(["smallco", "tinyinc", "solo", "duo", "mini"])
    heavy = _base(rng, 600, lambda t: 1.1, prompt=2500, output=400)
    for r in heavy:
        r.tenant = "megacorp"
    # one shared engine, but the heavy tenants' own request pile-up sits in their per-key queue
    serve(rng, light + heavy, Server(slots=6, prefill_ms_per_token=0.05, tpot_ms=10.0),
          slots_of=lambda r: "heavy" if r.tenant == "megacorp" else "light")
    reqs = light + heavy
    steps = []
    ids = {id(r): f"req-{i}" for i, r in enumerate(reqs)}
    by_time = sorted(reqs, key=lambda r: r.arrival_ns)
    for i in range(0, len(by_time) - 4, 3):
        group = by_time[i:i + 4]
        steps.append(EngineStep("llm", "i0", group[0].arrival_ns, 30_000, 200, 3, 4, 2, 0.5, None,
                                [ids[id(r)] for r in group]))
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def batch_mode_breaks_live(seed: int = 8) -> Workload:
    rng = random.Random(seed)
    live = _base(rng, 1200, lambda t: 1.5)
    batch_on = lambda t: (t // 120) % 2 == 1  # noqa: E731 - batch jobs run every other 2 minutes
    batch = _base(rng, 1200, lambda t: 6.0 if batch_on(t) else 0.0, prompt=800, output=300)
    for r in batch:
        r.traffic_class, r.tenant = "batch", "nightly-eval"
    for r in live:
        r.tenant = rng.choice(["acme", "globex"])
        if batch_on((r.arrival_ns - T0_NS) / S):
            # the batch-assembly wait and big decode batches stretch live requests by design
            r.queue_ms += rng.uniform(300, 900)
            r.gaps_ms = [rng.uniform(50, 70) for _ in range(r.output - 1)]
    serve(rng, live, Server(slots=16))
    serve(rng, batch, Server(slots=64))
    return Workload(summarize(rng, live + batch), raw=live + batch)


def cold_start(seed: int = 9) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.0)
    for r in reqs:
        r.instance = rng.choice(["pod-a", "pod-b", "pod-c"])
    seen: set[str] = set()
    for r in sorted(reqs, key=lambda r: r.arrival_ns):
        if r.instance not in seen:
            seen.add(r.instance)
            r.cold, r.queue_ms = True, rng.uniform(4000, 9000)  # weights load, CUDA graphs capture
    serve(rng, reqs, Server(slots=16))
    return Workload(summarize(rng, reqs), raw=reqs)


def _gpu(reqs: list[Req], util: Callable[[float], float], mem: Callable[[float], float]) -> list[dict[str, Any]]:
    end = max(r.arrival_ns for r in reqs)
    out = []
    t = T0_NS
    while t < end:
        s = (t - T0_NS) / S
        out.append({"service": "llm", "instance": "i0", "gpu_index": 0, "ts_ns": t,
                    "utilization_pct": util(s), "memory_used_bytes": int(mem(s) * 80e9),
                    "memory_total_bytes": 80_000_000_000, "sm_clock_mhz": 1980.0, "power_w": 690.0})
        t += S
    return out


def gpu_saturation(seed: int = 10) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 2.1)
    # a slow (saturated) GPU: every token costs more, and the steady queue follows
    serve(rng, reqs, Server(slots=10, tpot_ms=30.0, prefill_ms_per_token=0.3))
    gpu = _gpu(reqs, lambda s: min(100.0, rng.gauss(99, 1)), lambda s: 0.6)
    return Workload(summarize(rng, reqs), gpu_samples=gpu, raw=reqs)


def kv_cache_pressure(seed: int = 11, other_replica: bool = False) -> Workload:
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 2.0, prompt=1500, output=300)
    serve(rng, reqs, Server(slots=16, prefill_ms_per_token=0.02, tpot_ms=8.0))
    if other_replica:  # every third request went to replica i1, whose engine reported no steps
        for r in reqs[::3]:
            r.instance = "i1"
    steps = [
        EngineStep("llm", "i0", T0_NS + t * S // 2, 25_000, 0, 14, 14, 6 if t % 3 else 0,
                   min(1.0, rng.gauss(0.95, 0.03)) if t % 3 else rng.uniform(0.5, 0.8), None, [])
        for t in range(1200)
    ]
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


SCENARIOS: dict[str, Callable[[], Workload]] = {
    "peak_hours": peak_hours,
    "bad_in_production": bad_in_production,
    "tiny_prompts_slow": tiny_prompts_slow,
    "long_wait_then_fast": long_wait_then_fast,
    "stutter": stutter,
    "big_tenants_slower": big_tenants_slower,
    "batch_mode_breaks_live": batch_mode_breaks_live,
    "cold_start": cold_start,
    "gpu_saturation": gpu_saturation,
    "kv_cache_pressure": kv_cache_pressure,
}


# ---- workloads that must NOT give a complaint (or not as the top finding) --------------


def cpu_contention(seed: int = 12) -> Workload:
    """A healthy server on a busy CPU: a fifth of streams get one gap a few times the typical
    one, at random moments; the engine's steps show prefills of every size, none behind them."""
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 2.0, output=120)
    for r in reqs:
        r.tenant = rng.choice(["acme", "globex", "initech", "umbrella"])
    serve(rng, reqs, Server(slots=16))
    for r in reqs:
        if rng.random() < 0.2 and len(r.gaps_ms) > 2:
            # the OS took the core away for a moment: 5-8x the 20 ms step, never a long freeze
            r.gaps_ms[rng.randrange(len(r.gaps_ms))] = rng.uniform(100, 160)
    steps = [
        EngineStep("llm", "i0", T0_NS + t * S // 2, 20_000, rng.choice([0, 0, 120, 300, 600]), 12, 12, 1, 0.4, None, [])
        for t in range(1200)
    ]
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def two_services(seed: int = 13) -> Workload:
    """Two services in one database: `solo`, one healthy instance whose first request (marked
    cold by the SDK, as every process's first is) took a few hundred ms; `fleet`, three pods
    that each loaded weights on their first request."""
    rng = random.Random(seed)
    solo = _base(rng, 600, lambda t: 2.0, output=40)
    for r in solo:
        r.instance = "solo-0"
    first = min(solo, key=lambda r: r.arrival_ns)
    first.cold, first.queue_ms = True, 260.0  # a first forward pass: about 5x a warm TTFT
    serve(rng, solo, Server(slots=16))
    summaries = summarize(rng, solo)
    for s in summaries:
        s.service = "solo"
    fleet = cold_start(seed)
    for s in fleet.requests:
        s.service = "fleet"
    return Workload(summaries + fleet.requests, raw=solo + fleet.raw)


def batch_slows_decode(seed: int = 14) -> Workload:
    """Batch jobs share the decode batches of live chats: live TPOT triples while they run, and
    live TTFT is, if anything, a little lower (the live chats then have shorter prompts)."""
    rng = random.Random(seed)
    live = _base(rng, 1200, lambda t: 1.5)
    batch_on = lambda t: (t // 120) % 2 == 1  # noqa: E731
    batch = _base(rng, 1200, lambda t: 6.0 if batch_on(t) else 0.0, prompt=800, output=300)
    for r in batch:
        r.traffic_class, r.tenant = "batch", "nightly-eval"
    for r in live:
        r.tenant = rng.choice(["acme", "globex"])
        if batch_on((r.arrival_ns - T0_NS) / S):
            r.prompt = max(1, r.prompt // 3)
            r.gaps_ms = [rng.uniform(50, 70) for _ in range(r.output - 1)]
    serve(rng, live, Server(slots=16))
    serve(rng, batch, Server(slots=64))
    return Workload(summarize(rng, live + batch), raw=live + batch)


def steady_overload(seed: int = 15) -> Workload:
    """One sequence at a time near its capacity, users nearby: every prompt size waits seconds
    in the same queue.  Tiny prompts are slow, but because of the load, not their size."""
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 3.0, output=12)
    serve(rng, reqs, Server(slots=1))
    return Workload(summarize(rng, reqs), raw=reqs)


def slow_gateway(seed: int = 16) -> Workload:
    """Users nearby, no scheduler wait, but a gateway that spends 250-400 ms on every request
    (auth, moderation, a hop to another region): tiny prompts are slow for a reason worth fixing."""
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.5, prompt=60, output=12)
    for r in reqs:
        r.tokenize_ms = rng.uniform(250, 400)
    serve(rng, reqs, Server(slots=16, tpot_ms=8.0))
    return Workload(summarize(rng, reqs), raw=reqs)


def tiny_prompts_mixed_overhead(seed: int = 19) -> Workload:
    """Tiny prompts slow for two reasons at once: some users are far away (300 ms of network),
    others pass a slow gateway (500 ms before the scheduler); the rest of them are fast.

    Per-bucket medians of the tiny prompts hide both (most tiny requests have little network
    and little queue) while their median network + queue is large: the shape that made the
    evidence say "median network 11 ms, median queue 5 ms" under "median 246 ms" of overhead.
    """
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.5, prompt=200, output=12)
    tiny = sorted(reqs, key=lambda r: r.prompt)[: len(reqs) // 4]
    for i, r in enumerate(tiny):
        if i % 20 < 9:
            r.network_ms = rng.gauss(300, 30)  # 45 %: far away
        elif i % 20 < 16:
            r.tokenize_ms = rng.uniform(450, 550)  # 35 %: a slow gateway
    serve(rng, reqs, Server(slots=16, tpot_ms=8.0))
    return Workload(summarize(rng, reqs), raw=reqs)


def tenant_bursts(seed: int = 17) -> Workload:
    """One tenant sends bursts of long jobs into a shared server; the others are steady.

    The bursts are also the busiest time slices, so a peak detector that ignores
    who arrives blames the time of day (seen in the demo's big_tenants_slower
    scenario in full mode).
    """
    rng = random.Random(seed)
    light = _base(rng, 600, lambda t: 1.5, prompt=200, output=40)
    for r in light:
        r.tenant = rng.choice(["smallco", "tinyinc", "solo"])
    heavy = []
    for start in range(20, 600, 60):  # a burst of 16 every minute
        for _ in range(16):
            r = Req(T0_NS + int((start + rng.uniform(0, 0.8)) * S), lognormal(rng, 2500, 0.3),
                    lognormal(rng, 300, 0.3, lo=4, hi=2000), network_ms=rng.uniform(8, 30))
            r.tenant = "megacorp"
            heavy.append(r)
    # like the demo's shortest-prompt-first admission: the bursts queue behind
    # themselves while the small tenants' short prompts keep getting served
    serve(rng, light + heavy, Server(slots=3, prefill_ms_per_token=0.05, tpot_ms=8.0),
          slots_of=lambda r: "heavy" if r.tenant == "megacorp" else "light")
    reqs = light + heavy
    return Workload(summarize(rng, reqs), raw=reqs)


def stutter_few_giants(seed: int = 18, big_instance: str = "i0") -> Workload:
    """Stutter from prefills of mixed sizes: most are ~1,200 tokens, a few 2,000.

    With only big prefill steps the window's p90 is the very biggest, so a
    detector counting only prefills at the p90 as large sees most freezes
    beside "small" ones (seen in the demo's stutter scenario, quick mode).
    The freezes (~150 ms) are short of what counts as severe without a cause.
    """
    rng = random.Random(seed)
    reqs = _base(rng, 600, lambda t: 1.5, output=150)
    serve(rng, reqs, Server(slots=16))
    steps: list[EngineStep] = []
    sizes = [1200] * 40 + [2000] * 6
    big = sorted((T0_NS + int(rng.uniform(0, 600) * S), size) for size in sizes)
    for b, size in big:
        steps.append(EngineStep("llm", big_instance, b, 150_000, size, 12, 13, 2, 0.5, None, []))
    for t in range(0, 600, 2):
        steps.append(EngineStep("llm", "i0", T0_NS + t * S, 20_000, 0, 12, 12, 1, 0.4, None, []))
    for r in reqs:
        d0 = r.arrival_ns + int((r.tokenize_ms + r.queue_ms + r.prefill_ms) * NS_PER_MS)
        t = d0
        for i, g in enumerate(r.gaps_ms):
            if any(t <= b < t + int(g * NS_PER_MS) + 150 * 10**6 for b, _ in big):
                r.gaps_ms[i] = g + 150.0 * rng.uniform(0.8, 1.2)
            t += int(r.gaps_ms[i] * NS_PER_MS)
    return Workload(summarize(rng, reqs), engine_steps=steps, raw=reqs)


def prefills_on_another_replica(seed: int = 18) -> Workload:
    """`stutter_few_giants`, but the big prefills ran on replica i1 while every stream
    decoded on i0: the same moments, another engine, so they froze nobody here."""
    return stutter_few_giants(seed, big_instance="i1")
