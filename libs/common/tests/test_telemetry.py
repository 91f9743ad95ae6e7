"""Tracing setup, W3C context propagation helpers, and structured logs joined to traces."""

from __future__ import annotations

import io
import json
import logging
import subprocess
import sys
import textwrap
from collections.abc import Iterator

import pytest
import structlog
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from pml_common.settings import Settings
from pml_common.telemetry import configure_logging, extract_trace, inject_trace, setup_telemetry


def run_fresh_process(code: str) -> str:
    """Run `code` in a new interpreter: the global tracer provider can be set once per process."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_provider_is_installed_once_and_exports_to_given_exporter() -> None:
    settings = Settings()
    first = InMemorySpanExporter()
    provider = setup_telemetry("svc-a", settings, span_exporter=first)
    assert isinstance(provider, TracerProvider)
    assert trace.get_tracer_provider() is provider
    second = InMemorySpanExporter()
    assert setup_telemetry("svc-b", settings, span_exporter=second) is provider
    with trace.get_tracer("t").start_as_current_span("work") as span:
        pass
    for exporter in (first, second):
        ids = [s.context.span_id for s in exporter.get_finished_spans()]
        assert span.get_span_context().span_id in ids


def test_resource_sampler_and_otlp_exporter_in_a_fresh_process() -> None:
    out = run_fresh_process(
        """
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from pml_common.settings import Settings
        from pml_common.telemetry import setup_telemetry

        exporter = InMemorySpanExporter()
        settings = Settings(otel_sample_ratio=0.0,
                            otel_exporter_otlp_endpoint="http://127.0.0.1:1")
        provider = setup_telemetry("planner", settings, span_exporter=exporter)
        with trace.get_tracer("t").start_as_current_span("dropped"):
            pass
        processors = provider._active_span_processor._span_processors
        otlp = [p for p in processors if isinstance(p, BatchSpanProcessor)]
        print(provider.resource.attributes["service.name"])
        print(len(exporter.get_finished_spans()))
        print(len(otlp))
        """
    )
    assert out.split() == ["planner", "0", "1"]


def test_inject_then_extract_continues_the_trace() -> None:
    setup_telemetry("svc", Settings(), span_exporter=InMemorySpanExporter())
    assert inject_trace() == {}  # nothing to propagate outside a span
    with trace.get_tracer("t").start_as_current_span("producer") as span:
        carrier = inject_trace()
    ctx = span.get_span_context()
    assert carrier["traceparent"].startswith(f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-")
    parent = trace.get_current_span(extract_trace(carrier)).get_span_context()
    assert parent.is_remote
    assert (parent.trace_id, parent.span_id) == (ctx.trace_id, ctx.span_id)
    with trace.get_tracer("t").start_as_current_span("consumer", context=extract_trace(carrier)):
        child = trace.get_current_span()
    assert child.get_span_context().trace_id == ctx.trace_id
    assert child.parent is not None and child.parent.span_id == ctx.span_id  # type: ignore[attr-defined]


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.mark.usefixtures("restore_logging")
def test_json_logs_carry_service_level_and_trace_ids() -> None:
    setup_telemetry("svc", Settings(), span_exporter=InMemorySpanExporter())
    out = io.StringIO()
    configure_logging("trainer", Settings(log_format="json", log_level="INFO"), stream=out)
    log = structlog.get_logger("pml.test")
    log.info("outside", answer=42)
    log.debug("hidden at INFO")
    with trace.get_tracer("t").start_as_current_span("work") as span:
        log.warning("inside", tool="fs:read")
        logging.getLogger("some.library").error("stdlib %s", "too")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    ctx = span.get_span_context()
    assert [line["event"] for line in lines] == ["outside", "inside", "stdlib too"]
    outside, inside, stdlib = lines
    assert outside["answer"] == 42 and outside["level"] == "info"
    assert outside["service"] == "trainer"
    assert "trace_id" not in outside
    for line in (inside, stdlib):
        assert line["trace_id"] == f"{ctx.trace_id:032x}"
        assert line["span_id"] == f"{ctx.span_id:016x}"
        assert line["service"] == "trainer"
        assert "timestamp" in line
    assert inside["level"] == "warning" and inside["tool"] == "fs:read"
    assert stdlib["level"] == "error"


@pytest.mark.usefixtures("restore_logging")
def test_console_logs_and_reconfiguring_does_not_duplicate() -> None:
    out = io.StringIO()
    settings = Settings(log_format="console", log_level="DEBUG")
    configure_logging("search", settings, stream=out)
    configure_logging("search", settings, stream=out)
    structlog.get_logger("pml.test").debug("hello console", k="v")
    text = out.getvalue()
    assert text.count("hello console") == 1
    assert "k=v" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text.splitlines()[0])
