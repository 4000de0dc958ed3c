"""`peak_hours`: the system accepts more work than it can serve, and the queue dominates.

Two shapes of it (docs/design.md §5):

- **a peak**: in the busiest time slices the queue takes over, against quieter slices
  of the same window (the contrast: "latency explodes at peak hours");
- **saturated throughout**: the queue dominates E2E in (nearly) every slice, so there
  is no quiet slice to contrast with — an overloaded server, a load test above
  capacity, a closed-loop client holding more requests in flight than the server
  serves.  Without this, such a window would get no load finding at all unless GPU
  samples showed `gpu_saturation`, and a minor finding would lead the report.
  Heavy queueing that lags behind bursts counts too: bursts build a backlog that
  drains for minutes after them, so the busiest arrival slices wait *less* than the
  ones after them (no peak contrast), and the queue can stay just short of half of
  E2E while the median request waits seconds.
"""

from __future__ import annotations

import math
from typing import Any

from tokentrace.analyzer.diagnosis import slice_mix
from tokentrace.analyzer.diagnosis._base import Context, Finding, confidence, duration, ev, ms, pct
from tokentrace.analyzer.quantiles import grouped_quantiles

COMPLAINT = "peak_hours"
MIN_SLICES = 10
#: the busy slices must see clearly more arrivals, a queue-dominated E2E, and a real jump
MIN_ARRIVAL_RATIO = 1.3
MIN_BUSY_QUEUE_SHARE = 0.3
MIN_QUEUE_SHARE_GAIN = 0.2
MIN_E2E_RATIO = 1.5
#: a "peak" whose extra arrivals are one tenant's burst (at least this share of the
#: busy slices, and at least BURST_SHARE_RATIO times its share elsewhere) is
#: tenant interference: big_tenants_slower explains it, not the time of day
BURST_TENANT_SHARE = 0.4
BURST_SHARE_RATIO = 3.0
#: saturated throughout: queue wait is at least this share of the window's E2E and of the
#: median request's E2E (the queue dominates, for most requests and not one tenant's) ...
SATURATED_QUEUE_SHARE = 0.5
#: ... in at least this share of its slices queue wait is MIN_BUSY_QUEUE_SHARE of E2E or
#: more (the bar the busy slices of a peak must reach), which leaves room for a backlog
#: that starts empty and builds up, or drains now and then near capacity ...
MIN_SATURATED_SLICE_FRACTION = 2 / 3
#: ... and the median request waits long enough for a person to notice
MIN_SATURATED_WAIT_MS = 250.0
#: A short window (a load test's burst: 100 requests sent in two seconds, then seconds
#: of draining) has fewer than MIN_SLICES slices with arrivals, too few for a peak's
#: contrast; with this many requests the same tests still tell a saturated server (a
#: newcomer's first run read "stutter" alone over ten seconds of queueing).
MIN_SHORT_WINDOW_REQUESTS = 50
#: the median wait of the last fifth of arrivals over the first fifth that says the backlog grows
GROWING_WAIT_RATIO = 1.5
#: Heavy queueing, whatever the slices show: the median request waits this long in the queue
#: (seconds before anything happens: a person notices, whatever the compute) ...
HEAVY_WAIT_MS = 1000.0
#: ... and queue wait is at least this share of all E2E time: by Little's law the backlog
#: then averages about half as many requests as are being served, or more (a FIFO server of
#: 19 slots under Azure conversation arrivals: 49 %, median wait 2.9 s; of 20 slots:
#: 31 %, 0.8 s, which bad_in_production's low/high load comparison names)
HEAVY_QUEUE_SHARE = 1 / 3
#: Titles of the saturated shapes, by when the server is over capacity (TITLES' "at peak hours"
#: would contradict evidence that says no busy slice stands out, or that it is not the one
#: that waits).  The complaint id stays `peak_hours`.
SATURATED_TITLES = {
    "all": "Latency explodes under load: the server is over capacity all the time",
    "most": "Latency explodes under load: the server is over capacity most of the time",
    "bursts": "Latency explodes under load: bursts leave a backlog that outlasts them",
    "short": "Latency explodes under load: more work arrived at once than the server could serve",
}


