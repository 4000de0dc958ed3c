"""The one typed configuration object of the tiny LLM server, built at the edge (CLI or create_app)."""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass
from typing import Any

# Every field can come from the environment as TINY_LLM_<FIELD NAME IN CAPITALS>,
# e.g. TINY_LLM_MAX_BATCH_SIZE=16; explicit arguments win over the environment.
ENV_PREFIX = "TINY_LLM_"


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server, engine, model and scheduler need."""

    host: str = "127.0.0.1"
    port: int = 8000
    model_name: str = "tiny-llm"
    # scheduler policy
    max_batch_size: int = 8
    max_tokens_per_step: int = 512
    prefill_chunk_size: int | None = None
    batch_delay_ms: float = 0.0
    prefill_interrupts_decode: bool = True
    shortest_prompt_first: bool = False  # admission order within a traffic class
    kv_slots: int | None = None
    # model shape; weights are seeded random numbers
    d_model: int = 256
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 1024
    max_seq_len: int = 1024
    seed: int = 0
    # runtime
    threads: int | None = None  # torch intra-op threads; None keeps torch's default
    device: str | None = None  # None: CUDA when available, else CPU
    tokenizer: str = "bpe"  # "bpe" (trained at start-up) or "byte"
    vocab_size: int = 4096
    warmup: bool = True  # one tiny request at start-up, so the first user does not pay for it
    lazy_load: bool = (
        False  # load the weights on the first request (fast start, cold first request)
    )
    # tracing (tokentrace SDK); no endpoint: the server runs untraced
    otlp_endpoint: str | None = None  # e.g. http://127.0.0.1:4318
    service_name: str | None = None  # default: model_name
    environment: str | None = None  # deployment.environment.name, e.g. production / staging
    instance_id: str = dataclasses.field(default_factory=lambda: uuid.uuid4().hex[:12])

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.tokenizer not in ("bpe", "byte"):
            raise ValueError(f"tokenizer must be 'bpe' or 'byte', got {self.tokenizer!r}")

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> ServerConfig:
        """Return a config from explicit overrides, then TINY_LLM_* variables, then defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in overrides and overrides[f.name] is not None:
                values[f.name] = overrides[f.name]
                continue
            raw = env.get(ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(raw, f.default, f.name)
        unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown config fields: {sorted(unknown)}")
        return cls(**values)


def _parse(raw: str, default: Any, name: str) -> Any:
    if raw.lower() in ("", "none") and (
        default is None
        or name in ("prefill_chunk_size", "threads", "otlp_endpoint", "service_name", "environment")
    ):
        return None
    if isinstance(default, bool):
        return raw.lower() in ("1", "true", "yes", "on")
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, int) or name in ("prefill_chunk_size", "threads", "kv_slots"):
        return int(raw)
    return raw
