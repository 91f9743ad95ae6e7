"""A gateway registers a catalog, an executor reports runs in which one tool keeps failing,
and the gateway sees that tool drop in Search: only public interfaces are used."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from pml.v1 import search_pb2
from pml_cli.main import DEMO_CATALOG
from pml_common.events import Streams
from pml_common.settings import Settings

pytestmark = pytest.mark.e2e

QUERY = "read the contents of a file"


def _ranking(stub, tenant: str) -> list[str]:
    reply = stub.Search(
        search_pb2.SearchRequest(
            tenant_id=tenant, query=QUERY, limit=10, kinds=[search_pb2.NODE_KIND_TOOL]
        ),
        timeout=10,
    )
    return [r.id for r in reply.results]


def _execution(tenant: str, tool: str, success: bool) -> dict:
    return {
        "event_id": uuid.uuid4().hex,
        "type": "ExecutionCompleted",
        "version": 1,
        "occurred_at": datetime.now(UTC).isoformat(),
        "tenant_id": tenant,
        "trace": {},
        "intent": QUERY,
        "steps": [{"node_id": tool, "success": success, "duration_ms": 5.0}],
        "outcome": "success" if success else "failure",
    }


def test_failing_tool_drops_in_search(
    search_stub, e2e_settings: Settings, pml, eventually, e2e_tenant: str
) -> None:
    loaded = pml("catalog", "load", str(DEMO_CATALOG), "--tenant", e2e_tenant)
    assert loaded.returncode == 0, loaded.stderr

    before = _ranking(search_stub, e2e_tenant)
    top = before[0]
    assert top.startswith("filesystem:read"), before

    # The executor publishes raw stream entries, as any language's Redis client can.
    client = redis.Redis.from_url(e2e_settings.redis_url)
    for _ in range(6):
        payload = json.dumps(_execution(e2e_tenant, top, success=False))
        client.xadd(Streams.EXECUTION_COMPLETED, {"data": payload})

    def stats() -> search_pb2.SearchResult:
        return search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id=top), timeout=5
        )

    reply = eventually(stats, lambda n: n.executions == 6, timeout=60)
    assert reply.success_rate == 0.0
    assert reply.reliability_factor == pytest.approx(0.1)
    after = _ranking(search_stub, e2e_tenant)
    assert top not in after[:3], after
    assert after[0] != top


def test_cli_publish_execution_is_consumed(
    search_stub, pml, eventually, e2e_tenant: str, tmp_path: Path
) -> None:
    assert pml("catalog", "load", str(DEMO_CATALOG), "--tenant", e2e_tenant).returncode == 0
    runs = tmp_path / "runs.jsonl"
    runs.write_text(
        "\n".join(
            json.dumps(
                {
                    "intent": "commit my work",
                    "steps": [
                        {"node_id": "git:git_add", "success": True},
                        {"node_id": "git:git_commit", "success": True},
                    ],
                    "outcome": "success",
                }
            )
            for _ in range(3)
        )
    )
    published = pml("publish", "execution", str(runs), "--tenant", e2e_tenant)
    assert published.returncode == 0, published.stderr

    def commit_stats():
        return search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id="git:git_commit"), timeout=5
        )

    node = eventually(commit_stats, lambda n: n.executions == 3, timeout=60)
    assert node.success_rate == 1.0
    assert node.reliability_factor == pytest.approx(1.2)
