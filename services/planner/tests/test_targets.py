"""TargetSource: the planner's calls to search stay within what search accepts at once."""

from __future__ import annotations

import asyncio

import grpc

from pml.v1 import scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_common.grpc_server import RequestError
from pml_planner.targets import TargetSource

from .helpers import stand_in_server

#: What the stand-in search accepts at once (a real search refuses past `grpc_workers`).
ACCEPTED = 2


class _SlowSearch(search_pb2_grpc.SearchServiceServicer):
    async def Search(
        self, request: search_pb2.SearchRequest, context: grpc.aio.ServicerContext
    ) -> search_pb2.SearchResponse:
        await asyncio.sleep(0.05)
        return search_pb2.SearchResponse(
            results=[search_pb2.SearchResult(id="s:a", kind=request.kinds[0], final_score=0.9)]
        )


async def _sub_goals_at_once(in_flight: int) -> list[object]:
    """Ten clause searches of one request fired at once, through a TargetSource that keeps at
    most `in_flight` of them running."""
    async with stand_in_server(_SlowSearch(), maximum_concurrent_rpcs=ACCEPTED) as channel:
        source = TargetSource(
            scorer_pb2_grpc.ScorerServiceStub(channel),
            search_pb2_grpc.SearchServiceStub(channel),
            search_in_flight=in_flight,
        )
        calls = (source.tools("t", f"clause {i}", 3) for i in range(10))
        return await asyncio.gather(*calls, return_exceptions=True)


async def test_clause_searches_wait_their_turn_instead_of_being_refused() -> None:
    answers = await _sub_goals_at_once(ACCEPTED)
    assert all(isinstance(a, list) and [c.id for c in a] == ["s:a"] for a in answers)


async def test_without_the_bound_search_refuses_some() -> None:
    answers = await _sub_goals_at_once(10)
    refused = [a for a in answers if isinstance(a, RequestError)]
    assert refused, "the stand-in accepts only a few at once: the bound above is what helps"
    assert all(a.code == grpc.StatusCode.UNAVAILABLE for a in refused)
    assert all("RESOURCE_EXHAUSTED" in a.message for a in refused)
