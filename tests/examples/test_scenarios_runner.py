"""The scenario runner's tiny-LLM server process: a real subprocess on 127.0.0.1."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import socket
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

from tokentrace.examples.scenarios.runner import ServerProcess  # noqa: E402

#: starts in seconds: a small model, no tokenizer training, no warm-up request
SMALL = {
    "threads": 1, "tokenizer": "byte", "warmup": False,
    "d_model": 64, "n_layers": 2, "n_heads": 4, "d_ff": 128, "max_seq_len": 256,
}  # fmt: skip


@pytest.mark.slow
def test_the_server_port_is_held_before_the_server_runs_and_served_on(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    server = ServerProcess(SMALL, log)
    try:
        # Freeze the server before it could have bound anything itself: a port picked with
        # bind-and-close was free here, for any process (or outgoing connection) to take.
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as intruder:
                with pytest.raises(OSError) as taken:
                    intruder.bind(("127.0.0.1", server.port))
                    intruder.listen()
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert taken.value.errno == errno.EADDRINUSE
        # and the server serves on that port: the socket held from the start is its own
        try:
            asyncio.run(server.wait_ready())
        except (RuntimeError, TimeoutError) as exc:
            raise AssertionError(log.read_text(errors="replace")) from exc
        health = httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10.0)
        assert health.status_code == 200 and health.json()["status"] == "ok"
    finally:
        server.stop()
    # shut down by SIGTERM (uvicorn re-raises it once the app has stopped), not killed
    assert server.proc.returncode in (0, -signal.SIGTERM), log.read_text(errors="replace")
