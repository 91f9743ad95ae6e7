"""Fixtures of the trainer's tests: a graph store on the suite's real Neo4j."""

from __future__ import annotations

from collections.abc import AsyncIterator

import neo4j
import pytest

from pml_common.settings import Settings
from pml_common.stores import neo4j_driver
from pml_trainer.graph_store import GraphStore


@pytest.fixture
async def driver(settings: Settings) -> AsyncIterator[neo4j.AsyncDriver]:
    drv = neo4j_driver(settings)
    try:
        yield drv
    finally:
        await drv.close()


@pytest.fixture
async def store(driver: neo4j.AsyncDriver, settings: Settings) -> GraphStore:
    graph = GraphStore(driver, settings.neo4j_database)
    await graph.ensure_schema()
    return graph
