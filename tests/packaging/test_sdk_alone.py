"""`pip install tokentrace` (the SDK alone, no server extra): the command line still starts,
and each command that needs the server's dependencies says which extra installs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: a child Python where the server and demo extras' packages cannot be imported
_WITHOUT_EXTRAS = """
import sys
class WithoutExtras:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, WithoutExtras())
from tokentrace.cli import main
sys.exit(main(sys.argv[1:]))
"""
BLOCKED = ("duckdb", "fastapi", "starlette", "uvicorn", "polars", "pyarrow", "grpc", "torch")


def _cli(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    code = _WITHOUT_EXTRAS.format(blocked=BLOCKED)
    return subprocess.run(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("argv", [["--help"], *[[c, "--help"] for c in ("serve", "import", "report", "requests", "demo")]])
def test_help_needs_no_server_dependency(tmp_path: Path, argv: list[str]) -> None:
    out = _cli(tmp_path, *argv)
    assert out.returncode == 0, out.stderr
    assert "usage: tokentrace" in out.stdout and not out.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (["report", "--db", "x.duckdb"], "server"),
        (["requests", "--db", "x.duckdb"], "server"),
        (["import", "x.json", "--db", "x.duckdb"], "server"),
        (["serve", "--db", "x.duckdb", "--http-port", "0", "--grpc-port", "0", "--web-port", "0"], "server"),
        (["demo", "--quick", "--exit", "--db", "x.duckdb"], "demo"),
    ],
)
def test_a_command_without_its_extra_says_what_to_install(tmp_path: Path, argv: list[str], extra: str) -> None:
    out = _cli(tmp_path, *argv)
    assert out.returncode == 1
    assert f"pip install 'tokentrace[{extra}]'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.duckdb").exists()
