"""Fixtures of the trainer's tests: a graph store on the suite's real Neo4j."""

from __future__ import annotations

import neo4j
import pytest

from pml_common.settings import Settings
from pml_trainer.graph_store import GraphStore


@pytest.fixture
def driver(graph_db: neo4j.AsyncDriver) -> neo4j.AsyncDriver:
    """The trainer's tests call the suite's Neo4j driver `driver`."""
    return graph_db


@pytest.fixture
async def store(driver: neo4j.AsyncDriver, settings: Settings) -> GraphStore:
    graph = GraphStore(driver, settings.neo4j_database)
    await graph.ensure_schema()
    return graph
