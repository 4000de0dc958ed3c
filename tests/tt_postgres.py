"""A real PostgreSQL server for the lake's tests: Debian's `postgresql` (`.ci/run` installs
it), started by the test in a temporary directory on a free loopback port, and stopped after.

`initdb` refuses to run as root, so as root the server runs as the `postgres` user the package
made.  Each test takes a database of its own (`PostgresServer.new_lake`), so tests of one
worker share one server and never each other's catalog.
"""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tt_testkit import free_port


def bin_dir() -> Path | None:
    """Gives the directory of PostgreSQL's server programs, None where none is installed."""
    found = shutil.which("initdb")
    if found:
        return Path(found).resolve().parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


class PostgresServer:
    """One PostgreSQL cluster on 127.0.0.1:`port`, trust authentication for `user`."""

    user = "tokentrace"

    def __init__(self, root: Path | None = None) -> None:
        programs = bin_dir()
        if programs is None:
            raise RuntimeError("PostgreSQL is not installed (apt-get install postgresql)")
        self._bin = programs
        # not under pytest's tmp_path: its root directory is private to root, and the server
        # runs as `postgres`
        root = root or Path(tempfile.mkdtemp(prefix="tt-postgres-"))
        self.root = root
        self.data = root / "data"
        self.port = free_port()
        self._as_root = os.geteuid() == 0
        self._names = itertools.count(1)
        root.mkdir(parents=True, exist_ok=True)
        if self._as_root:
            shutil.chown(root, "postgres", "postgres")
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", self.user, "--no-sync", "-E", "UTF8")
        self.start()

    def start(self) -> None:
        """Starts the cluster (again, after `pause`) on its port."""
        root = self.root
        self._run(
            "pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", str(root / "server.log"),
            "-o", f"-p {self.port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
            " -c max_connections=200",
            "start",
        )  # fmt: skip

    def _run(self, program: str, *args: str) -> str:
        command = [str(self._bin / program), *args]
        if self._as_root:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed ({done.returncode}): {done.stderr or done.stdout}")
        return done.stdout

    def sql(self, statement: str, dbname: str = "postgres") -> str:
        """Runs one statement with psql; gives its unaligned output."""
        psql = shutil.which("psql") or str(self._bin / "psql")
        done = subprocess.run(
            [psql, "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", dbname,
             "-v", "ON_ERROR_STOP=1", "-Atc", statement],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"psql failed: {done.stderr}")
        return done.stdout

    def dsn(self, dbname: str) -> str:
        """The libpq connection string of database `dbname`."""
        return f"dbname={dbname} host=127.0.0.1 port={self.port} user={self.user}"

    def new_lake(self, data: Path) -> tuple[str, str]:
        """Makes an empty database for a new lake; gives (`--lake` URI, `--lake-data` path)."""
        name = f"lake{next(self._names)}"
        self.sql(f"CREATE DATABASE {name}")
        data.mkdir(parents=True, exist_ok=True)
        return f"ducklake:postgres:{self.dsn(name)}", str(data) + os.sep

    def pause(self) -> None:
        """Stops the server, keeping its data: clients are refused until `start()`."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")

    def stop(self) -> None:
        try:
            self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
        except RuntimeError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)
