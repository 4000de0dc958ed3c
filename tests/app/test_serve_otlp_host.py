"""`serve --otlp-host`: the OTLP receivers (gRPC, HTTP with /metrics and /readyz) bind
their own address, so the fleet's exporters can reach them while the web UI stays on
loopback.  The addresses used are loopback ones (127.0.0.2 is this machine too on
Linux): no test server listens beyond this machine."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest
from otlp_traces import request_trace, to_protobuf
from tt_testkit import free_port

import tokentrace.serve as serving
from tokentrace.cli import build_parser
from tokentrace.collector.grpc_receiver import TRACE_SERVICE
from tokentrace.collector.settings import CollectorSettings, resolve
from tokentrace.serve import CollectorServer

OTLP_HOST = "127.0.0.2"


def _bindable(host: str) -> bool:
    try:
        with socket.socket() as s:
            s.bind((host, 0))
    except OSError:
        return False
    return True


needs_second_loopback = pytest.mark.skipif(
    not _bindable(OTLP_HOST), reason=f"{OTLP_HOST} is not an address of this machine (Linux has all of 127/8)"
)


def _refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_otlp_host_resolves_flag_env_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOKENTRACE_OTLP_HOST", raising=False)
    monkeypatch.delenv("TOKENTRACE_HOST", raising=False)
    assert CollectorSettings().otlp_bind_host == "127.0.0.1"
    assert CollectorSettings(host="::1").otlp_bind_host == "::1"  # unset: the same as --host
    assert resolve({"otlp_host": "0.0.0.0"}).otlp_bind_host == "0.0.0.0"  # noqa: S104
    monkeypatch.setenv("TOKENTRACE_OTLP_HOST", "10.0.0.5")
    settings = resolve({})
    assert (settings.host, settings.otlp_bind_host) == ("127.0.0.1", "10.0.0.5")


def test_serve_help_shows_otlp_host(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--otlp-host" in text and "TOKENTRACE_OTLP_HOST" in text and "same as --host" in text


def _export_over_grpc(target: str) -> None:
    with grpc.insecure_channel(target) as channel:
        export = channel.unary_unary(f"/{TRACE_SERVICE}/Export")
        export(to_protobuf(request_trace()).SerializeToString(), timeout=10)


@pytest.mark.slow
@needs_second_loopback
def test_otlp_receivers_bind_the_otlp_host_and_the_web_ui_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    checked_on: list[str] = []
    real_app = serving.create_http_app

    def recording_app(*args: Any) -> Any:
        checked_on.append(args[4])  # bind_host: what the Host check is decided on
        return real_app(*args)

    monkeypatch.setattr(serving, "create_http_app", recording_app)
    http_port, grpc_port, web_port = free_port(), free_port(), free_port()
    settings = CollectorSettings(
        db=tmp_path / "t.duckdb", host="127.0.0.1", otlp_host=OTLP_HOST, http_port=http_port,
        grpc_port=grpc_port, web_port=web_port, decode_processes=0,
    )  # fmt: skip
    caplog.set_level(logging.INFO, logger="tokentrace.collector")
    server = CollectorServer(settings).start()
    try:
        assert checked_on == [OTLP_HOST]
        otlp = f"http://{OTLP_HOST}:{http_port}"
        assert httpx.get(f"{otlp}/readyz").status_code == 200
        assert httpx.get(f"{otlp}/metrics").status_code == 200
        r = httpx.post(f"{otlp}/v1/traces", content=to_protobuf(request_trace()).SerializeToString(),
                       headers={"Content-Type": "application/x-protobuf"})  # fmt: skip
        assert r.status_code == 200, r.text
        _export_over_grpc(f"{OTLP_HOST}:{grpc_port}")
        # bound to a loopback address, the receiver still refuses a foreign Host, and
        # says which flag would serve others
        r = httpx.get(f"{otlp}/readyz", headers={"Host": "rebind.example"})
        assert r.status_code == 403 and "--otlp-host" in r.json()["message"]
        assert httpx.get(f"http://127.0.0.1:{web_port}/healthz").status_code == 200
        assert _refused("127.0.0.1", http_port) and _refused("127.0.0.1", grpc_port)
        assert _refused(OTLP_HOST, web_port)
        assert server.otlp_http_url == otlp and server.web_url == f"http://127.0.0.1:{web_port}"
    finally:
        server.stop()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("tokentrace serving:")]
    assert f"OTLP/HTTP {OTLP_HOST}:{http_port}" in line and f"OTLP/gRPC {OTLP_HOST}:{grpc_port}" in line
    assert f"web 127.0.0.1:{web_port}" in line


@pytest.mark.slow
@needs_second_loopback
def test_serve_says_which_address_each_server_binds(tmp_path: Path) -> None:
    http_port, grpc_port, web_port = free_port(), free_port(), free_port()
    cmd = [sys.executable, "-m", "tokentrace", "serve", "--db", str(tmp_path / "t.duckdb"),
           "--http-port", str(http_port), "--grpc-port", str(grpc_port), "--web-port", str(web_port),
           "--decode-processes", "0"]  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENTRACE_OTLP_HOST": OTLP_HOST}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:  # up to the start-up line, printed once every server is up
            if "OTLP/HTTP on" in line:
                break
    finally:
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    assert f"OTLP/HTTP on http://{OTLP_HOST}:{http_port}" in line, line + rest
    assert f"OTLP/gRPC on {OTLP_HOST}:{grpc_port}" in line
    assert f"web UI on http://127.0.0.1:{web_port}" in line
    assert "warning" not in line + rest  # the web UI is on loopback: nothing to warn about
