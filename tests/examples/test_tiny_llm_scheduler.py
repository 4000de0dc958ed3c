from __future__ import annotations

import queue
import threading
import time

import pytest

torch = pytest.importorskip("torch")

from tokentrace.examples.tiny_llm.model import ModelConfig, build_model  # noqa: E402
from tokentrace.examples.tiny_llm.scheduler import (  # noqa: E402
    BATCH,
    FINISH_CANCELLED,
    FINISH_ERROR,
    FINISH_LENGTH,
    INTERACTIVE,
    GenerationRequest,
    Scheduler,
    SchedulerConfig,
    StepStats,
    TokenEvent,
)

CONFIG = ModelConfig(
    vocab_size=300, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=256, seed=5
)


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return build_model(CONFIG, "cpu")


class Collector:
    """A thread-safe sink that remembers every event, per request."""

    def __init__(self) -> None:
        self.events: queue.Queue[TokenEvent] = queue.Queue()
        self.by_request: dict[str, list[TokenEvent]] = {}
        self.finish_order: list[str] = []

    def __call__(self, event: TokenEvent) -> None:
        self.events.put(event)

    def wait(self, count: int, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.finish_order) < count:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            self.by_request.setdefault(event.request_id, []).append(event)
            if event.finish_reason is not None:
                self.finish_order.append(event.request_id)

    def tokens(self, request_id: str) -> list[int]:
        return [e.token_id for e in self.by_request[request_id] if e.token_id is not None]


def _prompt(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, CONFIG.vocab_size, (n,), generator=gen).tolist()


@pytest.fixture
def make_scheduler(model):  # type: ignore[no-untyped-def]
    started: list[Scheduler] = []

    def factory(**kwargs: object) -> Scheduler:
        scheduler = Scheduler(model, SchedulerConfig(**kwargs))  # type: ignore[arg-type]
        started.append(scheduler)
        return scheduler

    yield factory
    for scheduler in started:
        scheduler.stop()


