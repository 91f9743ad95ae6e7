"""Real catalogs load: ids are the servers' real names and intents are as long as agents send.

A real MCP catalog names its servers as their authors do ("MCP Jupiter", "pure.md MCP server",
non-Latin names, a name holding ':'), and an agent's intent may hold a pasted image (18,686
characters were seen). Loaded with `pml catalog load`, searched over gRPC and reported in
`ExecutionCompleted` events, they must all work; control characters are still refused.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
import redis

from pml.v1 import search_pb2
from pml_common.events import Streams
from pml_common.settings import Settings

pytestmark = pytest.mark.e2e

CATALOG = [
    {
        "id": "MCP Jupiter:jupiter_get_quote",
        "server": "MCP Jupiter",
        "name": "jupiter_get_quote",
        "description": "Get a quote for swapping one Solana token for another on Jupiter.",
        "input_schema": {"type": "object", "properties": {"inputMint": {"type": "string"}}},
    },
    {
        "id": "pure.md MCP server:unblock-url",
        "server": "pure.md MCP server",
        "name": "unblock-url",
        "description": "Fetch any web page as clean markdown, bypassing bot protection.",
        "input_schema": None,
    },
    {
        "id": "Яндекс Трекер:создать_задачу",
        "server": "Яндекс Трекер",
        "name": "создать_задачу",
        "description": "Создать новую задачу в очереди Яндекс Трекера.",
        "input_schema": None,
    },
    {
        "id": "Peekaboo MCP - Lightning-fast macOS Screenshots:image",
        "server": "Peekaboo MCP: Lightning-fast macOS Screenshots",
        "name": "image",
        "description": "Capture a screenshot of the macOS screen, an app or a window.",
        "input_schema": {"type": "object", "properties": {"app": {"type": "string"}}},
    },
]
SCREENSHOT = CATALOG[3]["id"]
#: What an agent sent: a request followed by a pasted PNG as text.
PASTED_INTENT = "take a screenshot of my screen and describe it " + "iVBORw0KGgoAAAANSUhEUg" * 850


def _write(tmp_path: Path, rows: list[dict[str, object]]) -> Path:
    path = tmp_path / "catalog.jsonl"
    path.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    return path


def _execution(tenant: str, steps: list[str], intent: str) -> dict[str, object]:
    return {
        "event_id": uuid.uuid4().hex,
        "type": "ExecutionCompleted",
        "version": 1,
        "occurred_at": datetime.now(UTC).isoformat(),
        "tenant_id": tenant,
        "trace": {},
        "intent": intent,
        "steps": [{"node_id": s, "success": True, "duration_ms": 5.0} for s in steps],
        "outcome": "success",
    }


def test_real_names_load_search_and_learn(
    search_stub, e2e_settings: Settings, pml, eventually, e2e_tenant: str, tmp_path: Path
) -> None:
    assert len(PASTED_INTENT) > 18_000
    loaded = pml("catalog", "load", str(_write(tmp_path, CATALOG)), "--tenant", e2e_tenant)
    assert loaded.returncode == 0, loaded.stderr

    for row in CATALOG:
        node = search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id=str(row["id"])), timeout=60
        )
        assert (node.id, node.server) == (row["id"], row["server"])
    reply = search_stub.Search(
        search_pb2.SearchRequest(tenant_id=e2e_tenant, query=PASTED_INTENT, limit=3), timeout=60
    )
    ranked = [r.id for r in reply.results]
    # What is embedded is the start, which asks for a screenshot (the lexical stage also
    # reads the pasted characters, which match nothing of the catalog).
    assert SCREENSHOT in ranked[:2], ranked
    hybrid = search_stub.SearchTools(
        search_pb2.SearchToolsRequest(
            tenant_id=e2e_tenant, query=PASTED_INTENT, context_tools=[CATALOG[0]["id"]], limit=3
        ),
        timeout=30,
    )
    assert SCREENSHOT in [t.tool_id for t in hybrid.tools]

    # The executor reports the run with the same intent: the trainer learns from it.
    client = redis.Redis.from_url(e2e_settings.redis_url)
    run = _execution(e2e_tenant, [str(CATALOG[2]["id"]), SCREENSHOT], PASTED_INTENT)
    client.xadd(Streams.EXECUTION_COMPLETED, {"data": json.dumps(run)})

    def stats() -> search_pb2.SearchResult:
        return search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id=SCREENSHOT), timeout=5
        )

    assert eventually(stats, lambda n: n.executions == 1, timeout=60).success_rate == 1.0
    letters = client.xrange(Streams.DEAD_LETTER, min="-", max="+")
    assert not [f for _, f in letters if f[b"event_id"].decode() == run["event_id"]]


@pytest.mark.parametrize(
    ("row", "fragment"),
    [
        ({**CATALOG[0], "id": "MCP Jupiter:quote\x1b[31m"}, "control characters"),
        ({**CATALOG[0], "id": "MCP Jupiter : quote"}, "spaces around"),
        ({**CATALOG[0], "id": "no separator"}, "<server>:<tool>"),
    ],
)
def test_control_characters_and_the_separator_rule_are_refused(
    search_stub, pml, e2e_tenant: str, tmp_path: Path, row: dict[str, object], fragment: str
) -> None:
    loaded = pml("catalog", "load", str(_write(tmp_path, [row])), "--tenant", e2e_tenant)
    assert loaded.returncode != 0
    assert fragment in loaded.stderr
    with pytest.raises(grpc.RpcError) as info:
        search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=e2e_tenant, id="MCP Jupiter:quote"), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
