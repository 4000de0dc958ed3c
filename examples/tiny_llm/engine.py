"""The serving engine: tokenizer + model + scheduler, bridged to asyncio.

The HTTP layer calls, in order: `tokenize` → `generate` (queue_wait, prefill and
decode happen on the scheduler thread; tokens come back through an asyncio
queue) → `IncrementalDetokenizer.push` per token.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import AsyncGenerator, Callable, Sequence

import torch

from .config import ServerConfig
from .model import ModelConfig, build_model
from .scheduler import (
    INTERACTIVE,
    GenerationRequest,
    Scheduler,
    SchedulerConfig,
    StepHook,
    TokenEvent,
)
from .tokenizer import TextTokenizer, build_tokenizer

logger = logging.getLogger(__name__)


class IncrementalDetokenizer:
    """Turns a token stream into text pieces without splitting multi-byte characters."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0  # characters of the decoded text already handed out

    def push(self, token_id: int) -> str:
        """Return the new text this token completes ('' while a character is still partial)."""
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self._emitted :]
        self._emitted = len(text)
        return piece

    def text(self, token_ids: Sequence[int]) -> str:
        """Return the text of a whole token sequence (one detokenize call)."""
        return self._tokenizer.decode(list(token_ids))


class TinyLLMEngine:
    """Owns the tokenizer, the model and the scheduler thread."""

    def __init__(self, config: ServerConfig | None = None) -> None:
        self.config = config or ServerConfig()
        cfg = self.config
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        started = time.perf_counter()
        self.tokenizer = build_tokenizer(cfg.tokenizer, vocab_size=cfg.vocab_size)
        self.model_config = ModelConfig(
            vocab_size=self.tokenizer.vocab_size,
            d_model=cfg.d_model,
            n_layers=cfg.n_layers,
            n_heads=cfg.n_heads,
            d_ff=cfg.d_ff,
            max_seq_len=cfg.max_seq_len,
            seed=cfg.seed,
        )
        self.model = build_model(self.model_config, cfg.device, load_weights=not cfg.lazy_load)
        self.scheduler = Scheduler(
            self.model,
            SchedulerConfig(
                max_batch_size=cfg.max_batch_size,
                max_tokens_per_step=cfg.max_tokens_per_step,
                prefill_chunk_size=cfg.prefill_chunk_size,
                batch_delay_ms=cfg.batch_delay_ms,
                prefill_interrupts_decode=cfg.prefill_interrupts_decode,
                shortest_prompt_first=cfg.shortest_prompt_first,
            ),
            kv_slots=cfg.kv_slots,
            eos_id=self.tokenizer.eos_id,
            suppressed_ids=self._unprintable_ids(),
            on_first_step=self._cold_start if cfg.lazy_load else None,
        )
        self.build_seconds = time.perf_counter() - started
        self._started = False

    def _cold_start(self) -> None:
        """What a lazily started engine does before its first step: load the weights,
        then a profiling pass of one step's most tokens (vLLM sizes its KV cache with
        one; CUDA-graph capture is the like): seconds on a real server, where a warm
        request's first token takes tens of milliseconds."""
        self.model.load_weights()
        length = min(self.config.max_tokens_per_step, self.model_config.max_seq_len)
        with torch.inference_mode():
            self.model.forward_full(
                torch.zeros((1, length), dtype=torch.long, device=self.scheduler.device)
            )

    def _unprintable_ids(self) -> list[int]:
        """Return ids that decode to nothing readable on their own (lone bytes, end-of-text)."""
        # Random weights would stop at a random end-of-text, so it is never sampled either.
        ids = {
            i for i in range(self.tokenizer.vocab_size) if "\ufffd" in self.tokenizer.decode([i])
        }
        return sorted(ids | {self.tokenizer.eos_id})

    @property
    def device(self) -> torch.device:
        return self.scheduler.device

    def start(self) -> None:
        """Start the scheduler thread (idempotent), then warm up if configured."""
        if self._started:
            return
        self.scheduler.start()
        self._started = True
        if self.config.warmup:
            self._warmup()

    def stop(self) -> None:
        if self._started:
            self.scheduler.stop()
            self._started = False

    def add_step_hook(self, hook: StepHook) -> None:
        self.scheduler.add_step_hook(hook)

    def tokenize(self, prompt: str) -> list[int]:
        """Return the prompt's token ids."""
        return self.tokenizer.encode(prompt)

    def detokenize(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(token_ids)

    def detokenizer(self, tokenizer: TextTokenizer | None = None) -> IncrementalDetokenizer:
        """Return a per-request detokenizer (over `tokenizer`, e.g. a traced proxy, if given)."""
        return IncrementalDetokenizer(tokenizer or self.tokenizer)

    def max_tokens_for(self, prompt_len: int, requested: int) -> int:
        """Return `requested` clipped to what fits in the context window; ValueError if nothing fits."""
        room = self.model_config.max_seq_len - prompt_len
        if room < 1:
            raise ValueError(
                f"prompt of {prompt_len} tokens leaves no room in the {self.model_config.max_seq_len}-token context"
            )
        return min(requested, room)

    def generate(
        self,
        prompt_ids: list[int],
        *,
        max_tokens: int,
        request_id: str | None = None,
        traffic_class: str = INTERACTIVE,
        tenant: str = "default",
        temperature: float = 0.0,
        seed: int | None = None,
        on_admitted: Callable[[float], None] | None = None,
        on_token: Callable[[TokenEvent], None] | None = None,
    ) -> AsyncGenerator[TokenEvent, None]:
        """Submit the request now and return its token events; the last carries `finish_reason`.

        Call it on the event loop. Submission is eager, so a refusal (ValueError,
        RuntimeError when stopped) raises here, before any response is started.
        Closing the returned iterator early (client gone, task cancelled)
        cancels the request in the scheduler, which frees its KV slot.
        `on_admitted(time)` and `on_token(event)` run on the scheduler thread,
        at the moment it happens (tracing hooks); they must be quick.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[TokenEvent] = asyncio.Queue()

        def sink(event: TokenEvent) -> None:
            # Scheduler thread: one hop onto the loop, nothing else.
            if on_token is not None:
                try:
                    on_token(event)
                except Exception:
                    logger.exception("on_token callback failed")
            loop.call_soon_threadsafe(events.put_nowait, event)

        request = GenerationRequest(
            request_id=request_id or uuid.uuid4().hex,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            sink=sink,
            traffic_class=traffic_class,
            tenant=tenant,
            temperature=temperature,
            seed=seed,
            on_admitted=on_admitted,
        )
        self.scheduler.submit(request)
        return self._events(request.request_id, events)

    async def _events(
        self, request_id: str, events: asyncio.Queue[TokenEvent]
    ) -> AsyncGenerator[TokenEvent, None]:
        finished = False
        try:
            while not finished:
                event = await events.get()
                finished = event.finish_reason is not None
                yield event
        finally:
            if not finished:
                self.scheduler.cancel(request_id)

    def _warmup(self) -> None:
        finished = threading.Event()
        request = GenerationRequest(
            request_id="warmup",
            prompt_ids=self.tokenize("Warm up the model.") or [0],
            max_tokens=2,
            sink=lambda ev: finished.set() if ev.finish_reason else None,
        )
        self.scheduler.submit(request)
        if not finished.wait(60):
            logger.warning("warm-up request did not finish within 60 s")
