"""The scorer running in-process on a real gRPC port, with the real Redis, Neo4j and embedder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest
from redis.asyncio import Redis

from pml.v1 import scorer_pb2_grpc
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings

if TYPE_CHECKING:
    from pml_scorer.main import ScorerApp


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[ScorerApp]:
    from pml_scorer.main import ScorerApp

    application = ScorerApp(settings, port=0)
    await application.start()
    yield application
    await application.stop()


@pytest.fixture
async def stub(app: ScorerApp) -> AsyncIterator[scorer_pb2_grpc.ScorerServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield scorer_pb2_grpc.ScorerServiceStub(channel)


@pytest.fixture
def registry(redis: Redis, settings: Settings) -> ModelRegistry:
    return ModelRegistry(redis, settings.model_keep_versions)