def busiest_slices(ctx: Context) -> tuple[dict[bool, dict], str | None]:
    """Gives the slice split (busy / rest) and the traffic class it was counted on (None: all;
    evidence counted on one class says so, since the report's tables are of all of them)."""
    # with mixed traffic, peaks are measured on live traffic: batch floods are batch_mode's
    cls = "interactive" if (ctx.overview.get("classes") or 0) > 1 else None
    return slice_mix.busy_split(ctx, cls), cls


def detect(ctx: Context) -> Finding | None:
    slices, cls = busiest_slices(ctx)
    return _peak(ctx, slices, cls) or _saturated(ctx, cls, slices)


def _arrivals(cls: str | None) -> str:
    """Gives what the slices' arrivals count: every request, or one class's."""
    return f"{cls} arrivals" if cls else "arrivals"


def _peak(ctx: Context, slices: dict[bool, dict], cls: str | None = None) -> Finding | None:
    busy_s, rest_s = slices.get(True), slices.get(False)
    if not busy_s or not rest_s or busy_s["slices"] + rest_s["slices"] < MIN_SLICES:
        return None
    arrival_ratio = (busy_s["arrivals_mean"] or 0.0) / max(rest_s["arrivals_mean"] or 0.0, 1e-9)
    if arrival_ratio < MIN_ARRIVAL_RATIO:
        return None
    busy_ids = [int(x) for x in busy_s["slice_ids"]]
    slice_rows = slice_mix.per_slice(ctx)
    rows = _sides(slice_rows, busy_ids)
    busy, rest = rows.get(True), rows.get(False)
    if not busy or not rest:
        return None
    qb, qr = busy["queue_share"] or 0.0, rest["queue_share"] or 0.0
    if qb < MIN_BUSY_QUEUE_SHARE or qb - qr < MIN_QUEUE_SHARE_GAIN:
        return None
    e2e = _e2e_percentiles(ctx, busy_ids, slice_rows)
    for side, row in rows.items():
        row["e2e_p50"], row["e2e_p95"] = e2e.get(side) or (None, None)
    e2e_ratio = (busy["e2e_p50"] or 0.0) / max(rest["e2e_p50"] or 0.0, 1e-9)
    if e2e_ratio < MIN_E2E_RATIO:
        return None
    if _one_tenants_burst(ctx, busy_ids):
        return None
    label = ctx.slice_label()
    slice_s = ctx.slice_ns / 1e9
    lo, hi = ctx.time_bounds
    window_s = (hi - lo) / 1e9
    # with mixed traffic the busy slices are the busiest for live arrivals; the queue and
    # E2E figures are of every request arriving in them
    by = f" by {_arrivals(cls)}" if cls else ""
    per_slice = f"{cls} requests per slice" if cls else "per slice"
    # the title says "peak hours": say how long this window's peak is, so a window of
    # minutes does not read as if it held busy hours
    evidence = [
        ev(
            f"queue is {pct(qb)} of E2E for requests arriving in the busiest 10 % of {label}{by} "
            f"({busy_s['slices']} slices: {duration(busy_s['slices'] * slice_s)} of this "
            f"{duration(window_s)} window) vs {pct(qr)} otherwise",
            busy_queue_share=qb, baseline_queue_share=qr, slice_seconds=slice_s,
            busy_slices=busy_s["slices"], slices=busy_s["slices"] + rest_s["slices"],
            peak_seconds=busy_s["slices"] * slice_s, window_seconds=window_s,
        ),
        ev(
            f"those slices get {arrival_ratio:.1f}× the {_arrivals(cls)} ({_mean(busy_s['arrivals_mean'])} vs "
            f"{_mean(rest_s['arrivals_mean'])} {per_slice}); E2E p50 {ms(busy['e2e_p50'])} vs {ms(rest['e2e_p50'])}, "
            f"p95 {ms(busy['e2e_p95'])} vs {ms(rest['e2e_p95'])}",
            arrival_ratio=arrival_ratio, busy_e2e_p50_ms=busy["e2e_p50"], baseline_e2e_p50_ms=rest["e2e_p50"],
            busy_e2e_p95_ms=busy["e2e_p95"], baseline_e2e_p95_ms=rest["e2e_p95"],
        ),
    ]
    affected, examples = ctx.traces(ctx.query("affected_peak_hours", [busy_ids, ctx.slice_ns]))
    strength = (qb - qr - MIN_QUEUE_SHARE_GAIN) / 0.2 + (e2e_ratio - MIN_E2E_RATIO) / 2
    total = (busy["e2e_total"] or 0.0) + (rest["e2e_total"] or 0.0)
    return Finding(
        COMPLAINT,
        confidence(strength, busy["n"]),
        impact=(busy["e2e_total"] or 0.0) * qb / max(total, 1e-9) + 0.3,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        fix_lead=(
            f"Add capacity for the busy {label} ({arrival_ratio:.1f}× the usual {_arrivals(cls)}): scale out "
            "before them, or refuse the excess early (a concurrency limit answering 429) instead of "
            "queueing it"
        ),
        basis="contrast",
    )