def test_interactive_is_served_before_batch(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler = make_scheduler(max_batch_size=1)
    sink = Collector()
    # Queued before the thread starts, batch first: admission must still pick interactive.
    for i in range(3):
        scheduler.submit(
            GenerationRequest(f"batch-{i}", _prompt(20, i), 3, sink, traffic_class=BATCH)
        )
    for i in range(2):
        scheduler.submit(
            GenerationRequest(f"live-{i}", _prompt(20, 10 + i), 3, sink, traffic_class=INTERACTIVE)
        )
    scheduler.start()
    sink.wait(5)
    assert sink.finish_order == ["live-0", "live-1", "batch-0", "batch-1", "batch-2"]


def test_chunked_prefill_gives_same_tokens_as_unchunked(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    outputs = []
    for chunk in (None, 7):
        scheduler = make_scheduler(max_batch_size=4, prefill_chunk_size=chunk)
        steps: list[StepStats] = []
        scheduler.add_step_hook(steps.append)
        sink = Collector()
        for i, n in enumerate((9, 33, 70)):
            scheduler.submit(GenerationRequest(f"r{i}", _prompt(n, 100 + i), 12, sink))
        scheduler.start()
        sink.wait(3)
        outputs.append({rid: sink.tokens(rid) for rid in sink.by_request})
        if chunk is not None:
            assert max(s.prefill_tokens for s in steps) <= 3 * chunk
    assert outputs[0] == outputs[1]
    assert all(len(tokens) == 12 for tokens in outputs[0].values())


def test_step_hook_reports_prefill_and_decode(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler = make_scheduler(max_batch_size=4)
    steps: list[StepStats] = []
    scheduler.add_step_hook(steps.append)
    sink = Collector()
    scheduler.submit(GenerationRequest("a", _prompt(30, 1), 5, sink))
    scheduler.submit(GenerationRequest("b", _prompt(50, 2), 5, sink))
    scheduler.start()
    sink.wait(2)
    scheduler.stop()  # joins the thread: the last step's hook has run
    first = steps[0]
    assert first.prefill_tokens == 80 and first.decode_seqs == 0
    assert set(first.prefill_request_ids) == {"a", "b"} and first.batch_size == 2
    assert first.end >= first.start and 0 < first.kv_usage <= 1
    assert [s.step_index for s in steps] == list(range(len(steps)))
    assert sum(s.decode_seqs for s in steps) == 8  # 4 decode steps after each first token
    assert all(e.finish_reason == FINISH_LENGTH for e in sink.by_request["a"][-1:])
    assert scheduler.cache.free_slots == scheduler.cache.num_slots


def test_prefill_can_be_kept_out_of_decode_steps(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    for interrupts in (True, False):
        scheduler = make_scheduler(max_batch_size=4, prefill_interrupts_decode=interrupts)
        steps: list[StepStats] = []
        scheduler.add_step_hook(steps.append)
        sink = Collector()
        decoding, submitted = threading.Event(), threading.Event()

        def on_event(
            event: TokenEvent,
            sink: Collector = sink,
            decoding: threading.Event = decoding,
            submitted: threading.Event = submitted,
        ) -> None:
            sink(event)
            if not decoding.is_set():
                decoding.set()
                # the scheduler thread waits at "long"'s first token until "late" is in: its
                # 200 tokens take ~0.15 s, which a loaded machine's test thread could miss
                submitted.wait(30)

        scheduler.start()
        scheduler.submit(GenerationRequest("long", _prompt(20, 1), 200, on_event))
        assert decoding.wait(30)  # "late" must arrive while "long" decodes
        scheduler.submit(GenerationRequest("late", _prompt(60, 2), 3, sink))
        submitted.set()
        sink.wait(2)
        mixed = [s for s in steps if s.prefill_tokens and s.decode_seqs]
        assert bool(mixed) is interrupts


def test_batch_delay_gathers_requests_into_one_step(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    # a delay far longer than any pause of a loaded machine between the two submits (300 ms
    # was not); the test does not wait for it: two waiting requests fill the batch of two
    scheduler = make_scheduler(max_batch_size=2, batch_delay_ms=60_000)
    steps: list[StepStats] = []
    scheduler.add_step_hook(steps.append)
    sink = Collector()
    scheduler.start()
    scheduler.submit(GenerationRequest("first", _prompt(10, 1), 2, sink))
    time.sleep(0.05)
    scheduler.submit(GenerationRequest("second", _prompt(10, 2), 2, sink))
    sink.wait(2)
    assert set(steps[0].prefill_request_ids) == {"first", "second"}


def test_cancel_frees_the_kv_slot(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler = make_scheduler(max_batch_size=2)
    first_token, cancelled = threading.Event(), threading.Event()
    sink = Collector()

    def on_event(event: TokenEvent) -> None:
        sink(event)
        if not first_token.is_set():
            first_token.set()
            # the scheduler thread waits at the first token until the cancel is in: the 200
            # tokens take ~0.15 s, which a loaded machine's test thread could miss
            cancelled.wait(30)

    scheduler.start()
    scheduler.submit(GenerationRequest("gone", _prompt(10, 1), 200, on_event))
    assert first_token.wait(30)
    scheduler.cancel("gone")
    cancelled.set()
    sink.wait(1)
    assert sink.by_request["gone"][-1].finish_reason == FINISH_CANCELLED
    assert len(sink.tokens("gone")) < 200
    deadline = time.monotonic() + 30
    while scheduler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.running == 0 and scheduler.cache.free_slots == scheduler.cache.num_slots


def test_errors_do_not_kill_the_scheduler(make_scheduler, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    scheduler = make_scheduler(max_batch_size=2)
    real_decode = scheduler._forward_decode
    calls = {"n": 0}

    def flaky_decode(seqs):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_decode(seqs)

    monkeypatch.setattr(scheduler, "_forward_decode", flaky_decode)

    def broken_sink(event: TokenEvent) -> None:
        raise OSError("client went away")

    sink = Collector()
    scheduler.start()
    scheduler.submit(GenerationRequest("unlucky", _prompt(10, 1), 5, sink))
    sink.wait(1)
    assert sink.by_request["unlucky"][-1].finish_reason == FINISH_ERROR
    assert "boom" in (sink.by_request["unlucky"][-1].error or "")
    scheduler.submit(GenerationRequest("deaf", _prompt(10, 2), 5, broken_sink))
    scheduler.submit(GenerationRequest("fine", _prompt(10, 3), 5, sink))
    sink.wait(2)
    assert len(sink.tokens("fine")) == 5
    deadline = time.monotonic() + 30
    while scheduler.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert scheduler.cache.free_slots == scheduler.cache.num_slots


def test_request_validation(make_scheduler) -> None:  # type: ignore[no-untyped-def]
    scheduler = make_scheduler()
    with pytest.raises(ValueError):
        GenerationRequest("x", [], 5, lambda e: None)
    with pytest.raises(ValueError):
        GenerationRequest("x", [1], 5, lambda e: None, traffic_class="bulk")
    with pytest.raises(ValueError):
        scheduler.submit(GenerationRequest("x", [1] * 250, 10, lambda e: None))
    with pytest.raises(ValueError):
        SchedulerConfig(max_batch_size=0)
