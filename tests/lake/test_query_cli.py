"""`tokentrace report --lake` and `requests --lake`: the lake read as the file is, word for word."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from query_kit import FilledLake, clean_env, copy_into_lake, fill_lake, tokentrace
from tracegen import generate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def filled(postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FilledLake]:
    tmp = tmp_path_factory.mktemp("query-cli")
    uri, data = postgres.new_lake(tmp / "lake-data")
    yield fill_lake(tmp, uri, data)


def _ok(*args: str) -> str:
    done = tokentrace(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("fmt", ["text", "json", "markdown", "html"])
def test_the_report_over_the_lake_is_the_report_over_the_file(filled: FilledLake, fmt: str) -> None:
    over_file = _ok("report", "--db", str(filled.db), "--format", fmt)
    over_lake = _ok("report", "--lake", filled.uri, "--lake-data", filled.data, "--format", fmt)
    assert over_lake == over_file
    if fmt == "json":
        report = json.loads(over_lake)
        assert report["requests"]["count"] == len(filled.requests)
        assert report["requests"]["kept_traces"] > 0


def test_a_windowed_report_over_the_lake_reads_the_same_slice(filled: FilledLake) -> None:
    window = [
        "--since",
        "2026-01-01T00:00:10Z",
        "--until",
        "2026-01-01T00:00:30Z",
        "--model",
        "llama-8b",
    ]
    over_file = _ok("report", "--db", str(filled.db), "--format", "json", *window)
    # the lake from the environment, as every other setting can come
    done = tokentrace(
        "report", "--format", "json", *window, env={**clean_env(), "TOKENTRACE_LAKE": filled.uri}
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == over_file
    assert 0 < json.loads(done.stdout)["requests"]["count"] < len(filled.requests)


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_requests_over_the_lake_are_the_files(filled: FilledLake, fmt: str) -> None:
    over_file = _ok("requests", "--db", str(filled.db), "--format", fmt)
    over_lake = _ok("requests", "--lake", filled.uri, "--format", fmt)
    assert over_lake == over_file
    rows = (
        over_lake.splitlines() if fmt == "jsonl" else list(csv.DictReader(io.StringIO(over_lake)))
    )
    assert len(rows) == len(filled.requests)


def test_requests_as_parquet_over_the_lake_are_the_files(
    filled: FilledLake, tmp_path: Path
) -> None:
    _ok(
        "requests", "--db", str(filled.db), "--format", "parquet", "-o", str(tmp_path / "f.parquet")
    )
    _ok(
        "requests",
        "--lake",
        filled.uri,
        "--format",
        "parquet",
        "-o",
        str(tmp_path / "l.parquet"),
        "--limit",
        "1000",
    )
    over_file, over_lake = (
        pq.read_table(tmp_path / "f.parquet"),
        pq.read_table(tmp_path / "l.parquet"),
    )
    assert over_lake.num_rows == len(filled.requests)
    assert over_lake.equals(over_file)


def test_db_and_lake_together_is_a_usage_error(filled: FilledLake, tmp_path: Path) -> None:
    done = tokentrace("report", "--db", str(filled.db), "--lake", filled.uri)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "tokentrace report: --db and --lake name two stores: give one (the file or the lake)"
    )
    both = {**clean_env(), "TOKENTRACE_DB": str(filled.db), "TOKENTRACE_LAKE": filled.uri}
    done = tokentrace("requests", env=both)
    assert done.returncode == 2
    assert "both TOKENTRACE_DB and TOKENTRACE_LAKE are set: pass --db or --lake" in done.stderr
    # a flag says which: the other store's variable gives way, as a flag beats any variable
    assert tokentrace("requests", "--db", str(filled.db), "--limit", "1", env=both).returncode == 0
    done = tokentrace("requests", "--lake-data", str(tmp_path))
    assert (done.returncode, done.stderr.strip()) == (
        2,
        "tokentrace requests: --lake-data names the lake's files: give --lake too",
    )


def test_an_unreachable_catalog_is_one_line_with_the_password_masked(tmp_path: Path) -> None:
    uri = "ducklake:postgres:dbname=nowhere host=127.0.0.1 port=1 user=tt password=hunter2"
    done = tokentrace("report", "--lake", uri)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(
        "tokentrace report: cannot attach the lake ducklake:postgres:dbname=nowhere"
    )
    assert "password=***" in line and "hunter2" not in done.stderr + done.stdout


def test_a_catalog_no_shard_made_says_what_makes_it(postgres: Any, tmp_path: Path) -> None:
    uri, data = postgres.new_lake(tmp_path / "data")
    done = tokentrace("requests", "--lake", uri)
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith("tokentrace requests: the lake ducklake:postgres:")
    assert line.endswith(
        "holds no lake yet: the first `tokentrace serve --lake …` (a shard) makes its tables when it starts"
    )


def test_an_empty_lakes_report_sends_the_reader_to_the_shards(postgres: Any, tmp_path: Path) -> None:
    uri, data = postgres.new_lake(tmp_path / "data")
    copy_into_lake(generate(tmp_path, count=2, evil=False)[0], uri, data, where="false")
    done = tokentrace("report", "--lake", uri)
    assert done.returncode == 0, done.stderr
    assert "No requests in the lake yet: its shards (tokentrace serve --lake …)" in done.stdout
    assert "4318" not in done.stdout and "OTLP/HTTP on" not in done.stdout
    said = json.loads(tokentrace("report", "--lake", uri, "--format", "json").stdout)
    assert said["lake"] is True and said["requests"]["count"] == 0
