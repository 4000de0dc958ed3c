"""What a window's traces could show: the signals they carried, whether each complaint could
be checked (and if not, what to add), and the traces that matched no convention.

A complaint is asserted only with the contrast that defines it (docs/design.md §5): where
the data lacks it, `diagnose` does not run its detector, and the report says so here
instead (docs/report.md, "Coverage").  `NEEDS` is the one table of what each complaint
needs; the detectors' own thresholds then decide on the data they were given.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from tokentrace._words import counted
from tokentrace.analyzer.diagnosis import bad_in_production, cold_start, stutter
from tokentrace.analyzer.diagnosis._base import MIN_REQUESTS, TITLES, Context

#: Engine start-ups that ended this long before the window still explain its first requests
#: (those cold_start counts as cold).
START_LOOKBACK_NS = cold_start.AFTER_START_NS
#: Root span names the coverage lists at most (the rest are counted).
MAX_ROOT_NAMES = 8
#: Most characters of a name from the spans (an environment, a tenant, a root span) that a
#: coverage sentence carries: a sender's 20,000-character value is no name to read.
MAX_NAME_CHARS = 80
#: Token-time sources, as `requests.token_times_source` names them.
TOKEN_TIME_SOURCES = ("server", "client", "none")
#: What an engine gives that the SDK would: said where a signal is missing.
ADD_CLIENT_CHUNKS = "add a client span with chunk events (OpenLLMetry), or the SDK"
ADD_SERVER_SPANS = (
    "export the server's own spans (vLLM --otlp-traces-endpoint, SGLang, TGI, or the SDK)"
)


@dataclass(frozen=True, slots=True)
class Signals:
    """What one window's traces carried, counted."""

    requests: int = 0
    #: requests by where their token times came from: server, client, none
    token_times: dict[str, int] = field(default_factory=dict)
    #: requests with inter-token gaps (3 tokens or more): what stutter reads
    streams: int = 0
    client_spans: int = 0
    server_unseen: int = 0
    prompt_tokens: int = 0
    #: requests with a first-token time the server saw (not only their client)
    server_first_token: int = 0
    environments: dict[str, int] = field(default_factory=dict)
    tenants: int = 0
    #: the first few tenants' names, for the sentence that says there is only one
    tenant_names: list[str] = field(default_factory=list)
    traffic_classes: dict[str, int] = field(default_factory=dict)
    instances: int = 0
    cold_marked: int = 0
    engine_steps: int = 0
    #: engine steps whose batch size, decode count, KV usage the engine gave (NULL: unknown)
    step_batch_sizes: int = 0
    step_decodes: int = 0
    step_kv: int = 0
    gpu_samples: int = 0
    gpu_memory: int = 0
    engine_starts: int = 0


def read_signals(ctx: Context) -> Signals:
    """Gives what the window's requests and the engines beside them carried."""
    r = ctx.carried  # diag_signals
    n = int(r.get("requests") or 0)
    if not n:
        return Signals()
    lo, hi = ctx.time_bounds
    svc = ctx.filters.service
    e = ctx.one("diag_signal_engines", [lo, hi, svc, svc] * 2 + [lo - START_LOOKBACK_NS, hi, svc, svc])
    return Signals(
        requests=n,
        token_times={k: int(r[f"token_times_{k}"] or 0) for k in TOKEN_TIME_SOURCES},
        streams=int(r["streams"] or 0),
        client_spans=int(r["client_spans"] or 0),
        server_unseen=int(r["server_unseen"] or 0),
        prompt_tokens=int(r["prompt_tokens"] or 0),
        server_first_token=int(r["server_first_token"] or 0),
        environments=_counts(r["environments"]),
        tenants=int(r["tenants"] or 0),
        tenant_names=[str(t) for t in r["tenant_names"] or []],
        traffic_classes=_counts(r["traffic_classes"]),
        instances=int(r["instances"] or 0),
        cold_marked=int(r["cold_marked"] or 0),
        **{k: int(e.get(k) or 0) for k in (
            "engine_steps", "step_batch_sizes", "step_decodes", "step_kv", "gpu_samples",
            "gpu_memory", "engine_starts",
        )},
    )  # fmt: skip


def _counts(histogram: Any) -> dict[str, int]:
    """Gives a DuckDB histogram (a MAP) as {value: count}, the most frequent first."""
    items = dict(histogram or {})
    return {str(k): int(v) for k, v in sorted(items.items(), key=lambda kv: (-kv[1], str(kv[0])))}


def short(name: object) -> str:
    """Gives a name from the spans as a coverage sentence carries it: cut to MAX_NAME_CHARS."""
    text = str(name)
    return text if len(text) <= MAX_NAME_CHARS else text[: MAX_NAME_CHARS - 1] + "…"


def _named(values: list[str]) -> str:
    shown = ", ".join(short(v) for v in values[:4])
    return shown + (f" and {len(values) - 4} more" if len(values) > 4 else "")


# ---- what each complaint needs: None where the window has it, else what is missing and
# ---- what to add, in one sentence


def _queue_seen(s: Signals) -> str | None:
    if s.server_unseen >= s.requests:
        return f"every request was seen only by its client, so its queue is not measured: {ADD_SERVER_SPANS}"
    return None


