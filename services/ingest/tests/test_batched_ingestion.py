"""The passes handling batches of documents build exactly the graph they build one document at a
time: every node and relationship of the tenant, with its properties, compared (real Neo4j)."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import neo4j
import pytest
from redis.asyncio import Redis

from pml_common.events import (
    ChunkingCompleted,
    DocumentSubmitted,
    Event,
    Pass1Completed,
    Pass2aCompleted,
    Pass2bCompleted,
    Pass3Completed,
    _PassCompleted,
)
from pml_common.latest_wins import LatestWins
from pml_common.settings import Settings
from pml_ingest.extraction import ConceptExtractor
from pml_ingest.graph_store import GraphStore
from pml_ingest.passes import (
    ChunkingPass,
    ClassifyPass,
    ConceptPass,
    Pass,
    PassRuntime,
    RelationPass,
    TopicPass,
)
from pml_ingest.status import StatusStore

_EXTRACTOR = ConceptExtractor()

# Documents sharing concepts (so concepts, COVERS and relations get contributions from several
# documents of one batch), in two languages, one with more mentions than a transaction takes.
CORPUS = {
    "sales": """# Sales Process

## 1 Quotations

Solution Quotation Management prepares every offer for the customer.
Service Contract Execution requires Solution Quotation Management.

## 2 Contracts

Service Contract Execution requires Solution Quotation Management to have approved the offer.
The signed contract starts Service Contract Execution.
""",
    "quotes": """# Quotations

## Master data

Solution Quotation Management requires Customer Master Data.
The customer portal enables Solution Quotation Management.

## Approval

Solution Quotation Management requires Customer Master Data before any approval.
Service Contract Execution requires the customer portal.
""",
    "digital": """# Digital Transformation

Digital Transformation changes how companies work. AI-assisted Cloud Transformation moves
workloads to the cloud. Digital Transformation requires Cloud Transformation.
""",
    "ventes": """# Processus de vente

La gestion des devis prépare chaque offre pour le client. Le contrat de service nécessite la
gestion des devis.
""",
    "cloud": """# Cloud

## Migration

Cloud Transformation requires the customer portal. The Digital Transformation office
enables Cloud Transformation.

## Operations

Cloud Transformation requires the customer portal and Customer Master Data.
""",
    "inventory": "# Inventory\n\n"
    + " ".join(
        f"The {name} Gateway requires the {name} Ledger and the {name} Router."
        for name in ("Alpha", "Beta", "Gamma", "Delta", "Epsilon", "Zeta", "Eta", "Theta")
    )
    + "\n",
    "portal": """# Customer portal

