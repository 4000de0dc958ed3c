"""End to end: `tokentrace demo --quick --exit` serves every scenario and diagnoses it.

A real collector (in the demo process), real tiny-LLM server subprocesses, real
TCP through the delaying proxy, real OTLP; the assertions read the demo's own
DuckDB file afterwards with the analyzer, per scenario `service.name`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tt_testkit import build_wheel, install_wheel

pytest.importorskip("torch")
pytest.importorskip("uvicorn")

REPO = Path(__file__).resolve().parents[2]

from tokentrace.analyzer.filters import Filters  # noqa: E402
from tokentrace.analyzer.report import build_report  # noqa: E402
from tokentrace.examples.scenarios import SCENARIOS  # noqa: E402
from tokentrace.instrumentation import semconv as sc  # noqa: E402
from tokentrace.store.connection import open_read_only  # noqa: E402

#: The demo runs ~3 min on an idle 2-core machine (its scenarios are real-time load):
#: over the suite's 300 s per-test timeout on a busy one, where the module's first test,
#: which runs the demo in its setup, failed every test of the module.
DEMO_TIMEOUT_S = 1200
# alone: its scenarios are real-time CPU load sized for a quiet machine; beside other
# tests (xdist workers, or another run) a stutter scenario once came out with no finding
pytestmark = [pytest.mark.slow, pytest.mark.alone, pytest.mark.timeout(DEMO_TIMEOUT_S + 300)]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    tmp = tmp_path_factory.mktemp("demo")
    db = tmp / "demo.duckdb"
    # as a user runs it: a non-editable install (a wheel), in a directory outside any clone
    env = install_wheel(build_wheel(tmp_path_factory.mktemp("wheel")), tmp / "site")
    proc = subprocess.run(
        [sys.executable, "-m", "tokentrace", "demo", "--quick", "--exit", "--db", str(db)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )
    output = proc.stdout + proc.stderr
    # shown with the test's report: every scenario's evidence, not only the failing one
    print(output)
    assert proc.returncode == 0, output
    return db, output


def test_demo_prints_a_diagnosis_per_scenario_and_the_explorer(demo_run: tuple[Path, str]) -> None:
    db, output = demo_run
    for scenario in SCENARIOS:
        assert f"▶ {scenario.name}:" in output, output
    # with --exit the explorer stops with the demo: it says how to bring it back, no dead URL
    assert f"explore the traces: tokentrace serve --db {db}" in output
    assert "explore the traces: http://" not in output
    assert "tokentrace report --db " in output and "--service tiny-llm-<scenario>" in output
    assert "diagnosis failed" not in output, output


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s.name)
def test_top_finding_is_the_scenarios_complaint(demo_run: tuple[Path, str], scenario) -> None:  # type: ignore[no-untyped-def]
    db, output = demo_run
    conn = open_read_only(db)
    try:
        report = build_report(conn, Filters(service=scenario.service))
        clients = conn.execute(
            "SELECT count(*) FROM requests WHERE service = ? AND network_ms IS NOT NULL",
            [scenario.service],
        ).fetchone()[0]
    finally:
        conn.close()
    assert report["requests"]["count"] >= 30
    # the load generator's client spans joined the server traces: network is measured
    assert clients >= 0.9 * report["requests"]["count"]
    found = [f["complaint"] for f in report["findings"]]
    if scenario.complaint is None:
        assert found == [], f"{scenario.name}: {report['findings']}"
    else:
        assert found and found[0] == scenario.complaint, f"{scenario.name}: {report['findings']}"


def test_kept_traces_hold_the_phase_tree_and_the_packed_token_times(
    demo_run: tuple[Path, str],
) -> None:
    db, _ = demo_run
    service = next(s.service for s in SCENARIOS if s.name == "stutter")
    conn = open_read_only(db)
    try:
        rows = conn.execute(
            "SELECT trace_id, name, attributes FROM spans WHERE service_name = ?", [service]
        ).fetchall()
        steps = conn.execute(
            "SELECT count(*) FROM engine_steps WHERE service = ?", [service]
        ).fetchone()[0]
    finally:
        conn.close()
    names: dict[str, set[str]] = {}
    offsets: dict[str, tuple[list[int], int]] = {}
    for trace_id, name, attrs_json in rows:
        names.setdefault(trace_id, set()).add(name)
        attrs = json.loads(attrs_json)
        if name == sc.SPAN_REQUEST and sc.TOKEN_OFFSETS_US in attrs:
            packed = attrs[sc.TOKEN_OFFSETS_US]
            assert isinstance(packed, str)  # stored as the SDK sent it
            offsets[trace_id] = (sc.unpack_list(packed), attrs[sc.OUTPUT_TOKENS])
    assert offsets, "no kept request span with token times"
    for trace_id, (times, output_tokens) in offsets.items():
        assert len(times) == output_tokens and times == sorted(times)
        phases = {sc.SPAN_TOKENIZE, sc.SPAN_QUEUE, sc.SPAN_PREFILL}
        if output_tokens > 1:
            phases.add(sc.SPAN_DECODE)
        assert phases <= names[trace_id], (trace_id, names[trace_id])
    assert steps > 0  # the engine's packed step lists became engine_steps rows
