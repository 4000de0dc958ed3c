"""The host keeps running, unchanged, when the collector dies mid-run."""

from __future__ import annotations

import logging
import time

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tests.instrumentation.test_gpu_sampler import FakeNvml
from tokentrace import instrumentation as tt
from tokentrace.instrumentation import _gpu, _steps
from tokentrace.store.connection import open_read_only

REQUESTS = 120
KILL_AT = 40


def _host_loop(model: torch.nn.Module, tok: object, on_iteration) -> list[int]:  # type: ignore[no-untyped-def]
    produced = []
    x = torch.ones(1, 4)
    for i in range(REQUESTS):
        on_iteration(i)
        with (
            tt.client_request(model="tiny") as cr,
            tt.request(headers=cr.headers(), model="tiny") as req,
        ):
            ids = tok.encode("hello world").ids  # type: ignore[attr-defined]
            req.start_phase("queue")
            with tt.engine_step(queue_depth=1) as step:
                req.end_phase("queue")
                step.prefill(req.request_id, len(ids))
                model(x)
                req.token()
                cr.chunk()
            for _ in range(3):
                with tt.engine_step() as step:
                    step.decode(req.request_id)
                    model(x)
                    req.token()
                    cr.chunk()
            req.set_tokens(prompt=len(ids))
            produced.append(req.token_count)
    return produced


def test_collector_killed_mid_run(serve, caplog) -> None:  # type: ignore[no-untyped-def]
    caplog.set_level(logging.WARNING)
    tracing = tt.configure(endpoint=serve.otlp_http, service_name="resilient")
    sampler = tt.start_gpu_sampler(interval_s=0.01, backend=FakeNvml(), export_interval_s=0.05)
    model = tt.instrument_model(torch.nn.Linear(4, 4))
    tok = Tokenizer(WordLevel({"[UNK]": 0, "hello": 1, "world": 2}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    tok = tt.wrap_tokenizer(tok)
    steps_before = _steps.recorder.emitted_spans
    flushed_before_kill: list[bool] = []

    def on_iteration(i: int) -> None:
        if i == KILL_AT:
            flushed_before_kill.append(tracing.force_flush(10_000))
            serve.stop()  # SIGTERM: the collector is gone from here on

    try:
        produced = _host_loop(model, tok, on_iteration)
        # let the exporters meet the dead collector (a fixed 0.2 s could pass on a loaded
        # machine before the GPU export thread ran again)
        deadline = time.monotonic() + 20
        while sampler.export_failures < 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert sampler.running  # the sampler thread survived failed exports
    finally:
        sampler.stop()
        tt.shutdown()
    # every request ran to the end, exactly as it would untraced
    assert produced == [4] * REQUESTS
    assert flushed_before_kill == [True]
    # the SDK kept doing its work after the collector died (spans built, steps batched)
    assert _steps.recorder.emitted_spans > steps_before
    assert sampler.export_failures >= 1
    # its own failures were logged once, not once per request / sample
    gpu_logs = [r for r in caplog.records if "GPU metrics export" in r.getMessage()]
    assert len(gpu_logs) <= 1
    # what was sent before the collector died was stored
    conn = open_read_only(serve.db)
    try:
        stored = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
    finally:
        conn.close()
    assert 0 < stored <= KILL_AT
    assert _gpu.gpu_summary(0, time.time_ns()) is None  # stopped sampler is no longer active