The customer portal requires Customer Master Data. The Alpha Gateway enables the customer
portal. Solution Quotation Management needs the customer portal.
""",
}

#: Mentions per transaction: "inventory" takes more than one alone.
WRITE_BATCH = 40
#: Ignored: set when written, so never equal in two runs.
TIMESTAMPS = frozenset({"created_at", "updated_at", "submitted_at", "tenant_id"})

_NODES = """
MATCH (n {tenant_id: $t})
RETURN labels(n) AS labels, properties(n) AS props
"""

_RELATIONSHIPS = """
MATCH (a {tenant_id: $t})-[r]->(b {tenant_id: $t})
RETURN type(r) AS type, properties(r) AS props, properties(a) AS a, properties(b) AS b
"""


def _key(props: dict[str, Any]) -> str:
    for name in ("context_id", "document_id", "canonical_name", "topic_id"):
        if name in props:
            return f"{name}={props[name]}"
    raise AssertionError(f"node without a key: {props}")


def _clean(props: dict[str, Any]) -> str:
    return repr(sorted((k, v) for k, v in props.items() if k not in TIMESTAMPS))


async def dump(driver: neo4j.AsyncDriver, tenant: str) -> list[str]:
    """Every node and relationship of the tenant with its properties, sorted, timestamps out."""
    nodes, _, _ = await driver.execute_query(_NODES, {"t": tenant})
    rels, _, _ = await driver.execute_query(_RELATIONSHIPS, {"t": tenant})
    rows = [f"node {sorted(r['labels'])} {_clean(r['props'])}" for r in nodes]
    rows += [f"rel {_key(r['a'])} -{r['type']}-> {_key(r['b'])} {_clean(r['props'])}" for r in rels]
    return sorted(rows)


class Recorder:
    def __init__(self) -> None:
        self.events: list[Event] = []

    async def publish(self, event: Event) -> str:
        self.events.append(event)
        return str(len(self.events))

    def take(self, kind: type[Event]) -> list[Any]:
        taken = [e for e in self.events if isinstance(e, kind)]
        self.events = [e for e in self.events if not isinstance(e, kind)]
        return taken


Deliver = Callable[[Pass, Sequence[_PassCompleted]], Awaitable[None]]
Submit = Callable[[ChunkingPass, Sequence[DocumentSubmitted]], Awaitable[None]]


async def ingest(
    settings: Settings,
    driver: neo4j.AsyncDriver,
    redis: Redis,
    tenant: str,
    deliver: Deliver,
    submit: Submit | None = None,
) -> None:
    """The corpus through every pass, pass after pass; `submit` hands chunking the
    submissions (one at a time by default), `deliver` the other passes their events."""
    store = GraphStore(driver, settings.neo4j_database, write_batch=WRITE_BATCH)
    await store.ensure_schema()
    recorder = Recorder()
    claims = LatestWins(redis, f"test-{uuid.uuid4().hex[:8]}")
    runtime = PassRuntime(store, StatusStore(redis), recorder, settings, claims)
    submitted = [
        DocumentSubmitted.create(tenant_id=tenant, document_id=doc, title="", text=text)
        for doc, text in CORPUS.items()
    ]
    await (submit or submit_one_at_a_time)(ChunkingPass(runtime), submitted)
    passes: list[tuple[Pass, type[Event]]] = [
        (ConceptPass(runtime, _EXTRACTOR), ChunkingCompleted),
        (TopicPass(runtime), Pass1Completed),
        (ClassifyPass(runtime), Pass2aCompleted),
        (RelationPass(runtime), Pass2bCompleted),
    ]
    for handler, consumes in passes:
        await deliver(handler, recorder.take(consumes))
    assert len(recorder.take(Pass3Completed)) == len(CORPUS)
    for doc in CORPUS:
        status = await runtime.status.get(tenant, doc)
        assert status is not None and status.done, status


async def submit_one_at_a_time(chunking: ChunkingPass, events: Sequence[DocumentSubmitted]) -> None:
    for event in events:
        await chunking.on_submitted(event)


async def submit_in_batches(chunking: ChunkingPass, events: Sequence[DocumentSubmitted]) -> None:
    for start in range(0, len(events), 3):
        await chunking.on_submitted_batch(events[start : start + 3])


async def one_at_a_time(handler: Pass, events: Sequence[_PassCompleted]) -> None:
    for event in events:
        await handler.handle(event)


async def in_batches(handler: Pass, events: Sequence[_PassCompleted]) -> None:
    for start in range(0, len(events), 3):  # 3, 3, 1: batches, and a batch of one
        await handler.handle_batch(events[start : start + 3])


@pytest.fixture
def batch_settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"ingest_write_batch": WRITE_BATCH})


# Two ingestions of the corpus pass by pass: well within the default on a quiet machine, not on
# a busy one.
@pytest.mark.timeout(900)
async def test_batches_build_the_same_graph_as_one_document_at_a_time(
    batch_settings: Settings, graph_db: neo4j.AsyncDriver, redis: Redis, tenant: str
) -> None:
    alone, batched = f"{tenant}-alone", f"{tenant}-batched"
    await ingest(batch_settings, graph_db, redis, alone, one_at_a_time)
    await ingest(batch_settings, graph_db, redis, batched, in_batches, submit_in_batches)
    reference = await dump(graph_db, alone)
    # Not a trivial graph: concepts, topics, COVERS and evidenced relations are all there.
    text = "\n".join(reference)
    for part in ("CanonicalConcept", "-COVERS->", "-HAS_TOPIC->", "-REQUIRES->", "'fr'"):
        assert part in text, part
    assert await dump(graph_db, batched) == reference


async def test_a_stale_event_in_a_batch_is_skipped_and_the_others_go_on(
    batch_settings: Settings, graph_db: neo4j.AsyncDriver, redis: Redis, tenant: str
) -> None:
    seen: list[list[str]] = []

    async def stale_first(handler: Pass, events: Sequence[_PassCompleted]) -> None:
        if isinstance(handler, ConceptPass):
            # An event naming an older version of a document: skipped, the others handled.
            old = events[0].model_copy(update={"content_hash": "an older version"})
            events = [old, *events]
        seen.append([e.document_id for e in events])
        await handler.handle_batch(events)

    await ingest(batch_settings, graph_db, redis, tenant, stale_first)
    assert seen[0][0] == seen[0][1]  # the stale one and the current one of the same document
