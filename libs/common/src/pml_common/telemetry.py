"""OpenTelemetry tracing, metrics and structured logs, set up once in each composition root.

`setup_telemetry` installs the process's tracer and meter providers (the global state
OpenTelemetry requires); metrics go to the same OTLP collector as spans, every
`OTEL_METRIC_EXPORT_INTERVAL` ms (the SDK's variable, 60000 by default). Instruments are created
where they are measured, with `opentelemetry.metrics.get_meter`: the API hands out proxies
until the provider is installed, so module-level instruments work. `configure_logging` makes
every log line a structlog event carrying `trace_id`/`span_id` when it is emitted inside a
span, so logs and traces join up in the UI.
`inject_trace`/`extract_trace` carry the W3C context across Redis streams (`Event.trace`);
`in_trace_of` keeps what a batch handler publishes in the trace of the event it is for.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any, TextIO

import structlog
from opentelemetry import context, metrics, propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

from pml_common.settings import Settings

_HANDLER_NAME = "pml-structlog"


def setup_telemetry(
    service_name: str, settings: Settings, *, span_exporter: SpanExporter | None = None
) -> TracerProvider:
    """Install the global tracer provider, or return the one already installed.

    OpenTelemetry allows one global provider per process, so a second call (several services
    in one process, or several tests) reuses it; an explicit `span_exporter` is then added to
    it, which is what lets each test attach its own in-memory exporter.
    """
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        if span_exporter is not None:
            current.add_span_processor(SimpleSpanProcessor(span_exporter))
        return current

    resource = Resource.create({SERVICE_NAME: service_name})
    _setup_metrics(settings, resource)
    provider = TracerProvider(
        resource=resource,
        # ParentBased: a service never cuts a trace its caller decided to sample.
        sampler=ParentBased(TraceIdRatioBased(settings.otel_sample_ratio)),
    )
    if settings.otel_exporter_otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        endpoint = settings.otel_exporter_otlp_endpoint
        exporter = OTLPSpanExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        provider.add_span_processor(BatchSpanProcessor(exporter))
    if span_exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
    trace.set_tracer_provider(provider)
    return provider


def _setup_metrics(settings: Settings, resource: Resource) -> None:
    """Install the global meter provider, exporting over OTLP when a collector is configured."""
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return
    readers: list[MetricReader] = []
    if settings.otel_exporter_otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        endpoint = settings.otel_exporter_otlp_endpoint
        exporter = OTLPMetricExporter(endpoint=endpoint, insecure=endpoint.startswith("http://"))
        readers.append(PeriodicExportingMetricReader(exporter))
    metrics.set_meter_provider(MeterProvider(resource=resource, metric_readers=readers))


def inject_trace() -> dict[str, str]:
    """The current trace context as W3C headers (`traceparent`, `tracestate`)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def extract_trace(carrier: Mapping[str, str]) -> Context:
    """A context whose current span is the remote parent described by `carrier`."""
    return propagate.extract(dict(carrier))


@contextmanager
def in_trace_of(carrier: Mapping[str, str]) -> Iterator[None]:
    """Make the remote span `carrier` describes current, unless the current span is already in
    its trace. A batch handler works in a span of its own trace (linked to each event's), so
    what it publishes for one of the batch's events would leave that event's trace: published
    inside this, it continues it, and one document stays one trace through batched passes."""
    carried = extract_trace(carrier)
    remote = trace.get_current_span(carried).get_span_context()
    current = trace.get_current_span().get_span_context()
    if not remote.is_valid or (current.is_valid and current.trace_id == remote.trace_id):
        yield
        return
    token = context.attach(carried)
    try:
        yield
    finally:
        context.detach(token)


def _add_trace_ids(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
    """structlog processor: stamp the current span's ids so logs can be joined to traces."""
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event_dict.setdefault("trace_id", format(ctx.trace_id, "032x"))
        event_dict.setdefault("span_id", format(ctx.span_id, "016x"))
    return event_dict


def configure_logging(
    service_name: str, settings: Settings, *, stream: TextIO | None = None
) -> None:
    """Route structlog and standard-library logging through one renderer.

    Calling it again replaces the handler it installed (nothing piles up); `stream` defaults
    to stderr and exists for tests.
    """
    level = logging.getLevelNamesMapping().get(settings.log_level.upper(), logging.INFO)

    def add_service(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> Any:
        event_dict.setdefault("service", service_name)
        return event_dict

    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        add_service,
        _add_trace_ids,
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if settings.log_format == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.stdlib.PositionalArgumentsFormatter(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
