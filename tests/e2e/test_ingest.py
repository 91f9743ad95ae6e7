"""Knowledge ingestion end to end: the ingest service, its five pass workers and search as
real processes, driven through gRPC, the `pml` command and the event streams.

The graph itself has no read RPC of its own (the knowledge service reads it), so the
duplicate and lifecycle checks read Neo4j, read-only.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from neo4j import GraphDatabase

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_cli.local_stack import LocalStack, settings_to_env, start_ingest_worker
from pml_common.events import Streams
from pml_common.local_runtime import ManagedProcess, free_port
from pml_common.settings import Settings

pytestmark = pytest.mark.e2e

PASSES = ("chunking", "pass1", "pass2a", "pass2b", "pass3")

CORPUS = {
    "sales.md": """# Sales Process

## 1 Quotations

Solution Quotation Management prepares every offer for the customer.
Service Contract Execution requires Solution Quotation Management.

## 2 Contracts

Service Contract Execution requires Solution Quotation Management to have approved the offer.
The signed contract starts Service Contract Execution.
""",
    "digital.md": """# Digital Transformation

Digital Transformation changes how companies work. AI-assisted Cloud Transformation moves
workloads to the cloud.
""",
    "support.txt": """Support handbook

Service Contract Execution requires Solution Quotation Management in every region.

Support tickets are answered within a day.
""",
    "ventes.md": """# Processus de vente

