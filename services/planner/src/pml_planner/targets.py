"""Where the planner's target capability comes from: SHGAT, or search before SHGAT knows.

Seed 000: the target of PREDICTION and SUGGESTION is SHGAT's best capability for the intent.
Before the tenant has a trained model (the scorer answers `untrained`), or when the scorer
cannot be reached, unified search ranks the capabilities instead, and the answer says so.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import grpc  # type: ignore[import-untyped, unused-ignore]
import structlog

from pml.v1 import scorer_pb2, scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_common.grpc_server import dependency
from pml_planner.planning import Candidate

log = structlog.get_logger(__name__)

#: Capabilities considered as the target; the planner weighs each by its DAG's reliability.
TARGET_POOL = 5
#: The planner's calls to search in flight at most; the others wait their turn. A request that
#: states several sub-goals asks search once per sub-goal at once, and search refuses what
#: passes its own limit (`grpc_workers`, 16 by default, shared with every other client).
SEARCH_IN_FLIGHT = 8
UNTRAINED = "untrained"


@dataclass(frozen=True)
class Targets:
    candidates: tuple[Candidate, ...]
    source: str  # "shgat:<version>" or "search"


class TargetSource:
    def __init__(
        self,
        scorer: scorer_pb2_grpc.ScorerServiceStub,
        search: search_pb2_grpc.SearchServiceStub,
        timeout_s: float = 5.0,
        search_in_flight: int = SEARCH_IN_FLIGHT,
    ) -> None:
        self._scorer = scorer
        self._search = search
        self._timeout = timeout_s
        self._search_slots = asyncio.Semaphore(search_in_flight)

    async def capabilities(self, tenant: str, intent: str) -> Targets:
        try:
            reply = await self._scorer.ScoreCapabilities(
                scorer_pb2.ScoreRequest(tenant_id=tenant, text=intent, top_k=TARGET_POOL),
                timeout=self._timeout,
            )
            if reply.model_version != UNTRAINED and reply.scores:
                scored = tuple(Candidate(s.id, s.score) for s in reply.scores)
                return Targets(scored, f"shgat:{reply.model_version}")
        except grpc.aio.AioRpcError as exc:
            log.warning("planner.scorer_unavailable", tenant=tenant, code=exc.code().name)
        found = await self._searched(tenant, intent, TARGET_POOL, search_pb2.NODE_KIND_CAPABILITY)
        return Targets(tuple(found), "search")

    async def tools(self, tenant: str, intent: str, limit: int) -> list[Candidate]:
        return await self._searched(tenant, intent, limit, search_pb2.NODE_KIND_TOOL)

    async def _searched(
        self, tenant: str, intent: str, limit: int, kind: search_pb2.NodeKind.ValueType
    ) -> list[Candidate]:
        """Unified search's order of one kind of node, scored by its final score. Search is
        the planner's last resort: when it fails, the caller learns that search did."""
        async with self._search_slots, dependency("search", self._timeout):
            reply = await self._search.Search(
                search_pb2.SearchRequest(tenant_id=tenant, query=intent, limit=limit, kinds=[kind]),
                timeout=self._timeout,
            )
        return [Candidate(r.id, r.final_score) for r in reply.results]
