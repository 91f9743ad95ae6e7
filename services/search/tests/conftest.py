"""The search service running in-process on a real gRPC port, with real stores and embedder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import grpc
import pytest

from pml.v1 import search_pb2_grpc
from pml_common.settings import Settings

if TYPE_CHECKING:
    from pml_search.main import SearchApp


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[SearchApp]:
    from pml_search.main import SearchApp

    application = SearchApp(settings, port=0)
    await application.start()
    yield application
    await application.stop()


@pytest.fixture
async def stub(app: SearchApp) -> AsyncIterator[search_pb2_grpc.SearchServiceStub]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        yield search_pb2_grpc.SearchServiceStub(channel)