def _saturated(ctx: Context, cls: str | None, by_arrivals: dict[bool, dict] | None = None) -> Finding | None:
    """The queue dominates (nearly) every slice, or the median request waits seconds in a
    backlog that lags behind the bursts: more work than capacity most of the time, and no
    busy-against-quiet contrast to show it."""
    bar = MIN_BUSY_QUEUE_SHARE
    s = ctx.one("diag_saturation", [cls, cls, ctx.slice_ns, bar, bar, bar])
    slices, dominated = int(s.get("slices") or 0), int(s.get("dominated") or 0)
    if not slices or (slices < MIN_SLICES and int(s.get("n") or 0) < MIN_SHORT_WINDOW_REQUESTS):
        return None
    share, request_share = float(s["queue_share"] or 0.0), float(s["request_share_p50"] or 0.0)
    covered = dominated / slices
    wait_p50 = float(s["queue_wait_p50"] or 0.0)
    # a short window's burst: the first arrivals are served at once, the later ones wait,
    # so the slices split; the median request's share says it instead
    short = slices < MIN_SLICES
    dominates = (
        share >= SATURATED_QUEUE_SHARE
        and request_share >= SATURATED_QUEUE_SHARE
        and (short or covered >= MIN_SATURATED_SLICE_FRACTION)
        and wait_p50 >= MIN_SATURATED_WAIT_MS
    )
    heavy = wait_p50 >= HEAVY_WAIT_MS and share >= HEAVY_QUEUE_SHARE
    if not dominates and not heavy:
        return None
    slice_s = ctx.slice_ns / 1e9
    median = f"median slice {pct(s['slice_share_p50'])}"
    # counted on live traffic where batch traffic shares the window: every figure says
    # so, since the report's tables above are of all of it
    request = f"{cls} request" if cls else "request"
    requests, their = f"{request}s", "their " if cls else ""
    if short:
        where, shape = "", "short"
    elif dominated == slices:
        where = f"every one of the window's {ctx.slices_counted(slices, median)}"
        when, shape = "all the time, with no quiet slices to compare the busy ones with", "all"
    else:
        where = f"{dominated} of the window's {ctx.slices_counted(slices, median)}"
        tail = int(s["tail_slices"] or 0)
        if tail * 3 >= slices:
            where += f", every one from {duration(int(s['tail_from_slices'] or 0) * slice_s)} on"
        if covered >= MIN_SATURATED_SLICE_FRACTION:
            when, shape = "most of the time, not only in its busiest slices", "most"
        else:
            when, shape = "in bursts, and the backlog they leave outlasts them", "bursts"
    span = max(float(s["span_ms"] or 0.0), 1e-9)
    waiting = float(s["queue_wait_total"] or 0.0) / span
    served = float(s["compute_total"] or 0.0) / span
    if short:
        text = (
            f"queue wait is {pct(share)} of E2E (of the median request's, {pct(request_share)}) for "
            f"{int(s['n'] or 0)} {requests} arriving within {ctx.slices_counted(slices)}, too few to "
            "compare busy slices with quiet ones: the server took in more work than it could serve at once"
        )
        if not dominates:
            text = f"the median {request} waits {ms(wait_p50)} in the queue; " + text
    else:
        text = (
            f"queue wait is {pct(share)} of {their}E2E, and at least {pct(bar)} in {where}: "
            f"the server accepts more work than it serves {when}"
        )
        if not dominates:
            # the queue stays short of half of E2E: the wait itself says it is heavy
            text = f"the median {'one' if cls else 'request'} waits {ms(wait_p50)} in the queue; " + text
        if cls:
            text = f"{requests}: {text}"
    evidence = [
        ev(
            text,
            queue_share=share, request_queue_share_p50=request_share, slices=slices,
            queue_dominated_slices=dominated, slice_seconds=slice_s,
            slice_queue_share_p50=s["slice_share_p50"],
        ),
        ev(
            f"on average {waiting:.1f} {requests} wait in the queue while {served:.1f} are being "
            f"served (Little's law); {their}queue wait p50 {ms(wait_p50)}, p95 {ms(s['queue_wait_p95'])} "
            f"against prefill + decode p50 {ms(s['compute_p50'])}; {their}E2E p95 {ms(s['e2e_p95'])}",
            queue_length_mean=waiting, in_service_mean=served, queue_wait_p50_ms=wait_p50,
            queue_wait_p95_ms=s["queue_wait_p95"], compute_p50_ms=s["compute_p50"],
            e2e_p95_ms=s["e2e_p95"],
        ),
    ]
    first, last = float(s["first_wait_p50"] or 0.0), float(s["last_wait_p50"] or 0.0)
    evidence.append(_trend(first, last, wait_p50, float(s["compute_p50"] or 0.0), cls))
    lag = _lagging_backlog(ctx, by_arrivals or {}, cls) if not short else None
    if lag is not None:
        evidence.append(lag)
    affected, examples = ctx.traces(ctx.query("affected_window", [SATURATED_QUEUE_SHARE]))
    # strength: how far the queue is past dominating, overall, for the median request and
    # across slices, and how far the wait outgrows the compute it waits for
    # (heavy queueing short of dominating: how far past its bars the share and the wait are)
    compute = max(float(s["compute_p50"] or 0.0), 1e-9)
    strength = max(
        (share - SATURATED_QUEUE_SHARE) / 0.1
        + (request_share - SATURATED_QUEUE_SHARE) / 0.1
        + (0.0 if short else (covered - MIN_SATURATED_SLICE_FRACTION) / 0.1)
        + max(0.0, wait_p50 / compute - 1.0),
        (share - HEAVY_QUEUE_SHARE) / 0.1 + min(1.0, wait_p50 / HEAVY_WAIT_MS - 1.0) if heavy else 0.0,
    )
    total = max(float(s["e2e_total"] or 0.0), 1e-9)
    return Finding(
        COMPLAINT,
        confidence(strength, int(s["n"] or 0)),
        # the queue-dominated slices hold the requests it touches: nearly the whole window
        # (a short window's: its queue-dominated requests, the median one among them)
        impact=request_share if short else float(s["dominated_e2e"] or 0.0) / total,
        evidence=evidence,
        affected_trace_ids=affected,
        affected_count=affected.total,
        example_traces=examples,
        fix_lead=(
            f"Add capacity: on average {waiting:.1f} {requests} wait while {served:.1f} are served; "
            "scale out, or refuse the excess early (a concurrency limit answering 429) instead of "
            "queueing it"
        ),
        basis="saturated",
        title=SATURATED_TITLES[shape],
    )


