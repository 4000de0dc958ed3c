"""Nothing of the lake is imported, nor any DuckDB extension loaded, unless `--lake` is given:
the embedded DuckDB file stays the default, and a machine without the lake's wheels runs
`serve`, `report` and `demo` as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CHECK = """
import sys
from pathlib import Path
from tokentrace.collector.collector import Collector
from tokentrace.collector.settings import resolve
import tokentrace.cli, tokentrace.serve, tokentrace.analyzer.report, tokentrace.web.app
collector = Collector(resolve({"db": Path(sys.argv[1])}))
loaded = collector.conn.execute(
    "SELECT extension_name FROM duckdb_extensions() WHERE loaded AND extension_name IN"
    " ('ducklake', 'postgres_scanner')"
).fetchall()
collector.close()
lake = sorted(m for m in sys.modules if m.startswith("tokentrace.store.lake") or "duckdb_extension" in m)
print(lake, loaded)
assert not lake and not loaded
"""


@pytest.mark.slow
def test_a_collector_without_a_lake_imports_and_loads_nothing_of_it(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path / "t.duckdb")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
