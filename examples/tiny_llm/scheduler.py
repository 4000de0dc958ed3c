"""Continuous-batching scheduler: runs the model on its own thread, one step at a time.

Each step, in this order (the hook points an instrumentation layer wraps):
  `_admit`        waiting requests leave the queue (queue_wait ends) and get a KV slot;
  `_schedule`     builds a `StepPlan`: which sequences prefill how many prompt
                  tokens and which decode one token;
  `_forward`      runs the model for the plan (prefill chunks, then one batched decode);
  `_emit_token`   hands each new token to its request's sink;
  step hooks      get a `StepStats` record of the step.

Latency here comes only from real work and from the configured policy
(batch-assembly delay, priorities, prefill admission); nothing sleeps to fake it.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import zlib
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field

import torch

from .model import KVCache, TinyTransformer

logger = logging.getLogger(__name__)

INTERACTIVE = "interactive"
BATCH = "batch"
# Lower sorts first: interactive requests are admitted before batch ones.
TRAFFIC_CLASS_PRIORITY = {INTERACTIVE: 0, BATCH: 1}

FINISH_LENGTH = "length"
FINISH_STOP = "stop"
FINISH_CANCELLED = "cancelled"
FINISH_ERROR = "error"


@dataclass(frozen=True)
class SchedulerConfig:
    """Batching policy. Validated at construction; see the module docstring for the step order."""

    max_batch_size: int = 8
    # Token budget per step: each decoding sequence costs 1, prefill costs its chunk.
    max_tokens_per_step: int = 512
    # None: a prompt is prefilled in one step. N: at most N prompt tokens per sequence per step.
    prefill_chunk_size: int | None = None
    # A waiting request is held up to this long so more can join its batch (0: no wait).
    batch_delay_ms: float = 0.0
    # True (vLLM-like): new prefills join the same step as running decodes, which
    # stall for the prefill compute (stutter). False: no new prefill is admitted
    # while any sequence decodes; decodes stream smoothly, queue_wait grows instead.
    prefill_interrupts_decode: bool = True
    # Within a traffic class, admit the shortest prompt first instead of the oldest request
    # (throughput-friendly; long prompts can wait behind a stream of short ones).
    shortest_prompt_first: bool = False
    # Stop at the tokenizer's end-of-text id. Off by default: random weights would stop at random.
    stop_at_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_tokens_per_step < 1:
            raise ValueError(f"max_tokens_per_step must be >= 1, got {self.max_tokens_per_step}")
        if self.prefill_chunk_size is not None and self.prefill_chunk_size < 1:
            raise ValueError(
                f"prefill_chunk_size must be >= 1 or None, got {self.prefill_chunk_size}"
            )
        if self.batch_delay_ms < 0:
            raise ValueError(f"batch_delay_ms must be >= 0, got {self.batch_delay_ms}")


@dataclass(frozen=True)
class TokenEvent:
    """One message to a request's sink: a new token, or the end of the stream."""

    request_id: str
    token_id: int | None
    index: int  # 0 for the first output token
    time: float  # perf_counter() on the scheduler thread when the token was sampled
    finish_reason: str | None = None  # set on the last event of a request
    error: str | None = None


TokenSink = Callable[[TokenEvent], None]


