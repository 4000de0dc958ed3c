"""`tokentrace import`: OTLP files through the same collector as `serve`, into the store."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tokentrace.collector.collector import Collector
from tokentrace.collector.otlp import OtlpDecodeError
from tokentrace.collector.otlp_file import read_otlp_file
from tokentrace.collector.settings import CollectorSettings
from tokentrace.store.connection import DatabaseHeld


def import_files(settings: CollectorSettings, paths: Iterable[Path]) -> dict[str, int]:
    """Runs OTLP files through the same pipeline as `serve`; gives counts.

    A file that cannot be read stops the import with an error that names it and
    says which files before it were imported (they stay: nothing accepted is lost)."""
    paths = list(paths)
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"no such file: {p}")
    try:
        collector = Collector(settings)
    except DatabaseHeld as exc:  # a running serve's: send the file to it instead
        raise exc.for_command("import") from exc
    files = spans = 0
    try:
        for p in paths:
            try:
                found = read_otlp_file(p)
            except (OtlpDecodeError, ValueError, RecursionError) as exc:
                done = (
                    f"; the {files} file(s) before it were imported ({spans} spans)"
                    if files
                    else "; nothing was imported"
                )
                raise OtlpDecodeError(f"{p}: {exc}{done}") from exc
            while not collector.pipeline.add(found):
                collector.pipeline.decide_ready(force=True)
            files += 1
            spans += len(found)
        collector.pipeline.decide_ready(force=True)
    finally:
        collector.close()  # writes what is queued: the writer's counts are final after it
    stats = collector.pipeline.stats
    writer = collector.writer
    return {
        "files": files,
        "spans": spans,
        # every request read, stored now or before
        "requests": stats.requests_summarized,
        "traces": stats.traces_decided,
        # traces kept whole by this import; one the database held already is not again
        "kept_traces": stats.traces_kept - writer.kept_already_stored,
        # re-sent copies of requests the database held already (the first copy wins)
        "already_stored": writer.requests_already_stored,
        "kept_already_stored": writer.kept_already_stored,
    }
