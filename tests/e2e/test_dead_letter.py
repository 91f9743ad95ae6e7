"""Malformed events and unknown versions are dead-lettered with their reason; consuming goes on."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
import redis

from pml.v1 import search_pb2
from pml_cli.main import DEMO_CATALOG
from pml_common.events import Streams

pytestmark = pytest.mark.e2e


def _dead_letters(client: redis.Redis) -> list[dict[bytes, bytes]]:
    return [fields for _, fields in client.xrange(Streams.DEAD_LETTER)]


def test_poison_events_are_dead_lettered_and_consumption_continues(
    search_stub, e2e_settings, pml, eventually, e2e_tenant: str
) -> None:
    assert pml("catalog", "load", str(DEMO_CATALOG), "--tenant", e2e_tenant).returncode == 0
    client = redis.Redis.from_url(e2e_settings.redis_url)
    marker = uuid.uuid4().hex
    good = {
        "event_id": uuid.uuid4().hex,
        "type": "ExecutionCompleted",
        "version": 1,
        "occurred_at": datetime.now(UTC).isoformat(),
        "tenant_id": e2e_tenant,
        "trace": {},
        "intent": "fetch a page",
        "steps": [{"node_id": "fetch:fetch", "success": True}],
        "outcome": "success",
    }
    poison = [
        "{not json " + marker,
        json.dumps({**good, "event_id": f"v9-{marker}", "version": 9}),
        json.dumps({**good, "event_id": f"bad-{marker}", "outcome": "exploded"}),
    ]
    for payload in poison:
        client.xadd(Streams.EXECUTION_COMPLETED, {"data": payload})
    client.xadd(Streams.EXECUTION_COMPLETED, {"data": json.dumps(good)})

    def fetch_runs() -> int:
        reply = search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id="fetch:fetch"), timeout=5
        )
        return reply.executions

    eventually(fetch_runs, lambda n: n == 1, timeout=60)

    def ours() -> list[str]:
        return [
            fields.get(b"reason", b"").decode()
            for fields in _dead_letters(client)
            if marker.encode() in fields.get(b"payload", b"")
            or marker.encode() in fields.get(b"event_id", b"")
        ]

    reasons = eventually(ours, lambda r: len(r) >= 3, timeout=30)
    joined = " | ".join(reasons)
    assert "not JSON" in joined
    assert "unsupported version 9" in joined
    assert "outcome" in joined
