"""The trace page's cost is bounded however many token times a request span carries.

A span may pack a million token offsets (the collector takes it): the timeline draws at
most MAX_TIMES_DRAWN ticks and chunks, lists the MAX_STALLS_LISTED largest stalls, and
finds each stall's engine steps by bisecting them, never by scanning every step per stall.
Work and sizes are counted here, never wall time.
"""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb
import httpx
import pytest
from tracegen import GeneratedRequest
from tt_testkit import explorer

from tokentrace.instrumentation import semconv as sc
from tokentrace.web._long_values import LIST_ENDS
from tokentrace.web._timeline import (
    MAX_STALLS_LISTED,
    MAX_STEPS_PER_STALL,
    MAX_TIMES_DRAWN,
    build_timeline,
)

T0 = 1_700_000_000 * 10**9
MS = 10**6


class _Budget:
    """Counts reads of engine-step fields and fails once they pass `most`."""

    def __init__(self, most: int) -> None:
        self.most, self.reads = most, 0


class _CountedStep(dict[str, Any]):
    budget: _Budget

    def __getitem__(self, key: str) -> Any:
        self.budget.reads += 1
        if self.budget.reads > self.budget.most:
            raise AssertionError(f"more than {self.budget.most} reads of engine-step fields")
        return super().__getitem__(key)


def _step(start_ns: int, duration_us: int = 4_000, **extra: Any) -> dict[str, Any]:
    row = {
        "start_ns": start_ns, "duration_us": duration_us, "batch_size": 3, "prefill_tokens": 0,
        "decode_seqs": 3, "queue_depth": 1, "kv_usage": None, "served": True, "gpu_us": None,
        "forward_host_us": None,
    }  # fmt: skip
    row.update(extra)
    return row


def _stalling_tokens(n: int, stall_every: int, stall_ms: float = 100.0) -> list[int]:
    """`n` token times 1 ms apart, with a gap of `stall_ms` (and a little more each time) every `stall_every`."""
    out, t = [], T0 + 50 * MS
    for i in range(n):
        t += int((stall_ms + i / n) * MS) if stall_every and i % stall_every == stall_every - 1 else MS
        out.append(t)
    return out


def _brute_force_overlap(steps: list[dict[str, Any]], a: int, b: int) -> list[int]:
    """The steps overlapping [a, b] as the timeline has always listed them (their starts)."""
    hits = [s for s in steps if s["start_ns"] <= b and s["start_ns"] + s["duration_us"] * 1000 >= a]
    return [s["start_ns"] for s in hits[:MAX_STEPS_PER_STALL]]


def test_a_normal_timeline_draws_every_token_and_chunk_and_lists_every_stall() -> None:
    tokens = _stalling_tokens(600, 150)
    chunks = [t + 3 * MS for t in tokens]
    tl = build_timeline(T0, tokens[-1], tokens, chunks, [], [])
    assert [t["n"] for t in tl["tokens"]] == list(range(1, 601)) and tl["tokens_not_drawn"] == 0
    assert [t["n"] for t in tl["chunks"]] == list(range(1, 601)) and tl["chunks_not_drawn"] == 0
    assert tl["token_count"] == tl["chunk_count"] == 600
    assert [s["after_token"] for s in tl["stalls"]] == [149, 299, 449, 599]
    assert tl["stall_count"] == 4 and tl["stalls_not_listed"] == 0


