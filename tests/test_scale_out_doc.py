"""docs/scale-out.md's OpenTelemetry Collector configuration: the copy in the page is the one
in deploy/, it parses, and it routes as the page says (traces by trace id, metrics never)."""

from __future__ import annotations

import re

import yaml
from tt_testkit import REPO

DOC = REPO / "docs" / "scale-out.md"
CONFIG = REPO / "deploy" / "otelcol-loadbalancing.yaml"


def test_the_pages_configuration_is_the_deployed_file() -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.DOTALL)
    assert blocks == [CONFIG.read_text()]


def test_the_configuration_routes_traces_by_trace_id_to_the_shards() -> None:
    config = yaml.safe_load(CONFIG.read_text())
    exporters = config["exporters"]
    traces, metrics = exporters["loadbalancing"], exporters["loadbalancing/metrics"]
    assert traces["routing_key"] == "traceID"
    assert metrics["routing_key"] != "traceID"  # the exporter refuses it for metrics
    for exporter in (traces, metrics):
        assert len(exporter["resolver"]) == 1  # the exporter takes one resolver
        assert "endpoint" not in exporter["protocol"]["otlp"]  # the resolver gives it
        hostnames = exporter["resolver"]["static"]["hostnames"]
        assert all(h.endswith(":4317") for h in hostnames)  # the shards' OTLP/gRPC port
    pipelines = config["service"]["pipelines"]
    assert pipelines["traces"] == {"receivers": ["otlp"], "exporters": ["loadbalancing"]}
    assert pipelines["metrics"]["exporters"] == ["loadbalancing/metrics"]
    assert set(config["receivers"]["otlp"]["protocols"]) == {"grpc", "http"}


def test_the_page_links_only_to_what_exists() -> None:
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", DOC.read_text()):
        assert (DOC.parent / target).exists(), target
