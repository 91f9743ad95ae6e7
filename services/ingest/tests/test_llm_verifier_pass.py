"""Pass 3 with the LLM verifier against a fake OpenAI-compatible server on loopback.

The server proposes a relation for every pair, with a quote it takes from the text when the
text has one, or an invented quote otherwise: only the former may become a relation.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import pytest

from pml_common.events import DocumentSubmitted
from pml_ingest.passes import RelationPass
from pml_ingest.verifier import LlmVerifier

SALES = """# Sales

## Quotes

The Billing Platform depends on the Pricing Engine for every invoice.

## Invoices

As documented, the Billing Platform depends on the Pricing Engine at month end.
"""

INVENTED = """# Stock

## North

Warehouse Robots and the Inventory Ledger are both in the north.

## South

Warehouse Robots and the Inventory Ledger are both in the south.
"""


class _FakeChat(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(
            {"path": self.path, "auth": self.headers.get("Authorization"), **body}
        )
        text = body["messages"][1]["content"]
        if "depends on" in text:
            span = "the Billing Platform depends on the Pricing Engine"
            forward = "billing" in text.splitlines()[0].lower()  # the line "A: <name>"
            answer = {
                "relation_type": "DEPENDS_ON",
                "direction": "A->B" if forward else "B->A",
                "evidence_span": span,
            }
        else:
            answer = {
                "relation_type": "REQUIRES",
                "direction": "A->B",
                "evidence_span": "Warehouse Robots require the Inventory Ledger",
            }
        payload = json.dumps({"choices": [{"message": {"content": json.dumps(answer)}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def fake_llm() -> Iterator[str]:
    _FakeChat.requests = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeChat)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


async def test_llm_proposals_stand_only_on_quotes_found_in_the_text(
    pipeline, settings, tenant, graph_db, fake_llm
) -> None:
    llm_settings = settings.model_copy(
        update={"pass3_verifier": "llm", "llm_verifier_url": fake_llm, "llm_verifier_model": "fake"}
    )
    verifier = LlmVerifier.from_settings(llm_settings)
    runtime = replace(pipeline.chunking.rt, settings=llm_settings)
    pipeline.pass3 = RelationPass(runtime, verifier)
    for doc, text in (("sales", SALES), ("stock", INVENTED)):
        await pipeline.run(
            DocumentSubmitted.create(tenant_id=tenant, document_id=doc, title="", text=text)
        )
    await verifier.close()

    assert _FakeChat.requests and all(
        r["path"] == "/v1/chat/completions" for r in _FakeChat.requests
    )
    assert all(r["model"] == "fake" for r in _FakeChat.requests)
    records, _, _ = await graph_db.execute_query(
        "MATCH (a:CanonicalConcept {tenant_id: $t})-[r]->(b:CanonicalConcept)"
        " RETURN type(r) AS type, a.canonical_name AS a, b.canonical_name AS b, properties(r) AS p",
        t=tenant,
    )
    [relation] = [r.data() for r in records]
    assert relation["type"] == "DEPENDS_ON"
    assert (relation["a"], relation["b"]) == ("billing platform", "pricing engine")
    assert relation["p"]["verifier"] == "llm"
    assert len(relation["p"]["evidence_context_ids"]) == 2
    # the invented quote about the warehouse was proposed, and refused
    assert any("Warehouse" in r["messages"][1]["content"] for r in _FakeChat.requests)
