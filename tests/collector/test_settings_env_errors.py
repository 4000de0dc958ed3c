"""A setting out of range says where it came from: a value from the environment names
its variable (nobody typed it on the command line); a flag's error stays as it was."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tokentrace.collector.settings import ENV, resolve


@pytest.fixture(autouse=True)
def _no_tokentrace_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV.values():
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("variable", "raw", "says"),
    [
        ("TOKENTRACE_BASELINE", "2", "baseline must be in [0, 1], got 2.0"),
        ("TOKENTRACE_GRACE_S", "-1", "grace_s must be >= 0, got -1.0"),
        ("TOKENTRACE_GRACE_S", "nan", "grace_s must be a finite number, got nan"),
        ("TOKENTRACE_MAX_BUFFERED_SPANS", "0", "max_buffered_spans must be positive, got 0"),
        ("TOKENTRACE_WEB_PORT", "70000", "web_port must be 0..65535, got 70000"),
        ("TOKENTRACE_DECODE_PROCESSES", "-2", "decode_processes must be >= 0, got -2"),
        ("TOKENTRACE_RETENTION", "7", "retention '7' has no unit"),
        ("TOKENTRACE_KEEP_RULES", "tenant", "keep rule 'tenant' must look like key=value"),
    ],
)
def test_an_environment_value_out_of_range_names_its_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, raw: str, says: str
) -> None:
    monkeypatch.setenv(variable, raw)
    with pytest.raises(ValueError) as err:
        resolve({})
    message = str(err.value)
    assert message.startswith(says) and f"(from {variable}={raw!r})" in message, message


def test_a_port_clash_names_the_variable_that_made_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENTRACE_GRPC_PORT", "4318")  # the OTLP/HTTP default
    with pytest.raises(ValueError) as err:
        resolve({})
    assert str(err.value) == (
        "http_port and grpc_port are both 4318: each server needs its own port "
        "(from TOKENTRACE_GRPC_PORT='4318')"
    )


def test_a_flag_error_is_unchanged_and_a_flag_wins_over_a_bad_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError) as err:
        resolve({"baseline": 2.0})
    assert str(err.value) == "baseline must be in [0, 1], got 2.0"
    monkeypatch.setenv("TOKENTRACE_BASELINE", "0.5")  # set, but the flag's value is the one at fault
    with pytest.raises(ValueError) as err:
        resolve({"baseline": 2.0})
    assert str(err.value) == "baseline must be in [0, 1], got 2.0"
    monkeypatch.setenv("TOKENTRACE_BASELINE", "2")
    assert resolve({"baseline": 0.1}).baseline == 0.1


@pytest.mark.slow
def test_serve_says_which_variable_is_out_of_range(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ENV.values()}
    done = subprocess.run(
        [sys.executable, "-m", "tokentrace", "serve", "--db", str(tmp_path / "t.duckdb")],
        capture_output=True, text=True, timeout=120, env={**env, "TOKENTRACE_BASELINE": "2"},
    )  # fmt: skip
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "tokentrace serve: baseline must be in [0, 1], got 2.0 (from TOKENTRACE_BASELINE='2')"
    )
    assert not (tmp_path / "t.duckdb").exists()
