"""The engine scenarios: what each recording holds, which client instrumentation sends it,
and against which server.  Standard library only: the client driver (engine venv) and the
tests (the project's venv) both import it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: the name vLLM serves the tiny model under (`--served-model-name`)
SERVED_MODEL = "tiny-llama"
#: vLLM's flags beside the model: one step prefills a whole long prompt (the stutter)
VLLM_ARGS = ("--max-model-len", "2048", "--max-num-batched-tokens", "2048")

OPENLLMETRY = "openllmetry"  # opentelemetry-instrumentation-openai (Traceloop)
OPENINFERENCE = "openinference"  # openinference-instrumentation-openai (Arize)
OPENAI_V2 = "openai-v2"  # opentelemetry-instrumentation-openai-v2 (OpenTelemetry's own)
INSTRUMENTATIONS = (OPENLLMETRY, OPENINFERENCE, OPENAI_V2)

VLLM = "vllm"
TINY_LLM = "tiny_llm"  # the project's example server (examples/tiny_llm)


@dataclass(frozen=True)
class Scenario:
    name: str
    instrumentation: str | None  # None: no client runs (vLLM's start-up trace)
    server: str
    what: str


SCENARIOS = (
    Scenario(
        "vllm_startup", None, VLLM,
        "vLLM's own start-up trace (weights loading, KV cache), exported at every start",
    ),
    Scenario(
        "chat_openllmetry", OPENLLMETRY, VLLM,
        "healthy chat streams, three at a time; one chunk event per chunk on the client span",
    ),
    Scenario(
        "chat_openinference", OPENINFERENCE, VLLM,
        "healthy chat streams; the client span is INTERNAL with a 'First Token Stream Event'",
    ),
    Scenario(
        "chat_openai_v2", OPENAI_V2, VLLM,
        "healthy chat streams; the client span carries no first-token time at all",
    ),
    Scenario(
        "stutter", OPENLLMETRY, VLLM,
        "chat streams while long prompts (~1,500 tokens) are each prefilled whole in one step",
    ),
    Scenario(
        "tenants", OPENLLMETRY, VLLM,
        "tenant.id on an application span (handle_request) that wraps the call; a big "
        "tenant's burst of long prompts beside two small tenants' chats",
    ),
    Scenario(
        "batch_events", OPENLLMETRY, VLLM,
        "a batch job's long streams (over the SDK's 128 events a span, oldest dropped) beside "
        "live chats; the traffic class on the wrapping application span",
    ),
    Scenario(
        "client_errors", OPENLLMETRY, VLLM,
        "streams the client aborts, a 400 (max_tokens past the context) and a 404 (unknown "
        "model): no vLLM span for any of them; two good requests beside",
    ),
    Scenario(
        "fanout", OPENLLMETRY, VLLM,
        "a chat stream with n=2 and one completion call with 3 prompts",
    ),
    Scenario(
        "tiny_llm_openinference", OPENINFERENCE, TINY_LLM,
        "the project's example server (tokentrace SDK) under OpenInference's completion streams",
    ),
)  # fmt: skip

BY_NAME = {s.name: s for s in SCENARIOS}
