"""Loading DuckDB's ducklake and postgres extensions, offline where the wheels are installed.

DuckDB signs each extension for one DuckDB version and loads no other.  The `lake` extra
installs PyPI's `duckdb-extension-ducklake` and `duckdb-extension-postgres-scanner` wheels,
which carry DuckDB's official binaries for DuckDB 1.5.5 (the version pyproject.toml pins):
they load from site-packages with no network.  Where they are missing, DuckDB's own
`INSTALL` fetches the same extensions from its repository.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import duckdb

from tokentrace.store.errors import StoreError

#: extension name -> the module of the wheel that carries it
_WHEELS = {
    "ducklake": "duckdb_extension_ducklake",
    # DuckDB loads the postgres extension by this file name
    "postgres_scanner": "duckdb_extension_postgres_scanner",
}


def _bundled(name: str) -> Path | None:
    """Gives the wheel's binary of extension `name` for this DuckDB, None without the wheel."""
    try:
        module = importlib.import_module(_WHEELS[name])
    except ImportError:
        return None
    path = (
        Path(module.__file__ or "").parent / "extensions" / f"v{duckdb.__version__}"
        / f"{name}.duckdb_extension"
    )  # fmt: skip
    return path if path.is_file() else None


def load_lake_extensions(conn: duckdb.DuckDBPyConnection) -> None:
    """Loads ducklake and postgres_scanner into `conn`; raises StoreError saying what to
    install when neither the wheels nor DuckDB's repository give them."""
    loaded = {
        name for (name,) in conn.execute(
            "SELECT extension_name FROM duckdb_extensions() WHERE loaded"
        ).fetchall()
    }  # fmt: skip
    for name in _WHEELS:
        if name in loaded:
            continue
        path = _bundled(name)
        try:
            if path is not None:
                # a path, not a name: nothing is fetched; the binary's signature is checked
                conn.execute(f"LOAD '{_quoted(str(path))}'")
            else:
                conn.execute(f"INSTALL {name}")
                conn.execute(f"LOAD {name}")
        except duckdb.Error as exc:
            raise StoreError(
                f"the lake needs DuckDB's {name} extension, which would not load ({exc}); "
                f"install tokentrace's lake extra (pip install 'tokentrace[lake]'), whose wheels "
                f"carry it for DuckDB {duckdb.__version__}"
            ) from exc


def _quoted(text: str) -> str:
    """`text` inside a single-quoted SQL string literal."""
    return text.replace("'", "''")
