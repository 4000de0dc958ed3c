"""How the tiny server is traced: only the public tokentrace SDK, as a user would do it.

Everything tokentrace-specific in the server is in this file; the server calls
`setup_tracing` once at start-up and `RequestTracing` per request. With no OTLP
endpoint configured nothing here runs and the server serves untraced.

What each request gets (docs/design.md §2):
- a request span continuing the client's `traceparent` (`tt.request(headers=...)`),
  with tenant, traffic class, model and request id;
- `tokenize` / `detokenize` phases from the tokenizer wrapped by `tt.wrap_tokenizer`;
- a `queue` phase from submit to admission into the running batch, a
  `prefill` phase from admission to the first token and a `decode` phase from
  the first token to the end (marked on the scheduler thread, at the moment
  they happen);
- `req.token()` at every token the model emits (an append);
- errors recorded on the span.
Each scheduler step is a `tt.engine_step` (prefill tokens and decodes per
request), and the model's prefill/decode calls are timed by `tt.instrument_model`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from tokentrace import instrumentation as tt

from .config import ServerConfig
from .engine import TinyLLMEngine
from .scheduler import StepPlan, TokenEvent

ENVIRONMENT_ATTRIBUTE = "deployment.environment.name"


def setup_tracing(config: ServerConfig, engine: TinyLLMEngine) -> bool:
    """Configure the SDK and instrument the engine when `config.otlp_endpoint` is set; gives whether it did."""
    if not config.otlp_endpoint:
        return False
    resource: dict[str, Any] = {"service.instance.id": config.instance_id}
    if config.environment:
        resource[ENVIRONMENT_ATTRIBUTE] = config.environment
    tt.configure(
        endpoint=config.otlp_endpoint,
        service_name=config.service_name or config.model_name,
        resource_attributes=resource,
    )
    model = engine.model
    # The scheduler calls prefill/decode, not forward: time those two callables.
    model.prefill = tt.instrument_model(model.prefill, "prefill")  # type: ignore[method-assign]
    model.decode = tt.instrument_model(model.decode, "decode")  # type: ignore[method-assign]
    scheduler = engine.scheduler

    @contextmanager
    def traced_step(plan: StepPlan, queue_depth: int) -> Iterator[object]:
        with tt.engine_step(queue_depth=queue_depth, kv_usage=scheduler.cache.usage()) as step:
            for chunk in plan.prefill:
                step.prefill(chunk.sequence.request_id, chunk.end - chunk.start)
            step.decode_many(seq.request_id for seq in plan.decode)
            yield step

    scheduler.set_step_context(traced_step)
    return True


def shutdown_tracing() -> None:
    """Flush what is buffered (spans, engine steps) before the process ends."""
    tt.shutdown()


class RequestTracing:
    """One request's tracing: the span and the hooks the handler and scheduler call."""

    def __init__(
        self,
        engine: TinyLLMEngine,
        headers: Mapping[str, str],
        *,
        request_id: str,
        model: str,
        tenant: str | None,
        traffic_class: str,
    ) -> None:
        self.req = tt.request(
            request_id=request_id,
            model=model,
            tenant=tenant,
            traffic_class=traffic_class,
            headers=dict(headers),
        )
        # A per-request proxy: its encode/decode calls are this request's phases.
        self.tokenizer = tt.wrap_tokenizer(engine.tokenizer, request=self.req)
        self._first_token = True

    def submitted(self) -> None:
        """The request joins the scheduler's queue."""
        self.req.start_phase("queue")

    def admitted(self, _when: float) -> None:
        """Scheduler thread: the request leaves the queue and its prefill starts."""
        self.req.end_phase("queue")
        self.req.start_phase("prefill")

    def on_token(self, event: TokenEvent) -> None:
        """Scheduler thread: a token was sampled (hot path: appends only)."""
        if event.token_id is None:
            return
        if self._first_token:
            self._first_token = False
            self.req.end_phase("prefill")
            self.req.start_phase("decode")
        self.req.token()

    def finish(
        self, prompt_tokens: int | None, output_tokens: int, error: BaseException | None = None
    ) -> None:
        self.req.set_tokens(prompt=prompt_tokens, output=output_tokens)
        self.req.end_phase("decode")  # none started (no token): nothing to end
        self.req.finish(error)