def _mean(arrivals: float | None) -> str:
    """Gives a mean count of arrivals as a reader takes it in: '2.4', '61', '52,857' (a tenth
    of a request matters only where there are few)."""
    x = float(arrivals or 0.0)
    return f"{x:.1f}" if abs(x) < 100 else f"{x:,.0f}"


def _sides(per_slice: list[dict[str, Any]], busy_ids: list[int]) -> dict[bool, dict[str, Any]]:
    """Gives the requests arriving in the busy slices (True) and in the rest (False) from
    diag_peak's slices: how many, queue share, E2E time (a side without slices: none)."""
    busy = set(busy_ids)
    sides: dict[bool, dict[str, Any]] = {}
    for side in (True, False):
        mine = [r for r in per_slice if (r["slice"] in busy) == side]
        if mine:
            e2e = math.fsum(r["e2e_total"] for r in mine)
            sides[side] = {
                "busy": side,
                "n": sum(r["n"] for r in mine),
                "queue_share": math.fsum(r["queue_total"] for r in mine) / e2e if e2e else None,
                "e2e_total": e2e,
            }
    return sides


def _e2e_percentiles(
    ctx: Context, busy_ids: list[int], per_slice: list[dict[str, Any]]
) -> dict[bool, list[float] | None]:
    """Gives the E2E p50 and p95 of the requests arriving in the busy slices (True) and
    of the rest (False): counted per slice (the cheap group; diag_peak's slices give each
    one's E2E range), then of each side's union."""
    busy = set(busy_ids)
    ranges = [(r["slice"], r["e2e_n"], r["e2e_min"], r["e2e_max"]) for r in per_slice]
    by_side = grouped_quantiles(
        ctx.conn, ctx.cte, ctx.params, {"e2e": "e2e_ms"}, (0.5, 0.95),
        "start_ns // ?", [ctx.slice_ns], part_of=busy.__contains__, ranges=ranges,
    )  # fmt: skip
    return {bool(side): figures["e2e"] for side, figures in by_side.items()}


