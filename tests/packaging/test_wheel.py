"""The non-editable wheel carries every module and data file, and works on its own."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "tokentrace": "tokentrace",
    "instrumentation": "tokentrace/instrumentation",
    "collector": "tokentrace/collector",
    "analyzer": "tokentrace/analyzer",
    "web": "tokentrace/web",
}
SKIP_PARTS = {"__pycache__", "node_modules"}


def _expected_files() -> set[str]:
    expected = set()
    for folder, package_path in FOLDERS.items():
        base = ROOT / folder
        for path in base.rglob("*"):
            if not path.is_file() or SKIP_PARTS & set(path.parts) or path.suffix in (".pyc",):
                continue
            rel = path.relative_to(base).as_posix()
            if folder == "tokentrace" and rel.split("/")[0] in FOLDERS:
                continue
            expected.add(f"{package_path}/{rel}")
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)]
    try:
        import setuptools  # noqa: F401

        cmd.insert(4, "--no-build-isolation")  # build with what is installed: fast, offline
    except ImportError:
        pass
    subprocess.run(cmd, check=True, capture_output=True)
    (whl,) = out.glob("tokentrace-*.whl")
    return whl


def test_wheel_holds_every_source_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_files() - names)
    assert not missing, f"files left out of the wheel (fix package-data in pyproject.toml): {missing}"
    assert not any(n.startswith(("instrumentation/", "collector/", "analyzer/", "web/")) for n in names)
    assert not any(n.startswith(("tests/", "examples/")) for n in names)


def test_installed_wheel_imports_and_runs(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import tokentrace, tokentrace.instrumentation, tokentrace.analyzer.queries as q\n"
        f"assert tokentrace.__file__.startswith({str(site)!r}), tokentrace.__file__\n"
        "print(len(q.load('latency_percentiles')) > 0)\n"
    )
    # cwd outside the repo; the installed copy comes first on the path, ahead of
    # the editable install's finder (dependencies still come from site-packages)
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"
    cli = subprocess.run(
        [sys.executable, "-m", "tokentrace", "--help"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert cli.returncode == 0 and "serve" in cli.stdout, cli.stderr
