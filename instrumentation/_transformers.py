"""HuggingFace `transformers` integration: token times from `generate`.

A logits processor is appended to each `generate` call: transformers calls it
once per generation step, right after the forward pass that produced the step's
logits, so each call is one output token's time (for every sequence of the
batch at once; unlike a streamer it works for any batch size).  The time up to
the first call is the prefill; the rest is decode.  `transformers` is imported
only by `instrument_transformers_generate()`.
"""

from __future__ import annotations

from typing import Any

import wrapt

from tokentrace.instrumentation._request import RequestTrace, current_request, request
from tokentrace.instrumentation._safety import log_once

_instrumented = False
#: Position of `logits_processor` in `GenerationMixin.generate(inputs, generation_config, logits_processor, ...)`.
_LOGITS_PROCESSOR_POS = 2


class TokenTimesProcessor:
    """A logits processor that records one token per generation step; scores pass through."""

    def __init__(self, req: RequestTrace) -> None:
        self.req = req
        self.steps = 0

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        req = self.req
        if self.steps == 0:
            req.end_phase("prefill")
            req.start_phase("decode")
        self.steps += 1
        req.token()
        return scores


def _generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    if len(args) > _LOGITS_PROCESSOR_POS:
        return wrapped(*args, **kwargs)  # logits_processor given positionally: leave the call alone
    own: RequestTrace | None = None
    try:
        from transformers import LogitsProcessorList

        req = current_request()
        if req is None:
            config = getattr(instance, "config", None)
            own = req = request(model=getattr(config, "name_or_path", None) or None)
        processor = TokenTimesProcessor(req)
        kwargs["logits_processor"] = LogitsProcessorList(
            [*(kwargs.get("logits_processor") or []), processor]
        )
        req.start_phase("prefill")
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("transformers generate instrumentation", exc)
        return wrapped(*args, **kwargs)
    error: BaseException | None = None
    try:
        return wrapped(*args, **kwargs)
    except BaseException as exc:
        error = exc
        raise
    finally:
        req.end_phase("decode")
        req.end_phase("prefill")  # no token came out: the whole call was prefill
        if own is not None:
            own.finish(error)


def instrument_transformers_generate() -> None:
    """Records token times of every `generate` call (raises ImportError without transformers)."""
    global _instrumented
    from transformers.generation.utils import GenerationMixin

    if _instrumented:
        return
    wrapt.wrap_function_wrapper(GenerationMixin, "generate", _generate)
    _instrumented = True


def uninstrument_transformers_generate() -> None:
    """Undoes `instrument_transformers_generate`."""
    global _instrumented
    if not _instrumented:
        return
    from transformers.generation.utils import GenerationMixin

    current = GenerationMixin.__dict__.get("generate")
    if isinstance(current, wrapt.FunctionWrapper):
        setattr(GenerationMixin, "generate", current.__wrapped__)  # noqa: B010 - restoring the method
    _instrumented = False