@dataclass
class GenerationRequest:
    """What a caller submits: prompt token ids plus how to serve them."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    sink: TokenSink
    traffic_class: str = INTERACTIVE
    tenant: str = "default"
    temperature: float = 0.0
    seed: int | None = None
    arrival_time: float = field(default_factory=time.perf_counter)
    # Called on the scheduler thread with the admission time (queue_wait ends); must be quick.
    on_admitted: Callable[[float], None] | None = None

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError("prompt_ids must not be empty")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.traffic_class not in TRAFFIC_CLASS_PRIORITY:
            raise ValueError(
                f"traffic_class must be one of {sorted(TRAFFIC_CLASS_PRIORITY)}, got {self.traffic_class!r}"
            )


@dataclass
class Sequence:
    """A request's serving state; owned by the scheduler thread."""

    request: GenerationRequest
    slot: int = -1
    prefilled: int = 0  # prompt tokens already in the KV cache
    output_ids: list[int] = field(default_factory=list)
    admitted_at: float | None = None
    first_token_at: float | None = None
    generator: torch.Generator | None = None

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def prompt_len(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def is_prefilling(self) -> bool:
        return self.prefilled < self.prompt_len


@dataclass(frozen=True)
class PrefillChunk:
    sequence: Sequence
    start: int  # prompt offset of the chunk
    end: int

    @property
    def completes_prompt(self) -> bool:
        return self.end == self.sequence.prompt_len


@dataclass(frozen=True)
class StepPlan:
    """What one step computes: prompt chunks to prefill and sequences to decode."""

    prefill: tuple[PrefillChunk, ...]
    decode: tuple[Sequence, ...]

    @property
    def is_empty(self) -> bool:
        return not self.prefill and not self.decode

    @property
    def prefill_tokens(self) -> int:
        return sum(c.end - c.start for c in self.prefill)


@dataclass(frozen=True)
class StepStats:
    """What a step hook receives after each step."""

    step_index: int
    start: float  # perf_counter() seconds
    end: float
    prefill_tokens: int
    decode_seqs: int
    batch_size: int  # sequences served in the step (prefilling + decoding)
    queue_depth: int  # requests still waiting after admission
    kv_usage: float  # fraction of KV-cache positions in use, 0..1
    request_ids: tuple[str, ...]
    prefill_request_ids: tuple[str, ...]
    decode_request_ids: tuple[str, ...]
    error: str | None = None


StepHook = Callable[[StepStats], None]
#: Wraps the model work of one step (e.g. a tracing span around it): called on the
#: scheduler thread with the step's plan and the queue depth after admission.
StepContext = Callable[["StepPlan", int], AbstractContextManager[object]]


class Scheduler:
    """Continuous batching over a `TinyTransformer` on one daemon thread.

    `submit` and `cancel` are thread-safe and cheap: they append to an inbox and
    wake the thread. Everything else runs on the scheduler thread.
    """

    def __init__(
        self,
        model: TinyTransformer,
        config: SchedulerConfig | None = None,
        *,
        kv_slots: int | None = None,
        eos_id: int | None = None,
        suppressed_ids: list[int] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        on_first_step: Callable[[], None] | None = None,
    ) -> None:
        self.model = model
        # Lazy initialization (e.g. loading weights on first use): run before the first step.
        self._on_first_step = on_first_step
        self.config = config or SchedulerConfig()
        self.device = next(model.parameters()).device
        slots = kv_slots if kv_slots is not None else self.config.max_batch_size
        if slots < self.config.max_batch_size:
            raise ValueError(f"kv_slots {slots} < max_batch_size {self.config.max_batch_size}")
        self.cache = KVCache(model.config, slots, device=self.device)
        self.eos_id = eos_id
        # Token ids never sampled (e.g. lone UTF-8 bytes that would render as U+FFFD).
        self._logit_bias: torch.Tensor | None = None
        if suppressed_ids:
            bias = torch.zeros(model.config.vocab_size, device=self.device)
            bias[torch.tensor(suppressed_ids, device=self.device)] = float("-inf")
            self._logit_bias = bias
        self.clock = clock
        self.step_index = 0
        self._step_hooks: list[StepHook] = []
        self._step_context: StepContext | None = None
        self._waiting: list[
            tuple[int, int, Sequence]
        ] = []  # heap of (priority, arrival order, seq)
        self._running: list[Sequence] = []
        self._arrival_counter = itertools.count()
        self._inbox: list[GenerationRequest] = []
        self._cancels: set[str] = set()
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None

    # ---- public, thread-safe -------------------------------------------------

    def add_step_hook(self, hook: StepHook) -> None:
        """Call `hook(StepStats)` on the scheduler thread after every step; it must be quick."""
        self._step_hooks.append(hook)

    def set_step_context(self, factory: StepContext | None) -> None:
        """Run each step's model work inside `factory(plan, queue_depth)` (None: nothing)."""
        self._step_context = factory

    def submit(self, request: GenerationRequest) -> None:
        """Queue a request; tokens arrive through `request.sink` from the scheduler thread."""
        limit = self.model.config.max_seq_len
        if len(request.prompt_ids) + request.max_tokens > limit:
            raise ValueError(
                f"prompt ({len(request.prompt_ids)}) + max_tokens ({request.max_tokens}) exceeds {limit} tokens"
            )
        with self._wake:
            if self._stopping:
                raise RuntimeError("scheduler is stopped")
            self._inbox.append(request)
            self._wake.notify()

    def cancel(self, request_id: str) -> None:
        """Drop a request (client went away): its KV slot is freed before the next step."""
        with self._wake:
            self._cancels.add(request_id)
            self._wake.notify()

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="tiny-llm-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread; requests still queued or running get a `cancelled` end event."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def queue_depth(self) -> int:
        return len(self._waiting) + len(self._inbox)

    @property
    def running(self) -> int:
        return len(self._running)

    # ---- scheduler thread ------------------------------------------------------

    def _run(self) -> None:
        with torch.inference_mode():
            while True:
                with self._wake:
                    timeout = self._idle_timeout()
                    if (
                        not self._stopping
                        and not self._inbox
                        and not self._cancels
                        and timeout != 0.0
                    ):
                        self._wake.wait(timeout)
                    if self._stopping:
                        break
                    inbox, self._inbox = self._inbox, []
                    cancels, self._cancels = self._cancels, set()
                for request in inbox:
                    self._enqueue(request)
                for request_id in cancels:
                    self._drop(request_id, FINISH_CANCELLED)
                try:
                    self.step()
                except Exception:  # never let one bad step kill the serving thread
                    logger.exception("scheduler step failed")
        self._shutdown()

    def _idle_timeout(self) -> float | None:
        """Return how long the thread may sleep: 0 with work to do, None for 'until woken'."""
        if self._running:  # every running sequence has a prefill chunk or a decode to do
            return 0.0
        if not self._waiting:
            return None
        ready_at = self._admit_ready_at()
        return max(0.0, ready_at - self.clock())

    def _admit_ready_at(self) -> float:
        """Return when the oldest waiting request may be admitted under the batch delay."""
        if self.config.batch_delay_ms <= 0 or len(self._waiting) >= self._free_batch_slots():
            return float("-inf")  # admissible now: no delay, or enough waiting to fill the batch
        oldest = min(entry[2].request.arrival_time for entry in self._waiting)
        return oldest + self.config.batch_delay_ms / 1000.0

    def _free_batch_slots(self) -> int:
        return min(self.config.max_batch_size - len(self._running), self.cache.free_slots)

    def _enqueue(self, request: GenerationRequest) -> None:
        seq = Sequence(request=request)
        if request.temperature > 0:
            seed = (
                request.seed
                if request.seed is not None
                else zlib.crc32(request.request_id.encode())
            )
            seq.generator = torch.Generator(device=self.device).manual_seed(seed)
        priority = TRAFFIC_CLASS_PRIORITY[request.traffic_class] * 1_000_000
        if self.config.shortest_prompt_first:
            priority += len(request.prompt_ids)
        heapq.heappush(self._waiting, (priority, next(self._arrival_counter), seq))

    def step(self) -> StepStats | None:
        """Run one scheduling step; return its stats, or None when there was nothing to do."""
        start = self.clock()
        self._admit(start)
        plan = self._schedule()
        if plan.is_empty:
            return None
        error: str | None = None
        if self._on_first_step is not None:
            prepare, self._on_first_step = self._on_first_step, None
            prepare()  # inside the step: its time is the first requests' cold start
        factory = self._step_context
        context = nullcontext() if factory is None else factory(plan, len(self._waiting))
        try:
            with context:
                self._forward(plan)
        except Exception as exc:  # fail this step's requests, keep the thread serving
            logger.exception("forward failed; failing the step's requests")
            error = f"{type(exc).__name__}: {exc}"
            failed = {c.sequence.request_id: c.sequence for c in plan.prefill}
            failed.update((s.request_id, s) for s in plan.decode)
            for seq in failed.values():
                if seq in self._running:  # not already finished within the step
                    self._finish(seq, FINISH_ERROR, error=error)
        end = self.clock()
        stats = self._step_stats(plan, start, end, error)
        self.step_index += 1
        for hook in self._step_hooks:
            try:
                hook(stats)
            except Exception:
                logger.exception("step hook failed")
        return stats

    def _admit(self, now: float) -> list[Sequence]:
        """Move waiting requests into the running batch (their queue_wait ends here)."""
        if not self._waiting or self._free_batch_slots() <= 0:
            return []
        decoding = any(not s.is_prefilling for s in self._running)
        if decoding and not self.config.prefill_interrupts_decode:
            return []
        if self._admit_ready_at() > now:
            return []
        admitted: list[Sequence] = []
        while self._waiting and self._free_batch_slots() > 0:
            _, _, seq = heapq.heappop(self._waiting)
            seq.slot = self.cache.allocate()
            seq.admitted_at = now
            self._running.append(seq)
            admitted.append(seq)
            if seq.request.on_admitted is not None:
                try:
                    seq.request.on_admitted(now)
                except Exception:
                    logger.exception("on_admitted callback for %s failed", seq.request_id)
        return admitted

    def _schedule(self) -> StepPlan:
        """Return this step's plan under the token budget: decodes first, then prefill chunks."""
        budget = self.config.max_tokens_per_step
        decode = tuple(s for s in self._running if not s.is_prefilling)
        budget -= len(decode)
        chunks: list[PrefillChunk] = []
        # Priority order again, so an interactive prompt is prefilled before a batch one.
        prefilling = sorted(
            (s for s in self._running if s.is_prefilling),
            key=lambda s: (TRAFFIC_CLASS_PRIORITY[s.request.traffic_class], s.admitted_at or 0.0),
        )
        chunk_size = self.config.prefill_chunk_size
        for seq in prefilling:
            remaining = seq.prompt_len - seq.prefilled
            size = remaining if chunk_size is None else min(remaining, chunk_size)
            if size > budget:
                if chunk_size is not None:
                    size = budget  # chunked: take what fits, the rest next step
                elif chunks:
                    break  # unchunked: wait for a step with room
                # else: a whole prompt bigger than the budget runs alone rather than never
            if size <= 0:
                break
            chunks.append(PrefillChunk(seq, seq.prefilled, seq.prefilled + size))
            budget -= size
        return StepPlan(prefill=tuple(chunks), decode=decode)

    def _forward(self, plan: StepPlan) -> None:
        """Run the model for `plan` and emit the sampled tokens.

        Prefill chunks run first, then one batched decode: in a mixed step the
        decoding sequences wait for the prefill compute, as in vLLM. Every token
        of the step is emitted at its end, as from one batched forward pass.
        """
        sampled: list[tuple[Sequence, int]] = []
        for chunk in plan.prefill:
            logits = self._forward_prefill(chunk)
            if chunk.completes_prompt:
                sampled.append(
                    (chunk.sequence, self._sample(chunk.sequence, logits.unsqueeze(0))[0])
                )
        if plan.decode:
            logits = self._forward_decode(plan.decode)
            tokens = self._sample_batch(plan.decode, logits)
            sampled.extend(zip(plan.decode, tokens, strict=True))
        now = self.clock()
        for seq, token in sampled:
            self._emit_token(seq, token, now)

    def _forward_prefill(self, chunk: PrefillChunk) -> torch.Tensor:
        """Return logits after feeding one prompt chunk into the sequence's cache slot."""
        seq = chunk.sequence
        ids = torch.tensor(seq.request.prompt_ids[chunk.start : chunk.end], device=self.device)
        logits = self.model.prefill(self.cache, seq.slot, ids)
        seq.prefilled = chunk.end
        return logits

    def _forward_decode(self, seqs: tuple[Sequence, ...]) -> torch.Tensor:
        """Return logits [batch, vocab] for one decode step of `seqs`."""
        ids = torch.tensor([s.output_ids[-1] for s in seqs], device=self.device)
        return self.model.decode(self.cache, [s.slot for s in seqs], ids)

    def _sample_batch(self, seqs: tuple[Sequence, ...], logits: torch.Tensor) -> list[int]:
        if self._logit_bias is not None:
            logits = logits + self._logit_bias
        if all(s.generator is None for s in seqs):
            return [int(t) for t in logits.argmax(dim=-1).tolist()]
        return [self._sample(seq, logits[i : i + 1])[0] for i, seq in enumerate(seqs)]

    def _sample(self, seq: Sequence, logits: torch.Tensor) -> list[int]:
        if self._logit_bias is not None:
            logits = logits + self._logit_bias
        if seq.generator is None:
            return [int(t) for t in logits.argmax(dim=-1).tolist()]
        probs = torch.softmax(logits / seq.request.temperature, dim=-1)
        return [
            int(t) for t in torch.multinomial(probs, 1, generator=seq.generator).flatten().tolist()
        ]

    def _emit_token(self, seq: Sequence, token_id: int, now: float) -> None:
        """Hand one output token to the request's sink; finish the request when it is done."""
        index = len(seq.output_ids)
        seq.output_ids.append(token_id)
        if seq.first_token_at is None:
            seq.first_token_at = now
        finish: str | None = None
        if self.config.stop_at_eos and self.eos_id is not None and token_id == self.eos_id:
            finish = FINISH_STOP
        elif len(seq.output_ids) >= seq.request.max_tokens:
            finish = FINISH_LENGTH
        if not self._deliver(seq, TokenEvent(seq.request_id, token_id, index, now, finish)):
            finish = FINISH_CANCELLED
        if finish is not None:
            self._release(seq)

    def _deliver(self, seq: Sequence, event: TokenEvent) -> bool:
        """Call the sink; a failing sink means nobody listens any more, so report False."""
        try:
            seq.request.sink(event)
            return True
        except Exception:
            logger.warning(
                "sink for %s failed; dropping the request", seq.request_id, exc_info=True
            )
            return False

    def _finish(self, seq: Sequence, reason: str, error: str | None = None) -> None:
        """End a request early (cancel, error, shutdown) with a final event, and free its slot."""
        event = TokenEvent(seq.request_id, None, len(seq.output_ids), self.clock(), reason, error)
        self._deliver(seq, event)
        self._release(seq)

    def _release(self, seq: Sequence) -> None:
        if seq in self._running:
            self._running.remove(seq)
        if seq.slot >= 0:
            self.cache.release(seq.slot)
            seq.slot = -1

    def _drop(self, request_id: str, reason: str) -> None:
        for seq in list(self._running):
            if seq.request_id == request_id:
                self._finish(seq, reason)
                return
        for i, (_, _, seq) in enumerate(self._waiting):
            if seq.request_id == request_id:
                self._waiting.pop(i)
                heapq.heapify(self._waiting)
                self._finish(seq, reason)
                return

    def _shutdown(self) -> None:
        with self._wake:
            inbox, self._inbox = self._inbox, []
        for request in inbox:
            self._enqueue(request)
        for seq in list(self._running) + [entry[2] for entry in self._waiting]:
            self._finish(seq, FINISH_CANCELLED)
        self._waiting.clear()

    def _step_stats(self, plan: StepPlan, start: float, end: float, error: str | None) -> StepStats:
        prefill_ids = tuple(c.sequence.request_id for c in plan.prefill)
        decode_ids = tuple(s.request_id for s in plan.decode)
        return StepStats(
            step_index=self.step_index,
            start=start,
            end=end,
            prefill_tokens=plan.prefill_tokens,
            decode_seqs=len(plan.decode),
            batch_size=len(prefill_ids) + len(decode_ids),
            queue_depth=len(self._waiting),
            kv_usage=self.cache.usage(),
            request_ids=prefill_ids + decode_ids,
            prefill_request_ids=prefill_ids,
            decode_request_ids=decode_ids,
            error=error,
        )
