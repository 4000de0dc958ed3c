"""HuggingFace `transformers` integration: token times from `generate`.

A logits processor is appended to each `generate` call: transformers calls it
once per generation step, right after the forward pass that produced the step's
logits, so each call is one output token's time (for every sequence of the
batch at once; unlike a streamer it works for any batch size).  The time up to
the first call is the prefill; the rest is decode.  `transformers` is imported
only by `instrument_transformers_generate()`.

`generate` in a thread of its own (`TextIteratorStreamer`'s usual
`Thread(target=model.generate, kwargs={..., "streamer": streamer})`) has no
current request there: the request current where the streamer was made (the
handler's) is remembered on the streamer, and that `generate` records into it.

Assisted generation (`assistant_model=`, `prompt_lookup_num_tokens=`, ...) is
different: transformers calls the logits processors once per *candidate*
token, accepted or not, and hands them to the assistant's own `generate` too,
so a processor would count drafts.  There a stopping criterion does it
instead: it runs once per step, after the step's accepted tokens were appended,
and records them (they come out together).
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any

import wrapt

from tokentrace.instrumentation._request import RequestTrace, current_request, request
from tokentrace.instrumentation._safety import log_once

_instrumented = False
#: the request current where each streamer was made (HF's `TextStreamer` and its
#: subclasses): a `generate` in a bare thread records into it
_streamer_requests: weakref.WeakKeyDictionary[Any, RequestTrace] = weakref.WeakKeyDictionary()
#: Position of `logits_processor` in `GenerationMixin.generate(inputs, generation_config, logits_processor, ...)`.
_LOGITS_PROCESSOR_POS = 2
#: Set while an instrumented `generate` runs: a `generate` inside it (an assistant
#: model's, drafting candidates) is part of the outer call, not a call of its own.
_in_generate: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "tokentrace_generate", default=False
)
#: `generate` arguments / generation config fields that make it assisted (candidate-based).
_ASSISTED_FIELDS = ("prompt_lookup_num_tokens", "assistant_early_exit", "use_mtp")


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


class AcceptedTokensCriteria:
    """Assisted generation: a stopping criterion that never stops; each step it records
    the tokens the step appended (as many as the target model accepted)."""

    def __init__(self, req: RequestTrace, prompt_len: int | None) -> None:
        import torch

        self.req = req
        self.steps = 0
        #: sequence length already counted: the prompt's, None when unknown
        self.seen = prompt_len
        self._torch = torch
        self._never: Any = None  # the all-False answer, made once per batch shape and device

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        try:
            length = int(input_ids.shape[-1])
            new = 1 if self.seen is None else length - self.seen
            self.seen = length
            req = self.req
            if self.steps == 0:
                req.end_phase("prefill")
                req.start_phase("decode")
            self.steps += 1
            if new > 0:
                req.token(new)
        except Exception as exc:  # the SDK's own failure must never reach the host
            log_once("transformers assisted token count", exc)
        never = self._never
        if (
            never is None
            or never.shape[0] != input_ids.shape[0]
            or never.device != input_ids.device
        ):
            never = self._never = self._torch.zeros(
                input_ids.shape[0], dtype=self._torch.bool, device=input_ids.device
            )
        return never


def _assisted(instance: Any, args: Any, kwargs: Any) -> bool:
    """Whether this `generate` call drafts candidates (transformers' `get_generation_mode`)."""
    if kwargs.get("assistant_model") is not None:
        return True
    config = kwargs.get("generation_config") or (args[1] if len(args) > 1 else None)
    if config is None:
        config = getattr(instance, "generation_config", None)
    for field in _ASSISTED_FIELDS:
        value = kwargs[field] if field in kwargs else getattr(config, field, None)
        if value is not None and value is not False:
            return True
    return False


def _prompt_len(instance: Any, args: Any, kwargs: Any) -> int | None:
    """The length of the ids the first step extends (decoder-only models); None when unknown."""
    if getattr(getattr(instance, "config", None), "is_encoder_decoder", False):
        return None
    inputs = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    shape = getattr(inputs, "shape", None)
    return int(shape[-1]) if shape else None


def _generate(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    if len(args) > _LOGITS_PROCESSOR_POS or _in_generate.get():
        # logits_processor given positionally, or an assistant's generate inside ours
        return wrapped(*args, **kwargs)
    own: RequestTrace | None = None
    counter: TokenTimesProcessor | AcceptedTokensCriteria
    try:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        req = current_request() or _streamer_request(kwargs.get("streamer"))
        if req is None:
            config = getattr(instance, "config", None)
            own = req = request(model=getattr(config, "name_or_path", None) or None)
        if _assisted(instance, args, kwargs):
            counter = AcceptedTokensCriteria(req, _prompt_len(instance, args, kwargs))
            kwargs["stopping_criteria"] = StoppingCriteriaList(
                [*(kwargs.get("stopping_criteria") or []), counter]
            )
        else:
            counter = TokenTimesProcessor(req)
            kwargs["logits_processor"] = LogitsProcessorList(
                [*(kwargs.get("logits_processor") or []), counter]
            )
        req.start_phase("prefill")
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("transformers generate instrumentation", exc)
        if own is not None:
            own.finish()
        return wrapped(*args, **kwargs)
    error: BaseException | None = None
    token = _in_generate.set(True)
    try:
        return wrapped(*args, **kwargs)
    except BaseException as exc:
        error = exc
        raise  # unchanged
    finally:
        _in_generate.reset(token)
        # end the phase that is open: ending the other one would log a misuse
        # ("end_phase without start_phase") into the host's log
        req.end_phase("decode" if counter.steps else "prefill")
        if own is not None:
            own.finish(error)


def _streamer_made(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    result = wrapped(*args, **kwargs)
    try:
        req = current_request()
        if req is not None:
            _streamer_requests[instance] = req
    except Exception as exc:  # the SDK's own failure must never reach the host
        log_once("transformers streamer", exc)
    return result


def _streamer_request(streamer: Any) -> RequestTrace | None:
    """The request current where `streamer` was made, while it is still open."""
    if streamer is None:
        return None
    try:
        req = _streamer_requests.get(streamer)
    except TypeError:  # an unhashable streamer of the user's
        return None
    return req if req is not None and not req.finished else None


def instrument_transformers_generate() -> None:
    """Records token times of every `generate` call (raises ImportError without transformers)."""
    global _instrumented
    from transformers.generation.streamers import TextStreamer
    from transformers.generation.utils import GenerationMixin

    if _instrumented:
        return
    wrapt.wrap_function_wrapper(GenerationMixin, "generate", _generate)
    wrapt.wrap_function_wrapper(TextStreamer, "__init__", _streamer_made)
    _instrumented = True


def uninstrument_transformers_generate() -> None:
    """Undoes `instrument_transformers_generate`."""
    global _instrumented
    if not _instrumented:
        return
    from transformers.generation.streamers import TextStreamer
    from transformers.generation.utils import GenerationMixin

    from tokentrace.instrumentation._httpx import remove_wrapper

    remove_wrapper(GenerationMixin, "generate", _generate)  # ours only, not a layer above it
    remove_wrapper(TextStreamer, "__init__", _streamer_made)
    _instrumented = False
