"""Requests from the shipped Azure LLM inference trace (conversation): real arrival times,
prompt and output sizes, for detectors tested on production-shaped traffic."""

from __future__ import annotations

import csv
from datetime import datetime, timezone
from pathlib import Path

from .workloads import T0_NS, Req

TRACE = Path(__file__).resolve().parents[2] / "examples/data/workloads/azure_llm_2023/AzureLLMInferenceTrace_conv.csv"
#: output tokens above this are cut: minutes-long answers would outlast the window
MAX_OUTPUT = 400


def requests(seconds: float = 600.0, network_ms: float = 20.0) -> list[Req]:
    """Gives the trace's first `seconds` of requests, arriving from T0_NS on."""
    rows = []
    with TRACE.open(newline="") as f:
        for r in csv.DictReader(f):
            # seven fractional digits: datetime reads six
            at = datetime.strptime(r["TIMESTAMP"][:26], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=timezone.utc)
            rows.append((at, int(r["ContextTokens"]), int(r["GeneratedTokens"])))
    rows.sort()
    first = rows[0][0]
    return [
        Req(T0_NS + round((at - first).total_seconds() * 1e6) * 1000, prompt, max(1, min(out, MAX_OUTPUT)),
            network_ms=network_ms)
        for at, prompt, out in rows
        if (at - first).total_seconds() < seconds
    ]
