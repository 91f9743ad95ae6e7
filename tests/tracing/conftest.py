"""The in-memory exporter the tracing tests read (see `traces` for how services run)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pml_common.settings import Settings
from pml_common.telemetry import setup_telemetry


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    setup_telemetry("pml-tracing-test", Settings(), span_exporter=exporter)
    return exporter
