"""Services run by their own composition roots (`serve`), in this process, exporting to memory.

Each service's `serve(settings)` is what `python -m pml_<service>` runs; here it runs as a task
of the test's event loop instead of a process, on its own free port, and is stopped by
cancelling the task (its `finally` stops the server, the bus and the clients as SIGTERM does).
All of them share this process's tracer provider, to which an in-memory exporter is attached.
Nothing but the carriers links their spans: gRPC metadata between services and the `trace`
field of events on Redis Streams. The tests check that every hop's parent is a remote span
context, so a link made by in-process context would fail them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from pml_common.healthcheck import check

Serve = Callable[[], Coroutine[Any, Any, None]]


@contextlib.asynccontextmanager
async def serving(services: Sequence[tuple[str, Serve, str]]) -> AsyncIterator[None]:
    """Run each `(name, serve, address)` as a task until its gRPC health answers SERVING."""
    tasks: list[asyncio.Task[None]] = []
    try:
        for name, serve, address in services:
            task = asyncio.create_task(serve(), name=name)
            tasks.append(task)
            await _healthy(name, task, address)
        yield
    finally:
        for task in reversed(tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def _healthy(
    name: str, task: asyncio.Task[None], address: str, within_s: float = 120
) -> None:
    deadline = time.monotonic() + within_s
    while not await asyncio.to_thread(check, address, 1.0):
        if task.done():
            task.result()  # raises what stopped it
            pytest.fail(f"{name} returned during start-up")
        if time.monotonic() > deadline:
            pytest.fail(f"{name} not SERVING at {address} after {within_s}s")
        await asyncio.sleep(0.1)


class Trace:
    """The finished spans of one trace, with parent/child navigation."""

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self.spans = list(spans)
        self.by_id = {s.context.span_id: s for s in self.spans}

    @classmethod
    def of(cls, exporter: InMemorySpanExporter, trace_id: int) -> Trace:
        return cls([s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id])

    def names(self) -> set[str]:
        return {s.name for s in self.spans}

    def named(self, name: str, kind: SpanKind | None = None) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name and (kind is None or s.kind is kind)]

    def one(self, name: str, kind: SpanKind | None = None) -> ReadableSpan:
        found = self.named(name, kind)
        assert len(found) == 1, f"{len(found)} spans named {name!r} ({kind}) in {self.names()}"
        return found[0]

    def parent(self, span: ReadableSpan) -> ReadableSpan:
        assert span.parent is not None, f"{span.name} is a root"
        assert span.parent.span_id in self.by_id, f"parent of {span.name} is not in the trace"
        return self.by_id[span.parent.span_id]

    def children(self, span: ReadableSpan) -> list[ReadableSpan]:
        return [
            s
            for s in self.spans
            if s.parent is not None and s.parent.span_id == span.context.span_id
        ]

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s.parent is None]

    def assert_one_tree(self) -> ReadableSpan:
        """One root, and every other span's parent is in the trace: nothing is cut off."""
        (root,) = self.roots()
        for span in self.spans:
            if span is not root:
                self.parent(span)
        return root


def assert_remote_child(trace: Trace, child: ReadableSpan, parent: ReadableSpan) -> None:
    """`child` continues `parent` through a carrier (gRPC metadata, an event's `trace`)."""
    assert trace.parent(child) is parent, f"{child.name} is not a child of {parent.name}"
    assert child.parent is not None and child.parent.is_remote, (
        f"{child.name} was not parented through a carrier"
    )


def assert_local_child(trace: Trace, child: ReadableSpan, parent: ReadableSpan) -> None:
    assert trace.parent(child) is parent, f"{child.name} is not a child of {parent.name}"
    assert child.parent is not None and not child.parent.is_remote
