"""Spans from an OTLP file: protobuf, JSON, or JSON lines (what `tokentrace import` reads)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokentrace.collector.otlp import (
    OtlpDecodeError,
    decode_json,
    parse_trace_request,
    spans_from_request,
)


def read_otlp_file(path: Path) -> list[Any]:
    """Gives the spans in one OTLP file: protobuf, JSON, or JSON lines (one export per line)."""
    data = path.read_bytes()
    if not data.strip():
        raise OtlpDecodeError("the file is empty")
    if path.suffix in (".json", ".jsonl", ".ndjson") or data.lstrip()[:1] in (b"{", b"["):
        return _spans_of_json(data)
    try:
        request = parse_trace_request(data)
    except OtlpDecodeError as exc:
        raise OtlpDecodeError(f"neither OTLP/JSON nor OTLP protobuf ({exc})") from exc
    spans, rejected = spans_from_request(request)
    if rejected:
        raise OtlpDecodeError(rejected.message)
    return spans


def _spans_of_json(data: bytes) -> list[Any]:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise OtlpDecodeError(f"not UTF-8 text, so not OTLP/JSON: {exc}") from exc
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError as whole:
        docs = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                docs.append(json.loads(line))
            except json.JSONDecodeError as exc:
                if not docs:  # not JSON lines but one (pretty-printed) document: its error
                    raise OtlpDecodeError(f"invalid JSON: {whole}") from whole
                raise OtlpDecodeError(f"line {n}, column {exc.colno}: invalid JSON: {exc.msg}") from exc
    spans = []
    for doc in docs:
        for d in doc if isinstance(doc, list) else [doc]:
            spans.extend(decode_json(d))
    return spans
