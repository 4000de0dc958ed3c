"""The collector's settings: one typed object, flag → environment variable → default."""

from __future__ import annotations

import contextlib
import math
import os
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tokentrace.store.location import DB_ENV, DEFAULT_MEMORY_LIMIT, resolve_db_path


class SettingError(ValueError):
    """A setting's value is out of range; `settings` names the one(s) at fault, so
    that `resolve` can say which environment variable gave it."""

    def __init__(self, settings: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.settings = settings


@contextlib.contextmanager
def _blaming(name: str) -> Iterator[None]:
    """Turns a ValueError of a check that knows no setting (a parser's) into a
    SettingError of `name`."""
    try:
        yield
    except SettingError:
        raise
    except ValueError as exc:
        raise SettingError((name,), str(exc)) from exc


# The defaults of the settings the pipeline takes, here once: `CollectorSettings` and
# `Pipeline`'s keywords both read them.
DEFAULT_GRACE_S = 2.0
DEFAULT_SERVER_WAIT_S = 7.0
DEFAULT_CLIENT_WAIT_S = 7.0
DEFAULT_DECISION_WAIT_S = 30.0
DEFAULT_MAX_BUFFERED_SPANS = 200_000
#: Default bound of what the tail buffer's traces weigh (see HELP["max_buffered_bytes"]).
DEFAULT_MAX_BUFFERED_BYTES = 512 * 1024 * 1024
#: The pipeline's own defaults, not settings of `serve`: the decisions its cache holds
#: (`collector/decision_cache.py`), and how often its decider looks for ready traces.
DEFAULT_DECISION_CACHE_SIZE = 100_000
DEFAULT_DECISION_TICK_S = 0.1
_SHARD_NAME = re.compile(r"[A-Za-z0-9._:-]{1,128}")


@dataclass(frozen=True, slots=True)
class CollectorSettings:
    """Every setting of `tokentrace serve`; `ENV` names each one's variable."""

    db: Path = Path("tokentrace.duckdb")
    host: str = "127.0.0.1"
    #: address of the OTLP receivers (gRPC, HTTP with /metrics and /readyz); None: `host`
    otlp_host: str | None = None
    http_port: int = 4318
    grpc_port: int = 4317
    web_port: int = 8600
    grace_s: float = DEFAULT_GRACE_S
    server_wait_s: float = DEFAULT_SERVER_WAIT_S
    client_wait_s: float = DEFAULT_CLIENT_WAIT_S
    decision_wait_s: float = DEFAULT_DECISION_WAIT_S
    baseline: float = 0.02
    max_buffered_spans: int = DEFAULT_MAX_BUFFERED_SPANS
    max_buffered_bytes: int = DEFAULT_MAX_BUFFERED_BYTES
    #: OTLP recommends accepting 20 MiB, also after decompression
    max_body_bytes: int = 20 * 1024 * 1024
    slo_ttft_ms: float | None = None
    slo_e2e_ms: float | None = None
    slo_itl_ms: float | None = None
    api_token: str | None = None
    duckdb_memory_limit: str | None = None
    duckdb_checkpoint_threshold: str = "256MB"
    keep_rules: str = ""
    p99_min_samples: int = 100
    p99_warmup: int = 100
    max_pending_writes: int = 256
    decode_processes: int = 1
    retention: str | None = None
    #: the shared lake (docs/scale-out.md): a DuckLake catalog as DuckDB's ATTACH takes it
    lake: str | None = None
    lake_data: str | None = None
    shard: str | None = None
    #: False: a query node (`--no-receivers`): the explorer and API over the lake, no OTLP
    receivers: bool = True
    #: the OTLP write-ahead log: on, off, or auto (on with --lake)
    wal: str = "auto"
    lake_hot_window: str = "1h"
    lake_move_interval_s: float = 2.0
    lake_max_unmoved_rows: int = 2_000_000

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            # NaN passes every `<` check below (and then fails deep in a thread)
            if isinstance(value, float) and not math.isfinite(value):
                raise SettingError((f.name,), f"{f.name} must be a finite number, got {value}")
        ports: dict[int, str] = {}
        for port_name in ("http_port", "grpc_port", "web_port"):
            port = getattr(self, port_name)
            if not 0 <= port <= 65535:
                raise SettingError((port_name,), f"{port_name} must be 0..65535, got {port}")
            if port and port in ports:
                raise SettingError(
                    (ports[port], port_name),
                    f"{ports[port]} and {port_name} are both {port}: each server needs its own port",
                )
            ports[port] = port_name
        if not 0.0 <= self.baseline <= 1.0:
            raise SettingError(("baseline",), f"baseline must be in [0, 1], got {self.baseline}")
        for name in ("grace_s", "server_wait_s", "client_wait_s"):
            if getattr(self, name) < 0:
                raise SettingError((name,), f"{name} must be >= 0, got {getattr(self, name)}")
        for name in (
            "decision_wait_s",
            "max_buffered_spans",
            "max_buffered_bytes",
            "max_body_bytes",
        ):
            if getattr(self, name) <= 0:
                raise SettingError((name,), f"{name} must be positive, got {getattr(self, name)}")
        if self.p99_warmup < 0:
            raise SettingError(("p99_warmup",), f"p99_warmup must be >= 0, got {self.p99_warmup}")
        if self.decode_processes < 0:
            raise SettingError(
                ("decode_processes",), f"decode_processes must be >= 0, got {self.decode_processes}"
            )
        for name in ("p99_min_samples", "max_pending_writes"):
            if getattr(self, name) < 1:
                raise SettingError((name,), f"{name} must be positive, got {getattr(self, name)}")
        from tokentrace.collector.sampling import parse_rules

        with _blaming("keep_rules"):
            parse_rules(self.keep_rules)  # a malformed rule fails here, at start-up
        with _blaming("retention"):
            self.retention_s  # noqa: B018 - a malformed duration fails here, at start-up
        with _blaming("lake_hot_window"):
            self.lake_hot_window_s  # noqa: B018 - a malformed duration fails here, at start-up
        if self.wal not in ("on", "off", "auto"):
            raise SettingError(("wal",), f"wal must be on, off or auto, got {self.wal!r}")
        if not self.lake_move_interval_s > 0:
            raise SettingError(
                ("lake_move_interval_s",),
                f"lake_move_interval_s must be positive, got {self.lake_move_interval_s}",
            )
        if self.lake_max_unmoved_rows < 1:
            raise SettingError(
                ("lake_max_unmoved_rows",),
                f"lake_max_unmoved_rows must be positive, got {self.lake_max_unmoved_rows}",
            )
        for name in ("lake_data", "shard"):
            if getattr(self, name) is not None and not self.lake:
                raise SettingError((name,), f"{name} names a lake: give --lake too")
        if not self.receivers and not self.lake:
            raise SettingError(
                ("receivers",),
                "--no-receivers makes a query node over the lake: give --lake too"
                " (a local file takes one writer, the serve that receives)",
            )
        if self.shard is not None and not _SHARD_NAME.fullmatch(self.shard):
            raise SettingError(
                ("shard",),
                f"shard must be 1-128 letters, digits, '.', '_', ':' or '-', got {self.shard!r}",
            )

    @property
    def otlp_bind_host(self) -> str:
        """The address the OTLP receivers bind: `otlp_host`, else `host`."""
        return self.otlp_host or self.host

    def as_applied(self) -> dict[str, Any]:
        """Gives every setting as `serve` applies it, for its start-up log: an unset
        setting that stands for another value says that value (`otlp_host`: the
        address the receivers bind; `duckdb_memory_limit`: the store's default), and
        the API token is masked."""
        applied = {f.name: getattr(self, f.name) for f in fields(self)}
        applied["otlp_host"] = self.otlp_bind_host
        applied["duckdb_memory_limit"] = self.duckdb_memory_limit or DEFAULT_MEMORY_LIMIT
        if self.api_token:
            applied["api_token"] = "***"
        return applied

    @property
    def wal_on(self) -> bool:
        """Whether serve logs accepted exports before acknowledging them (auto: with a lake)."""
        return self.wal == "on" or (self.wal == "auto" and self.lake is not None)

    @property
    def shard_name(self) -> str:
        """This instance's name in the lake: `shard`, else host name + OTLP/HTTP port."""
        return self.shard or f"{socket.gethostname()}:{self.http_port}"

    @property
    def lake_hot_window_s(self) -> float:
        """`lake_hot_window` in seconds."""
        from tokentrace.collector.retention import parse_duration

        return parse_duration(self.lake_hot_window)

    @property
    def retention_s(self) -> float | None:
        """`retention` in seconds; None (unset, empty or `none`): keep everything."""
        if self.retention is None or self.retention.strip().lower() in ("", "none"):
            return None
        from tokentrace.collector.retention import parse_duration

        return parse_duration(self.retention)


#: Environment variable of each setting.
ENV: dict[str, str] = {f.name: f"TOKENTRACE_{f.name.upper()}" for f in fields(CollectorSettings)}
ENV["db"] = DB_ENV

HELP: dict[str, str] = {
    "db": "DuckDB file",
    "host": "address the web UI binds, and the OTLP receivers unless --otlp-host"
    "; beyond loopback, set $TOKENTRACE_API_TOKEN",
    "otlp_host": "address the OTLP receivers bind (gRPC, and HTTP with /metrics and /readyz),"
    " e.g. 0.0.0.0 to take the fleet's exports while the web UI stays on loopback",
    "http_port": "OTLP/HTTP port (/v1/traces, /v1/metrics)",
    "grpc_port": "OTLP/gRPC port",
    "web_port": "web UI and JSON API port",
    "grace_s": "seconds after a trace's root span ends before deciding whether to keep its spans",
    "server_wait_s": "seconds a trace whose LLM client span came without its server side waits"
    " for the server's spans (vLLM and OpenTelemetry SDKs export every 5 s; tokentrace's every"
    " 0.5 s) before it is decided without them; 0: only --grace-s",
    "client_wait_s": "seconds a trace whose server span names a parent (a traceparent) that has"
    " not come waits for the client's spans (OpenTelemetry SDKs export every 5 s, so the client's"
    " span often comes after the server's) before it is decided without them: no network, no"
    " user-side TTFT; 0: only --grace-s",
    "decision_wait_s": "decide traces whose root never ends after this many seconds",
    "baseline": "probability of keeping an unremarkable trace",
    "max_buffered_spans": "bound of the tail buffer; beyond it receivers answer 503",
    "max_buffered_bytes": "bound of the memory the tail buffer's traces take (their strings,"
    " plus ~1 KB a span); beyond it receivers answer 503. The default keeps serve near 1 GiB"
    " in all: see docs/collector.md",
    "max_body_bytes": "largest accepted request body, also after decompression (gzip, deflate,"
    " zstd), also gRPC messages",
    "slo_ttft_ms": "keep every trace whose TTFT exceeds this",
    "slo_e2e_ms": "keep every trace whose end-to-end time exceeds this",
    "slo_itl_ms": "keep every trace whose largest inter-token gap exceeds this",
    "api_token": "bearer token required by the web UI and API; prefer setting"
    " $TOKENTRACE_API_TOKEN: a flag's value shows in `ps`",
    "duckdb_memory_limit": "DuckDB's memory bound, e.g. 512MB or 2GB",
    "duckdb_checkpoint_threshold": "write-ahead log size at which DuckDB folds it into the file;"
    " bigger means faster inserts and a longer replay after a crash: see docs/collector.md",
    "keep_rules": "keep every trace with one of these attributes: key=value[,key=value...]"
    " (span or resource attribute, e.g. tenant.id=acme,gen_ai.request.model=big)",
    "p99_min_samples": "requests a service/model/route needs before its running p99 keeps slow"
    " traces",
    "p99_warmup": "keep the first N traces of each service/model/route whole while its p99"
    " warms up (at most --p99-min-samples; again after 5 idle minutes; 0: none)",
    "max_pending_writes": "batches the DuckDB writer may queue; beyond it receivers answer 503",
    "decode_processes": "worker processes that decode big OTLP/HTTP protobuf exports off the GIL"
    " (0: decode everything in the collector process)",
    "lake": "a shared DuckLake catalog as DuckDB's ATTACH takes it, e.g. 'ducklake:postgres:dbname=tokentrace"
    " host=db.internal': serve moves sealed rows there in batches, its file stays the hot tier;"
    " none: the file alone",
    "lake_data": "where the lake's Parquet files go: a directory or s3://bucket/prefix (needed when"
    " the catalog is new)",
    "shard": "this instance's name in the lake (default: host name:OTLP/HTTP port)",
    "receivers": "a query node: no OTLP receivers, only the explorer and API over the lake"
    " (with --lake); any number of them run beside the shards",
    "wal": "log every accepted export to disk before answering 200, replayed at restart:"
    " on, off, or auto (on with --lake)",
    "lake_hot_window": "how long rows moved to the lake stay in the local file too (the shard's"
    " own explorer reads them)",
    "lake_move_interval_s": "seconds between moves of sealed rows into the lake",
    "lake_max_unmoved_rows": "rows the local file may hold that the lake has not taken (the lake"
    " unreachable); beyond it receivers answer 503",
    "retention": "delete data older than this: 7d, 36h, 90m, 3600s, 1d12h (a unit is required;"
    " none keeps everything); the file then stops growing but never shrinks",
}


def shown_default(name: str) -> str:
    """Gives a setting's default as `serve --help` and the docs say it."""
    if name == "otlp_host":
        return "same as --host"
    if name == "duckdb_memory_limit":
        return DEFAULT_MEMORY_LIMIT  # applied when the database is opened
    default: Any = CollectorSettings.__dataclass_fields__[name].default
    if name in ("max_body_bytes", "max_buffered_bytes"):
        return f"{default} ({default // (1024 * 1024)} MiB)"
    if isinstance(default, bool):
        return str(default).lower()
    return "none" if default is None or default == "" else str(default)


def resolve(explicit: dict[str, Any] | None = None) -> CollectorSettings:
    """Builds the settings: explicit (non-None) values, else environment, else default."""
    explicit = explicit or {}
    values: dict[str, Any] = {}
    from_env: dict[str, str] = {}  # the settings taken from the environment: their raw text
    for f in fields(CollectorSettings):
        value = explicit.get(f.name)
        if value is None:
            raw = os.environ.get(ENV[f.name])
            if raw is not None and raw != "":
                value = _convert(f.name, raw)
                from_env[f.name] = raw
        if value is not None:
            values[f.name] = value
    if "db" in values or DB_ENV in os.environ:
        values["db"] = resolve_db_path(values.get("db"))
    try:
        return CollectorSettings(**values)
    except SettingError as exc:
        # a value nobody typed on this command line: say where it came from
        blamed = [f"{ENV[name]}={from_env[name]!r}" for name in exc.settings if name in from_env]
        if not blamed:
            raise
        raise SettingError(exc.settings, f"{exc} (from {', '.join(blamed)})") from exc


def _convert(name: str, raw: str) -> Any:
    default = CollectorSettings.__dataclass_fields__[name].default
    try:
        if name == "db":
            return Path(raw)
        if isinstance(default, bool):
            return raw.lower() in ("1", "true", "yes", "on")
        if isinstance(default, int):
            return int(raw)
        if isinstance(default, float) or name.startswith("slo_"):
            return float(raw)
    except ValueError as exc:
        raise ValueError(f"{ENV[name]}={raw!r} is not a valid {name}") from exc
    return raw