def _one_tenants_burst(ctx: Context, busy_ids: list[int]) -> bool:
    """True when the busy slices' extra arrivals are one tenant's burst on a shared server."""
    shares: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for r in slice_mix.tenant_shares(ctx, busy_ids):
        shares[bool(r["busy"])][r["tenant"]] = r["share"] or 0.0
    busy, rest = shares[True], shares[False]
    if len(set(busy) | set(rest)) < 2 or not busy:
        return False
    tenant, share = max(busy.items(), key=lambda kv: kv[1])
    return bool(tenant) and share >= BURST_TENANT_SHARE and share >= BURST_SHARE_RATIO * rest.get(tenant, 0.0)


def _trend(
    first: float, last: float, wait_p50: float, compute_p50: float, cls: str | None = None
) -> dict[str, Any]:
    """Says whether the backlog grows (arrivals outpace service), holds, or drains (of class
    `cls`'s requests, where the figures are counted on one class)."""
    numbers = {"first_queue_wait_p50_ms": first, "last_queue_wait_p50_ms": last}
    wait = f"{cls} requests' queue wait p50" if cls else "queue wait p50"
    head = f"from {ms(first)} for the first fifth of {'their ' if cls else ''}arrivals to {ms(last)} for the last"
    if last >= GROWING_WAIT_RATIO * max(first, 1e-9):
        return ev(f"{wait} rises {head}: arrivals outpace service and the backlog grows",
                  backlog="growing", **numbers)
    if first >= GROWING_WAIT_RATIO * max(last, 1e-9):
        still = (
            "requests still wait longer than they compute"
            if wait_p50 > compute_p50
            else f"the median {f'{cls} ' if cls else ''}request still waits {ms(wait_p50)}"
        )
        return ev(f"{wait} falls {head}: the backlog drains, yet {still}", backlog="draining", **numbers)
    return ev(f"{wait} holds {head}: a steady backlog, the server running at capacity "
              "with requests always waiting", backlog="steady", **numbers)


def _lagging_backlog(ctx: Context, by_arrivals: dict[bool, dict], cls: str | None = None) -> dict[str, Any] | None:
    """Says, where it is so, that the busiest arrival slices queue no more than the rest: the
    backlog a burst builds is waited out by the requests after it (why no peak is named)."""
    busy_s, rest_s = by_arrivals.get(True), by_arrivals.get(False)
    if not busy_s or not rest_s:
        return None
    arrivals = (busy_s["arrivals_mean"] or 0.0) / max(rest_s["arrivals_mean"] or 0.0, 1e-9)
    if arrivals < MIN_ARRIVAL_RATIO:
        return None  # no bursts to lag behind
    busy_ids = [int(x) for x in busy_s["slice_ids"]]
    rows = _sides(slice_mix.per_slice(ctx), busy_ids)
    busy, rest = rows.get(True), rows.get(False)
    if not busy or not rest:
        return None
    qb, qr = float(busy["queue_share"] or 0.0), float(rest["queue_share"] or 0.0)
    if qb > qr:
        return None
    return ev(
        f"requests arriving in the busiest 10 % of {ctx.slice_label()} ({arrivals:.1f}× the {_arrivals(cls)}) "
        f"spend {pct(qb)} of E2E in the queue, the rest {pct(qr)}: the backlog lags behind the "
        "bursts that build it, so the busiest slices are not the ones that wait",
        busy_queue_share=qb, baseline_queue_share=qr, arrival_ratio=arrivals,
    )
