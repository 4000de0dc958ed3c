"""A `serve` with no requests yet says where to send them: its own OTLP addresses, not the
defaults, on the explorer's empty pages and in `tokentrace report --url`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from tt_testkit import start_serve, wait_for_port


@pytest.mark.slow
def test_an_empty_serve_names_its_own_otlp_addresses(tmp_path: Path) -> None:
    server = start_serve(tmp_path)
    try:
        wait_for_port(server.web_port, proc=server.proc)
        http, grpc = f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}"
        page = httpx.get(f"{server.web}/", timeout=60).text
        assert f"http://{http}" in page and grpc in page
        assert ":4318" not in page  # not the defaults: this serve took other ports
        report = subprocess.run(
            [sys.executable, "-m", "tokentrace", "report", "--url", server.web],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert report.returncode == 0, report.stderr
        assert f"http://{http}" in report.stdout and grpc in report.stdout, report.stdout
    finally:
        server.stop()