def _environments(s: Signals) -> str | None:
    envs = s.environments
    tag = "tag each deployment's traces with deployment.environment.name (production, staging, …)"
    if not envs:
        return f"no deployment.environment on the traces: {tag}"
    names = list(envs)
    if len(names) == 1:
        return (
            f"only one environment ({short(names[0])}) on the traces: tag the other deployments' traces "
            "with theirs (deployment.environment.name)"
        )
    prod = [e for e in names if bad_in_production.is_prod(e)]
    if not prod:
        return (
            f"no production among the traces' environments ({_named(names)}): name production's "
            f"deployment.environment.name one of {', '.join(bad_in_production.PROD_NAMES)}"
        )
    if len(prod) == len(names):
        return f"only production environments on the traces ({_named(names)}): tag another deployment's traces"
    side = bad_in_production.MIN_PER_SIDE
    if max(envs[e] for e in prod) < side or max(envs[e] for e in names if e not in prod) < side:
        shown = ", ".join(f"{short(e)}: {envs[e]}" for e in names[:4])
        return f"too few requests to compare environments ({shown}; {side} on each side needed)"
    return None


def _first_tokens(s: Signals) -> str | None:
    if s.server_first_token:
        return None
    if s.server_unseen >= s.requests:
        return f"every request was seen only by its client, so prefill is not measured: {ADD_SERVER_SPANS}"
    return "no first-token time on the requests: stream the answers, or send the SDK's token times"


def _token_gaps(s: Signals) -> str | None:
    if s.streams >= stutter.MIN_STREAMS or s.step_decodes:
        return None
    have = f" ({s.streams} streams have them; {stutter.MIN_STREAMS} needed)" if s.streams else ""
    return f"no per-token times{have}: {ADD_CLIENT_CHUNKS}"


def _prompt_sizes(s: Signals) -> str | None:
    if s.prompt_tokens:
        return None
    return "no prompt token counts: put gen_ai.usage.input_tokens on the request's spans"


def _tenants(s: Signals) -> str | None:
    where = "set tenant.id (or tokentrace.tenant, user.id, enduser.id) on the request or a span above it"
    if not s.tenants:
        return f"no tenant on the traces: {where}"
    if s.tenants == 1:
        return f"only one tenant ({short(s.tenant_names[0]) if s.tenant_names else '?'}) on the traces: {where}"
    return None


def _traffic_classes(s: Signals) -> str | None:
    classes = s.traffic_classes
    if classes.get("batch") and len(classes) >= 2:
        return None
    if classes.get("batch"):
        return "only batch traffic in this window: no live requests to compare"
    return (
        "no batch traffic class on the traces: mark batch jobs' requests "
        "tokentrace.traffic_class=batch (on the request or a span above it)"
    )


def _instances(s: Signals) -> str | None:
    if s.engine_starts or s.cold_marked or s.instances >= cold_start.MIN_INSTANCES:
        return None
    return (
        "no engine start-up trace, no cold-start mark, and one instance: export the engine's "
        "start-up traces (vLLM sends them with --otlp-traces-endpoint), or name each replica "
        "(service.instance.id), or use the SDK (it marks cold starts)"
    )


def _gpu(s: Signals) -> str | None:
    if s.gpu_samples:
        return None
    return "no GPU samples: run the SDK's NVML sampler (tt.start_gpu_sampler) beside the server"


def _kv(s: Signals) -> str | None:
    if s.step_kv or s.gpu_memory:
        return None
    return (
        "no KV-cache usage on engine steps and no GPU memory samples: send the SDK's engine "
        "steps (kv_usage) or run its NVML sampler"
    )


#: What each complaint needs: a function of the window's signals giving None where it can
#: be checked, else what is missing and what to add.
NEEDS: dict[str, Callable[[Signals], str | None]] = {
    "peak_hours": _queue_seen,
    "bad_in_production": _environments,
    "batch_mode_breaks_live": _traffic_classes,
    "big_tenants_slower": _tenants,
    "long_wait_then_fast": _first_tokens,
    "stutter": _token_gaps,
    "tiny_prompts_slow": _prompt_sizes,
    "cold_start": _instances,
    "gpu_saturation": _gpu,
    "kv_cache_pressure": _kv,
}


@dataclass(frozen=True, slots=True)
class Check:
    """Whether one complaint could be checked in the window, and if not, why."""

    complaint: str
    title: str
    checkable: bool
    #: what is missing and what to add (None where it could be checked)
    missing: str | None = None


def checks(s: Signals) -> list[Check]:
    """Gives each complaint's check, in the complaint table's order."""
    if s.requests < MIN_REQUESTS:
        why = f"too few requests ({counted(s.requests, 'request')}; the checks need {MIN_REQUESTS})"
        return [Check(c, TITLES[c], False, why) for c in NEEDS]
    out = []
    for complaint, needs in NEEDS.items():
        missing = needs(s)
        out.append(Check(complaint, TITLES[complaint], missing is None, missing))
    return out


def unmatched_traces(ctx: Context) -> dict[str, Any]:
    """Gives how many traces in the window matched no span convention, by root span name."""
    f = ctx.filters
    svc = f.service
    rows = ctx.query("diag_unmatched", [f.start_ns, f.start_ns, f.end_ns, f.end_ns, svc, svc])
    roots = [{"name": str(r["root_name"]), "count": int(r["n"])} for r in rows]
    return {"count": sum(r["count"] for r in roots), "roots": roots[:MAX_ROOT_NAMES]}


def coverage(ctx: Context, signals: Signals | None = None) -> dict[str, Any]:
    """Gives the report's `coverage`: the signals, each complaint's check, unmatched traces."""
    s = signals if signals is not None else read_signals(ctx)
    return {
        "signals": asdict(s),
        "complaints": [asdict(c) for c in checks(s)],
        "unmatched_traces": unmatched_traces(ctx),
    }