def test_a_huge_timeline_draws_at_most_the_cap_keeping_the_ends_and_wide_gaps() -> None:
    tokens = _stalling_tokens(60_000, 3)
    for at in (10_000, 30_000, 45_000):  # three pauses of a minute
        tokens[at:] = [t + 60_000 * MS for t in tokens[at:]]
    chunks = [t + 3 * MS for t in tokens]
    t1 = tokens[-1]
    tl = build_timeline(T0, t1, tokens, chunks, [], [])
    assert len(tl["tokens"]) <= MAX_TIMES_DRAWN and len(tl["chunks"]) <= MAX_TIMES_DRAWN
    drawn = [t["n"] for t in tl["tokens"]]
    assert tl["token_count"] == 60_000
    assert tl["tokens_not_drawn"] == 60_000 - len(drawn)
    assert drawn[0] == 1 and drawn[-1] == 60_000 and drawn == sorted(set(drawn))
    assert tl["chunk_count"] == 60_000
    # a tick says which token it is, and where
    for mark in tl["tokens"][:50]:
        assert mark["ms"] == round((tokens[mark["n"] - 1] - T0) / 1e6, 3)
    # every gap wider than a slice of the axis keeps a tick on both sides
    kept = set(drawn)
    slice_ns = (t1 - T0) / (MAX_TIMES_DRAWN // 2 - MAX_STALLS_LISTED)
    wide = [i for i in range(len(tokens) - 1) if tokens[i + 1] - tokens[i] > 2 * slice_ns]
    assert wide and all(i + 1 in kept and i + 2 in kept for i in wide)
    # and so does every listed stall, whatever its width
    assert all({g["after_token"], g["after_token"] + 1} <= kept for g in tl["stalls"])


def test_the_stall_table_keeps_the_largest_stalls_and_says_how_many_there_were() -> None:
    tokens = _stalling_tokens(30_000, 3)  # 10,000 stalls, each a little longer than the one before
    tl = build_timeline(T0, tokens[-1], tokens, [], [], [])
    assert len(tl["stalls"]) == MAX_STALLS_LISTED
    assert tl["stall_count"] == 10_000 and tl["stalls_not_listed"] == 10_000 - MAX_STALLS_LISTED
    after = [g["after_token"] for g in tl["stalls"]]
    assert after == sorted(after), "listed in time order"
    assert after == list(range(30_000 - 3 * MAX_STALLS_LISTED + 2, 30_000, 3)), "the largest: the last ones"


def test_stall_steps_are_found_without_scanning_every_step_per_stall() -> None:
    # 3,000 stalls over 6,000 steps: scanning every step per stall reads fields ~36 million
    # times; sorting and bisecting reads each step a few times plus the few near each stall
    tokens = _stalling_tokens(9_000, 3, stall_ms=60.0)
    t1 = tokens[-1]
    budget = _Budget(most=40 * 6_000)
    steps = []
    for k in range(6_000):
        step = _CountedStep(_step(T0 + k * (t1 - T0) // 6_000, duration_us=(t1 - T0) // 6_000 // 1000))
        step.budget = budget
        steps.append(step)
    tl = build_timeline(T0, t1, tokens, [], steps, [])
    assert tl["stall_count"] == 3_000 and budget.reads <= budget.most
    plain = [dict(s) for s in steps]
    for g in tl["stalls"]:
        b = tokens[g["after_token"]]
        assert [s["start_ns"] for s in g["steps"]] == _brute_force_overlap(plain, g["start_ns"], b)
        assert g["steps"], "steps cover the whole request: each stall overlaps some"


def test_stall_steps_and_gpu_match_a_full_scan_with_long_and_short_steps() -> None:
    rng = random.Random(5)
    tokens = _stalling_tokens(400, 40, stall_ms=80.0)
    t1 = tokens[-1]
    steps = sorted(
        (_step(rng.randrange(T0 - 500 * MS, t1), duration_us=rng.choice((2_000, 9_000, 400_000)), batch_size=k)
         for k in range(800)),
        key=lambda s: s["start_ns"],
    )  # fmt: skip
    gpu = [{"ts_ns": T0 + k * 7 * MS, "utilization_pct": None if k % 9 == 0 else float(k % 100), "gpu_index": 0}
           for k in range((t1 - T0) // (7 * MS))]  # fmt: skip
    tl = build_timeline(T0, t1, tokens, [], steps, gpu)
    assert tl["stall_count"] == len(tl["stalls"]) == 10
    for g in tl["stalls"]:
        a, b = g["start_ns"], tokens[g["after_token"]]
        assert [s["start_ns"] for s in g["steps"]] == _brute_force_overlap(steps, a, b)
        assert [s["batch_size"] for s in g["steps"]] == [
            s["batch_size"] for s in steps if s["start_ns"] <= b and s["start_ns"] + s["duration_us"] * 1000 >= a
        ][:MAX_STEPS_PER_STALL]
        util = [x["utilization_pct"] for x in gpu if a <= x["ts_ns"] <= b and x["utilization_pct"] is not None]
        assert g["gpu_util_mean"] == (round(sum(util) / len(util), 1) if util else None)


# -- through the app: the page and its JSON twin stay small ------------------------------------

HUGE_TOKENS = 12_000
HUGE_STALL_EVERY = 3


@pytest.fixture(scope="module")
def huge(generated: tuple[Path, list[GeneratedRequest]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """Serves a copy of the generated database in which one stalled request's spans carry
    HUGE_TOKENS token times (a stall every HUGE_STALL_EVERY) and as many client chunks;
    gives the URL and the trace id."""
    src, requests = generated
    db = tmp_path_factory.mktemp("webdb-huge-trace") / "web.duckdb"
    shutil.copy(src, db)
    conn = duckdb.connect(str(db))
    try:
        trace_id, span_id, attrs, parent = conn.execute(
            "SELECT trace_id, span_id, attributes, parent_span_id FROM spans WHERE name = ? AND trace_id IN "
            "(SELECT trace_id FROM requests WHERE stall_count > 0) ORDER BY trace_id LIMIT 1",
            [sc.SPAN_REQUEST],
        ).fetchone()  # type: ignore[misc]
        offsets = [(t - T0) // 1000 for t in _stalling_tokens(HUGE_TOKENS, HUGE_STALL_EVERY)]
        conn.execute(
            "UPDATE spans SET attributes = ? WHERE span_id = ?",
            [json.dumps({**json.loads(attrs), sc.TOKEN_OFFSETS_US: sc.pack_list(offsets)}), span_id],
        )
        (client_attrs,) = conn.execute("SELECT attributes FROM spans WHERE span_id = ?", [parent]).fetchone()  # type: ignore[misc]
        conn.execute(
            "UPDATE spans SET attributes = ? WHERE span_id = ?",
            [json.dumps({**json.loads(client_attrs), sc.CLIENT_CHUNK_OFFSETS_US: [o + 900 for o in offsets]}), parent],
        )
    finally:
        conn.close()
    with explorer(db) as url:
        yield url, trace_id


def test_the_json_twin_of_a_huge_trace_is_bounded_and_says_what_it_left_out(huge: tuple[str, str]) -> None:
    url, trace_id = huge
    r = httpx.get(f"{url}/api/trace/{trace_id}", timeout=120)
    assert r.status_code == 200
    (rq,) = r.json()["requests"]
    tl = rq["timeline"]
    stalls = HUGE_TOKENS // HUGE_STALL_EVERY
    assert len(tl["tokens"]) <= MAX_TIMES_DRAWN and len(tl["chunks"]) <= MAX_TIMES_DRAWN
    assert tl["token_count"] == tl["chunk_count"] == HUGE_TOKENS
    assert tl["tokens_not_drawn"] == HUGE_TOKENS - len(tl["tokens"]) > 0
    assert tl["stall_count"] == stalls and len(tl["stalls"]) == MAX_STALLS_LISTED
    assert tl["stalls_not_listed"] == stalls - MAX_STALLS_LISTED
    # the timeline no longer grows with the tokens: a few hundred kB, not one entry per token
    assert len(json.dumps(tl)) < 600_000


def test_the_page_of_a_huge_trace_draws_a_bounded_number_of_marks_and_says_so(huge: tuple[str, str]) -> None:
    url, trace_id = huge
    r = httpx.get(f"{url}/trace/{trace_id}", timeout=120)
    assert r.status_code == 200
    page = r.text
    ticks, chunks = page.count('<line class="tick"'), page.count('<line class="chunk"')
    assert 0 < ticks <= MAX_TIMES_DRAWN and 0 < chunks <= MAX_TIMES_DRAWN
    assert page.count('<rect class="stall"') == MAX_STALLS_LISTED
    assert page.count("<tr><td>") <= MAX_STALLS_LISTED + 10  # the stall table's rows
    assert f"{HUGE_TOKENS:,} tokens over" in page
    assert f"{ticks:,} of {HUGE_TOKENS:,} token times drawn" in page
    assert f"{chunks:,} of {HUGE_TOKENS:,} client chunks drawn" in page
    assert f"The {MAX_STALLS_LISTED:,} largest of {HUGE_TOKENS // HUGE_STALL_EVERY:,} stalls" in page
    # the last tick says which token it is among them all
    assert f"<title>token {HUGE_TOKENS} at" in page


def test_the_json_twin_summarizes_the_token_lists_it_used_to_carry_whole(huge: tuple[str, str]) -> None:
    """docs/web.md promised the JSON twin was bounded like the page: the spans' own lists were not."""
    url, trace_id = huge
    r = httpx.get(f"{url}/api/trace/{trace_id}", timeout=120)
    spans = {s["name"]: s for s in r.json()["spans"]}
    offsets = spans[sc.SPAN_REQUEST]["attributes"][sc.TOKEN_OFFSETS_US]  # packed: one JSON string
    chunks = spans[sc.SPAN_CLIENT]["attributes"][sc.CLIENT_CHUNK_OFFSETS_US]  # an OTLP array
    every = [(t - T0) // 1000 for t in _stalling_tokens(HUGE_TOKENS, HUGE_STALL_EVERY)]
    for summary, values in ((offsets, every), (chunks, [o + 900 for o in every])):
        assert summary == {
            "count": HUGE_TOKENS, "first": values[:LIST_ENDS], "last": values[-LIST_ENDS:],
            "all_in": f"/api/trace/{trace_id}/otlp.json",
        }  # fmt: skip
    # the spans no longer grow with the tokens (each list was ~100 kB here)
    assert len(json.dumps(r.json()["spans"])) < 20_000
    # the export keeps every value
    otlp = httpx.get(f"{url}/api/trace/{trace_id}/otlp.json", timeout=120).json()
    attrs = [a for rs in otlp["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"] for a in s["attributes"]]
    packed = next(a["value"]["stringValue"] for a in attrs if a["key"] == sc.TOKEN_OFFSETS_US)
    assert json.loads(packed) == every


def test_the_page_summarizes_the_token_lists_in_the_span_details(huge: tuple[str, str]) -> None:
    url, trace_id = huge
    page = httpx.get(f"{url}/trace/{trace_id}", timeout=120).text
    middle = [(t - T0) // 1000 for t in _stalling_tokens(HUGE_TOKENS, HUGE_STALL_EVERY)][5000:5004]
    assert sc.pack_list(middle)[1:-1] not in page and ", ".join(map(str, middle)) not in page
    block = page.split('<script type="application/json" id="span-details">', 1)[1].split("</script>", 1)[0]
    shown = {k: v for span in json.loads(block)["spans"] for k, v in span["attributes"]}
    for key in (sc.TOKEN_OFFSETS_US, sc.CLIENT_CHUNK_OFFSETS_US):
        assert shown[key].startswith(f"{HUGE_TOKENS:,} values: [")
        assert shown[key].endswith(f"every one is in the trace's OTLP JSON export (/api/trace/{trace_id}/otlp.json)")
    assert len(block) < 20_000


def test_the_chrome_export_thins_token_instants_as_the_timeline_does(huge: tuple[str, str]) -> None:
    """A million token times made a 99 MB chrome.json, built in memory."""
    url, trace_id = huge
    doc = httpx.get(f"{url}/api/trace/{trace_id}/chrome.json", timeout=120).json()
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "token"]
    assert 0 < len(names) <= MAX_TIMES_DRAWN
    assert names[0] == "token 1" and names[-1] == f"token {HUGE_TOKENS}"  # numbered among them all
    assert doc["otherData"]["tokens_not_drawn"] == HUGE_TOKENS - len(names)
    request = next(e for e in doc["traceEvents"] if e.get("cat") == "span" and e["name"] == sc.SPAN_REQUEST)
    assert request["args"][sc.TOKEN_OFFSETS_US]["count"] == HUGE_TOKENS