La gestion des devis prépare chaque offre pour le client. Le contrat de service nécessite la
gestion des devis.
""",
}


@pytest.fixture(scope="module")
def system(
    redis_server: ManagedProcess,
    neo4j_server: ManagedProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalStack]:
    state = tmp_path_factory.mktemp("e2e-ingest")
    stack = LocalStack.on_free_ports(
        state, reclaim_idle_ms=1000, max_deliveries=2, log_format="console"
    )
    stack.settings = stack.settings.model_copy(
        update={"redis_url": redis_server.url, "neo4j_uri": neo4j_server.url}
    )
    try:
        stack.start_services(["search", "ingest"])
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def settings(system: LocalStack) -> Settings:
    return system.settings


@pytest.fixture
def stub(settings: Settings) -> Iterator[ingest_pb2_grpc.IngestServiceStub]:
    with grpc.insecure_channel(settings.ingest_addr) as channel:
        yield ingest_pb2_grpc.IngestServiceStub(channel)


@pytest.fixture
def tenant() -> str:
    return f"e2e-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    folder = tmp_path / "corpus"
    folder.mkdir()
    for name, text in CORPUS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture
def pml(settings: Settings) -> Callable[..., Any]:
    import os
    import subprocess
    import sys

    env = {**os.environ, **settings_to_env(settings)}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pml_cli", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    return run


def cypher(settings: Settings, query: str, **params: Any) -> list[dict[str, Any]]:
    with GraphDatabase.driver(settings.neo4j_uri, auth=None) as driver:
        records, _, _ = driver.execute_query(query, params)
        return [r.data() for r in records]


def graph_counts(settings: Settings, tenant: str) -> dict[str, int]:
    nodes = cypher(
        settings,
        "MATCH (n {tenant_id: $t}) UNWIND labels(n) AS l RETURN l, count(*) AS n",
        t=tenant,
    )
    rels = cypher(
        settings, "MATCH ()-[r {tenant_id: $t}]->() RETURN type(r) AS l, count(*) AS n", t=tenant
    )
    return {row["l"]: row["n"] for row in nodes + rels}


def duplicates(settings: Settings, tenant: str) -> list[dict[str, Any]]:
    """Nodes sharing a key, and relationships repeated between the same two nodes."""
    return cypher(
        settings,
        """
        CALL () {
          MATCH (c:CanonicalConcept {tenant_id: $t})
          WITH c.canonical_name AS k, count(*) AS n WHERE n > 1 RETURN 'concept ' + k AS what
          UNION
          MATCH (s:SectionContext {tenant_id: $t})
          WITH s.context_id AS k, count(*) AS n WHERE n > 1 RETURN 'section ' + k AS what
          UNION
          MATCH (a {tenant_id: $t})-[r]->(b)
          WITH a, b, type(r) AS t, count(r) AS n WHERE n > 1
          RETURN 'relation ' + t AS what
        }
        RETURN what
        """,
        t=tenant,
    )


def statuses(
    stub: ingest_pb2_grpc.IngestServiceStub, tenant: str, ids: list[str]
) -> dict[str, dict[str, str]]:
    reply = stub.GetStatus(
        ingest_pb2.GetStatusRequest(tenant_id=tenant, document_ids=ids), timeout=10
    )
    return {d.document_id: {getattr(p, "pass"): p.state for p in d.passes} for d in reply.documents}


def wait_done(stub, tenant: str, ids: list[str], timeout: float = 180) -> dict[str, dict[str, str]]:
    deadline = time.monotonic() + timeout
    while True:
        found = statuses(stub, tenant, ids)
        if all(set(p.values()) == {"done"} for p in found.values()) and len(found) == len(ids):
            return found
        if time.monotonic() > deadline:
            pytest.fail(f"not done within {timeout}s: {found}")
        time.sleep(0.3)


def submit(stub, tenant: str, doc_id: str, text: str, title: str = "") -> str:
    reply = stub.Submit(
        ingest_pb2.SubmitRequest(
            tenant_id=tenant, documents=[ingest_pb2.Document(id=doc_id, title=title, text=text)]
        ),
        timeout=10,
    )
    return reply.event_ids[0]


# --- the workers' contract -------------------------------------------------------------------


def test_each_pass_worker_serves_health_and_consumes_in_its_own_group(
    system: LocalStack, settings: Settings
) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    workers = {p.name: p for p in system.processes if p.name.startswith("ingest-")}
    assert set(workers) == {f"ingest-{name}" for name in PASSES}
    for worker in workers.values():
        with grpc.insecure_channel(worker.url) as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="pml.v1.IngestWorker"), timeout=5
            )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    client = redis.Redis.from_url(settings.redis_url)
    consumed = {
        Streams.DOCUMENT_SUBMITTED: "ingest-chunking",
        Streams.DOCUMENT_DELETED: "ingest-chunking",
        Streams.CHUNKING_COMPLETED: "ingest-pass1",
        Streams.PASS1_COMPLETED: "ingest-pass2a",
        Streams.PASS2A_COMPLETED: "ingest-pass2b",
        Streams.PASS2B_COMPLETED: "ingest-pass3",
        Streams.CHUNKS_EXTRACTED: "search-chunks",
    }
    for stream, group in consumed.items():
        groups = {g["name"].decode() for g in client.xinfo_groups(stream)}
        assert group in groups, (stream, groups)


# --- the corpus through every pass -------------------------------------------------------


def test_corpus_through_all_passes_then_reingest_change_delete(
    pml, corpus: Path, settings: Settings, stub, tenant: str
) -> None:
    result = pml("ingest", str(corpus), "--tenant", tenant, "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary == {"documents": 4, "unchanged": 0, "done": 4, "failed": 0, "in progress": 0}

    shown = pml("ingest", "status", "--tenant", tenant, "--json")
    assert shown.returncode == 0, shown.stderr
    rows = json.loads(shown.stdout)
    assert {r["document_id"] for r in rows} == set(CORPUS)
    for row in rows:
        assert {name: p["state"] for name, p in row["passes"].items()} == dict.fromkeys(
            ("chunking", "pass1", "pass2a", "pass2b", "pass3"), "done"
        )
    counts = graph_counts(settings, tenant)
    assert counts["Document"] == 4 and counts["REQUIRES"] == 1
    assert counts["MENTIONED_IN"] > 0 and counts["HAS_TOPIC"] > 0 and counts["COVERS"] > 0
    assert duplicates(settings, tenant) == []

    # the same files again: nothing is resent, nothing changes
    again = pml("ingest", str(corpus), "--tenant", tenant, "--json")
    assert json.loads(again.stdout)["unchanged"] == 4
    assert graph_counts(settings, tenant) == counts

    # a changed document replaces its sections, mentions and evidence
    changed = CORPUS["support.txt"].replace("requires", "follows")
    (corpus / "support.txt").write_text(changed, encoding="utf-8")
    assert pml("ingest", str(corpus / "support.txt"), "--tenant", tenant).returncode == 0
    wait_done(stub, tenant, ["support.txt"])
    [relation] = cypher(
        settings,
        "MATCH ()-[r:REQUIRES {tenant_id: $t}]->() RETURN r.document_ids AS docs",
        t=tenant,
    )
    assert relation["docs"] == ["sales.md"]
    texts = cypher(
        settings,
        "MATCH (s:SectionContext {tenant_id: $t, document_id: 'support.txt'}) RETURN s.text AS text",
        t=tenant,
    )
    assert texts and all("requires" not in r["text"] for r in texts)

    # deleting removes what only the document supported; the rest stays
    deleted = pml("ingest", "delete", "sales.md", "--tenant", tenant)
    assert deleted.returncode == 0, deleted.stderr

    def gone() -> bool:
        return not cypher(
            settings,
            "MATCH (d:Document {tenant_id: $t, document_id: 'sales.md'}) RETURN d",
            t=tenant,
        )

    deadline = time.monotonic() + 60
    while not gone():
        assert time.monotonic() < deadline, "sales.md was not deleted"
        time.sleep(0.3)
    assert cypher(settings, "MATCH ()-[r:REQUIRES {tenant_id: $t}]->() RETURN r", t=tenant) == []
    keys = {
        r["k"]
        for r in cypher(
            settings,
            "MATCH (c:CanonicalConcept {tenant_id: $t}) RETURN c.canonical_name AS k",
            t=tenant,
        )
    }
    assert "service contract execution" in keys  # support.txt still mentions it
    assert "signed contract" not in keys  # only sales.md did
    with pytest.raises(grpc.RpcError) as missing:
        statuses(stub, tenant, ["sales.md"])
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND


def test_tenants_are_isolated(pml, corpus: Path, settings: Settings, stub) -> None:
    first, second = f"e2e-a-{uuid.uuid4().hex[:8]}", f"e2e-b-{uuid.uuid4().hex[:8]}"
    for tenant in (first, second):
        assert pml("ingest", str(corpus), "--tenant", tenant).returncode == 0
    reference = graph_counts(settings, first)
    assert graph_counts(settings, second) == reference
    for doc in CORPUS:
        assert pml("ingest", "delete", doc, "--tenant", second).returncode == 0
    deadline = time.monotonic() + 60
    while graph_counts(settings, second):
        assert time.monotonic() < deadline, graph_counts(settings, second)
        time.sleep(0.3)
    assert graph_counts(settings, first) == reference


# --- a pass worker killed in the middle of a document ---------------------------------------


def test_pass_worker_killed_mid_document_completes_without_duplicates(
    system: LocalStack, settings: Settings, stub, tenant: str
) -> None:
    [normal] = [p for p in system.processes if p.name == "ingest-pass1"]
    normal.stop()
    system.processes.remove(normal)
    paused = start_ingest_worker(
        "pass1",
        settings,
        system.state_dir,
        free_port(),
        # After its first batch of 2 mentions the worker holds still, and we kill it there.
        # Its own reclaimer must not re-claim the entry it is pausing on meanwhile: each claim
        # counts as a delivery, and the restarted worker would find the entry exhausted.
        {
            "PML_INGEST_PAUSE_AFTER_FIRST_WRITE_S": "120",
            "PML_INGEST_WRITE_BATCH": "2",
            "PML_RECLAIM_IDLE_MS": "600000",
        },
    )
    try:
        submit(stub, tenant, "sales", CORPUS["sales.md"])

        def mentions() -> int:
            return cypher(
                settings,
                "MATCH ()-[m:MENTIONED_IN {tenant_id: $t}]->() RETURN count(m) AS n",
                t=tenant,
            )[0]["n"]

        deadline = time.monotonic() + 120
        while not (
            mentions() > 0 and statuses(stub, tenant, ["sales"])["sales"]["pass1"] == "running"
        ):
            assert time.monotonic() < deadline, "pass1 never started writing"
            time.sleep(0.2)
        partial = mentions()
        paused.kill()  # SIGKILL in the middle of the document
        assert statuses(stub, tenant, ["sales"])["sales"]["pass3"] == "pending"
    finally:
        paused.stop()
    restarted = start_ingest_worker("pass1", settings, system.state_dir, free_port())
    system.processes.append(restarted)

    wait_done(stub, tenant, ["sales"])
    assert mentions() > partial
    assert duplicates(settings, tenant) == []
    # the same document ingested without any crash gives exactly the same graph
    reference = f"{tenant}-ref"
    submit(stub, reference, "sales", CORPUS["sales.md"])
    wait_done(stub, reference, ["sales"])
    assert graph_counts(settings, tenant) == graph_counts(settings, reference)


# --- a poison document --------------------------------------------------------------------


def test_poison_document_is_dead_lettered_while_the_others_complete(
    settings: Settings, stub, tenant: str
) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    poison_id = uuid.uuid4().hex
    poison = {
        "event_id": poison_id,
        "type": "DocumentSubmitted",
        "version": 1,
        "occurred_at": datetime.now(UTC).isoformat(),
        "tenant_id": tenant,
        "trace": {},
        "document_id": "binary-blob",
        "title": "blob",
        "text": "\x00\x01\x02 not a document",
        "format": "text",
    }
    client.xadd(Streams.DOCUMENT_SUBMITTED, {"data": json.dumps(poison)})
    submit(stub, tenant, "digital", CORPUS["digital.md"])
    submit(stub, tenant, "ventes", CORPUS["ventes.md"])

    wait_done(stub, tenant, ["digital", "ventes"])

    deadline = time.monotonic() + 60
    while True:
        letters = [
            {k.decode(): v.decode() for k, v in fields.items()}
            for _, fields in client.xrange(Streams.DEAD_LETTER)
        ]
        ours = [d for d in letters if d.get("event_id") == poison_id]
        if ours:
            break
        assert time.monotonic() < deadline, "the poison document was not dead-lettered"
        time.sleep(0.3)
    assert ours[0]["stream"] == Streams.DOCUMENT_SUBMITTED
    assert ours[0]["group"] == "ingest-chunking"
    assert "NUL" in ours[0]["reason"]
    state = statuses(stub, tenant, ["binary-blob"])["binary-blob"]
    assert state["chunking"] == "failed" and state["pass1"] == "pending"


# --- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (ingest_pb2.Document(id="a", text="   "), "text is empty"),
        (ingest_pb2.Document(id="a", text="x", format="pdf"), "format 'pdf' is not supported"),
        (ingest_pb2.Document(id="a b", text="x"), "whitespace"),
        (ingest_pb2.Document(id="a", text="x" * 1_000_001), "the maximum is 1000000"),
    ],
)
def test_bad_documents_are_refused_with_a_message(
    stub, tenant: str, document, message: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        stub.Submit(ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[document]), timeout=10)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.value.details()


def test_cli_reports_a_missing_path_and_bad_tenant(pml, tenant: str) -> None:
    missing = pml("ingest", "/nonexistent/folder", "--tenant", tenant)
    assert missing.returncode != 0 and "no such file or folder" in missing.stderr
    bad = pml("ingest", "status", "--tenant", "x" * 600)
    assert bad.returncode != 0 and "tenant_id" in bad.stderr
