"""The non-editable wheel carries every module and data file, and works on its own."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from tt_testkit import build_wheel, install_wheel

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = {
    "app": "tokentrace",
    "instrumentation": "tokentrace/instrumentation",
    "collector": "tokentrace/collector",
    "analyzer": "tokentrace/analyzer",
    "web": "tokentrace/web",
    "store": "tokentrace/store",
    "examples": "tokentrace/examples",
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
            expected.add(f"{package_path}/{rel}")
    return expected


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_every_source_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = sorted(_expected_files() - names)
    assert not missing, f"files left out of the wheel (fix package-data in pyproject.toml): {missing}"
    assert not any(n.startswith(tuple(f"{folder}/" for folder in FOLDERS)) for n in names)
    assert not any(n.startswith("tests/") for n in names)


def test_installed_wheel_imports_and_runs(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = install_wheel(wheel, site)
    code = (
        "import tokentrace, tokentrace.instrumentation, tokentrace.analyzer.queries as q\n"
        f"assert tokentrace.__file__.startswith({str(site)!r}), tokentrace.__file__\n"
        "print(len(q.load('latency_percentiles')) > 0)\n"
    )
    # cwd outside the repo
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


def test_the_clone_root_does_not_shadow_the_installed_package(wheel: Path, tmp_path: Path) -> None:
    """`python -c "import tokentrace.instrumentation"` from the clone's root, after a
    non-editable install: no folder there is named `tokentrace`, so the installed copy loads."""
    site = tmp_path / "site"
    env = install_wheel(wheel, site)
    code = "import tokentrace.instrumentation, tokentrace.examples.scenarios as s; print(s.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(site)), out.stdout
