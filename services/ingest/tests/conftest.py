"""The passes in-process against the suite's real Redis and Neo4j, events delivered by hand."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from pml_common.events import (
    ChunkingCompleted,
    DocumentDeleted,
    DocumentSubmitted,
    Event,
    Pass1Completed,
    Pass2aCompleted,
    Pass2bCompleted,
)
from pml_common.latest_wins import LatestWins
from pml_common.settings import Settings
from pml_common.telemetry import inject_trace
from pml_ingest.extraction import ConceptExtractor
from pml_ingest.graph_store import GraphStore
from pml_ingest.passes import (
    ChunkingPass,
    ClassifyPass,
    ConceptPass,
    PassRuntime,
    RelationPass,
    TopicPass,
)
from pml_ingest.status import StatusStore

_EXTRACTOR = ConceptExtractor()  # spaCy pipelines load once for the whole session


@dataclass
class Recorder:
    """A publisher that keeps what the passes publish, each event carrying the trace it was
    published in (as the bus's `publish` stamps it)."""

    events: list[Event] = field(default_factory=list)

    async def publish(self, event: Event) -> str:
        self.events.append(event.model_copy(update={"trace": inject_trace()}))
        return str(len(self.events))

    def of(self, kind: type[Event]) -> list[Event]:
        return [e for e in self.events if isinstance(e, kind)]


@dataclass
class Pipeline:
    """The five passes wired to one recorder; `run` drives a document to the end."""

    store: GraphStore
    status: StatusStore
    recorder: Recorder
    chunking: ChunkingPass
    pass1: ConceptPass
    pass2a: TopicPass
    pass2b: ClassifyPass
    pass3: RelationPass

    async def run(self, event: DocumentSubmitted | DocumentDeleted) -> None:
        """Deliver `event`, then every event the passes publish, until nothing is left."""
        queue: list[Event] = [event]
        while queue:
            current = queue.pop(0)
            before = len(self.recorder.events)
            await self._deliver(current)
            queue.extend(self.recorder.events[before:])

    async def _deliver(self, event: Event) -> None:
        if isinstance(event, DocumentSubmitted):
            await self.chunking.on_submitted(event)
        elif isinstance(event, DocumentDeleted):
            await self.chunking.on_deleted(event)
        elif isinstance(event, ChunkingCompleted):
            await self.pass1.handle(event)
        elif isinstance(event, Pass1Completed):
            await self.pass2a.handle(event)
        elif isinstance(event, Pass2aCompleted):
            await self.pass2b.handle(event)
        elif isinstance(event, Pass2bCompleted):
            await self.pass3.handle(event)


@pytest.fixture
async def pipeline(settings: Settings, graph_db, redis) -> AsyncIterator[Pipeline]:
    store = GraphStore(graph_db, settings.neo4j_database, write_batch=3)
    await store.ensure_schema()
    recorder = Recorder()
    claims = LatestWins(redis, f"test-{uuid.uuid4().hex[:8]}")
    runtime = PassRuntime(store, StatusStore(redis), recorder, settings, claims)
    yield Pipeline(
        store,
        runtime.status,
        recorder,
        ChunkingPass(runtime),
        ConceptPass(runtime, _EXTRACTOR),
        TopicPass(runtime),
        ClassifyPass(runtime),
        RelationPass(runtime),
    )


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
