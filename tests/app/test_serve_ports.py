"""`serve --http-port 0 --grpc-port 0 --web-port 0` takes any free ports and says which.

It printed ":0" for each (the settings' value), so nothing could be pointed at it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest


@pytest.mark.slow
def test_serve_on_any_free_port_prints_the_ports_it_bound(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(tmp_path / "a.duckdb"),
           "--http-port", "0", "--grpc-port", "0", "--web-port", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and not any("Ctrl-C" in line for line in lines):
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
        out = "".join(lines)
        http, grpc, web = (
            int(m) for m in re.search(
                r"OTLP/HTTP on http://127\.0\.0\.1:(\d+), OTLP/gRPC on 127\.0\.0\.1:(\d+), "
                r"web UI on http://127\.0\.0\.1:(\d+)", out,
            ).groups()  # type: ignore[union-attr]
        )  # fmt: skip
        assert 0 not in (http, grpc, web), out
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{http} " in out
        assert f"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:{grpc} for gRPC" in out
        assert f"tokentrace report --url http://127.0.0.1:{web}" in out
        with httpx.Client(trust_env=False, timeout=10) as client:
            assert client.get(f"http://127.0.0.1:{http}/readyz").status_code == 200
            assert client.get(f"http://127.0.0.1:{web}/healthz").status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)  # reads the rest and closes the pipe
