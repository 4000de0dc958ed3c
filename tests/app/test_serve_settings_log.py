"""`serve -v` logs its settings as applied: an unset setting that stands for another
value says that value, as the start-up line does, never `None`."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tt_testkit import ServeProcess, free_port, wait_for_port

from tokentrace.store.location import DEFAULT_MEMORY_LIMIT

pytestmark = pytest.mark.slow


def _bindable(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
    except OSError:
        return False
    return True


def _start(tmp_path: Path, *extra: str) -> ServeProcess:
    """Starts a real `serve -v`; waits for its web UI (on 127.0.0.1 whatever --otlp-host)."""
    db, ports = tmp_path / "t.duckdb", [free_port(), free_port(), free_port()]
    cmd = [sys.executable, "-m", "tokentrace", "serve", "-v", "--db", str(db),
           "--http-port", str(ports[0]), "--grpc-port", str(ports[1]), "--web-port", str(ports[2]),
           *extra]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    serve = ServeProcess(proc, db, *ports)
    try:
        wait_for_port(serve.web_port, proc=proc)
    except Exception:
        serve.stop()
        raise
    return serve


def _settings_logged(out: str) -> dict[str, str]:
    (line,) = [line for line in out.splitlines() if "tokentrace serve settings: " in line]
    return dict(
        item.split("=", 1) for item in line.split("tokentrace serve settings: ", 1)[1].split(", ")
    )


@pytest.mark.parametrize("otlp_host", [None, "127.0.0.2"])
def test_the_settings_log_says_the_address_the_otlp_receivers_bind(
    tmp_path: Path, otlp_host: str | None
) -> None:
    if otlp_host is not None and not _bindable(otlp_host):
        pytest.skip(f"{otlp_host} is not an address of this machine (Linux has all of 127/8)")
    serve = _start(tmp_path, *(("--otlp-host", otlp_host) if otlp_host else ()))
    out = serve.stop()
    assert serve.proc.returncode == 0, out
    logged = _settings_logged(out)
    bound = otlp_host or "127.0.0.1"  # unset: the web UI's --host
    assert logged["otlp_host"] == bound, out
    assert logged["host"] == "127.0.0.1"
    # the start-up line says where the receivers are: the settings log agrees
    started = re.search(r"OTLP/HTTP on http://([^:]+):(\d+), OTLP/gRPC on ([^:]+):(\d+)", out)
    assert started is not None, out
    assert (started[1], started[3]) == (bound, bound)
    assert logged["duckdb_memory_limit"] == DEFAULT_MEMORY_LIMIT  # unset: the store's default
    assert "None" not in (logged["otlp_host"], logged["duckdb_memory_limit"])


def test_the_settings_log_masks_the_api_token(tmp_path: Path) -> None:
    serve = _start(tmp_path, "--api-token", "s3cret-token")
    out = serve.stop()
    assert _settings_logged(out)["api_token"] == "***", out
    assert "s3cret-token" not in out
