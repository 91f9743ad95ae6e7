"""Graph-first Ask end to end: the North Star tests of seed 001 §6 and the invariants of §9.

Search, the ingest service and its five pass workers run as real processes; the corpus goes in
with `pml ingest`, questions come back through `KnowledgeService.Ask` (gRPC) and `pml ask`, and
the evaluation runs with `pml eval knowledge`. Neo4j is only read, to compare the answer with
what the graph holds (paths, evidence, sections).

The corpus is built so that the word "transformation" pulls plain vector search to the wrong
documents: the question of §1.1, "the process of transformation of a commercial proposal into
an executable contract", is about Solution Quotation Management and Service Contract Execution,
but three documents are about transformation processes.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from neo4j import GraphDatabase

from pml.v1 import ingest_pb2, ingest_pb2_grpc, knowledge_pb2, knowledge_pb2_grpc
from pml_cli.local_stack import LocalStack, settings_to_env
from pml_common.context_id import make_context_id
from pml_common.local_runtime import ManagedProcess
from pml_common.settings import Settings

# The first test also starts the system and ingests the corpora (module fixtures).
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CORPUS = {
    "quotation.md": """# Solution Quotation Management

## Offers

Solution Quotation Management prepares the commercial proposal for every customer.
The commercial proposal is part of Solution Quotation Management.

## Approval

Each commercial proposal is part of Solution Quotation Management until the customer signs it.
Pricing rules are checked before the offer leaves sales.
""",
    "contract.md": """# Service Contract Execution

## Scope

Service Contract Execution requires Solution Quotation Management for the approved offer.
The executable contract is part of Service Contract Execution.

## Operations

Service Contract Execution requires Solution Quotation Management to hand over the signed terms.
Every executable contract is part of Service Contract Execution once it is activated.
""",
    "digital.md": """# Digital Transformation

## The transformation process

Digital Transformation is the process of transformation of a company into a digital business.
The transformation process changes every process, every proposal and every operating model.

## Transformation programmes

A transformation programme drives the transformation of processes, of proposals and of contracts
into digital workflows.
""",
    "cloud.md": """# AI-assisted Cloud Transformation

AI-assisted Cloud Transformation is the process of transformation of legacy systems into cloud
services. The cloud transformation process uses AI to plan each transformation step.
""",
    "agile.md": """# Business Process Transformation

Business Process Transformation is the transformation of a business process into a new process.
Process transformation turns proposals and processes into transformed processes.
""",
}
TRANSFORMATION_DOCS = {"digital.md", "cloud.md", "agile.md"}
RIGHT_DOCS = {"quotation.md", "contract.md"}
AMBIGUOUS = (
    "What is the process of transformation of a commercial proposal into an executable contract?"
)
RIGHT_PATH = [
    "commercial proposal",
    "solution quotation management",
    "service contract execution",
    "executable contract",
]
#: Tenant B: the same document ids, other content, and a word only B has.
B_CORPUS = {
    "quotation.md": "# Solution Quotation Management\n\nThe zanzibar ledger is kept by Solution "
    "Quotation Management.\n",
    "contract.md": "# Service Contract Execution\n\nService Contract Execution archives the "
    "zanzibar ledger.\n",
}
QUESTIONS = (
    AMBIGUOUS,
    "How does Service Contract Execution relate to Solution Quotation Management?",
    "Is the executable contract part of Service Contract Execution?",
    "What does Digital Transformation change?",
    "Which offers does Solution Quotation Management prepare?",
)


@pytest.fixture(scope="module")
def system(
    redis_server: ManagedProcess,
    neo4j_server: ManagedProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalStack]:
    state = tmp_path_factory.mktemp("e2e-knowledge")
    stack = LocalStack.on_free_ports(state, reclaim_idle_ms=1000, log_format="console")
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


@pytest.fixture(scope="module")
def pml(settings: Settings) -> Callable[..., subprocess.CompletedProcess[str]]:
    env = {**os.environ, **settings_to_env(settings), "COLUMNS": "160"}

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


def write_corpus(folder: Path, corpus: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in corpus.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def tenants(
    pml: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[str, str]:
    """Tenant A with the corpus, tenant B with the same document ids and other content."""
    a, b = f"e2e-ka-{uuid.uuid4().hex[:8]}", f"e2e-kb-{uuid.uuid4().hex[:8]}"
    folder = tmp_path_factory.mktemp("knowledge")
    corpora = {a: CORPUS, b: B_CORPUS}
    paths = {t: str(write_corpus(folder / t, c)) for t, c in corpora.items()}
    with ThreadPoolExecutor(2) as pool:  # both tenants through the pipeline at once
        results = pool.map(lambda t: (t, pml("ingest", paths[t], "--tenant", t, "--json")), paths)
        for tenant, done in results:
            assert done.returncode == 0, done.stderr
            assert json.loads(done.stdout)["done"] == len(corpora[tenant])
    return a, b


@pytest.fixture
def knowledge(settings: Settings) -> Iterator[knowledge_pb2_grpc.KnowledgeServiceStub]:
    with grpc.insecure_channel(settings.search_addr) as channel:
        yield knowledge_pb2_grpc.KnowledgeServiceStub(channel)


def ask(
    stub: knowledge_pb2_grpc.KnowledgeServiceStub,
    tenant: str,
    question: str,
    k: int = 4,
    method: str = "",
) -> knowledge_pb2.AskResponse:
    request = knowledge_pb2.AskRequest(tenant_id=tenant, question=question, k=k, method=method)
    return stub.Ask(request, timeout=60)


def cypher(settings: Settings, query: str, **params: Any) -> list[dict[str, Any]]:
    with GraphDatabase.driver(settings.neo4j_uri, auth=None) as driver:
        records, _, _ = driver.execute_query(query, params)
        return [r.data() for r in records]


def documents(reply: knowledge_pb2.AskResponse) -> list[str]:
    return list(dict.fromkeys(c.document_id for c in reply.chunks))


def _normalised(text: str) -> str:
    return " ".join("".join(ch.lower() if ch.isalnum() else " " for ch in text).split())


# --- North Star (§6) -------------------------------------------------------------------------


def test_ambiguous_word(knowledge, tenants: tuple[str, str]) -> None:
    a, _ = tenants
    vector = ask(knowledge, a, AMBIGUOUS, k=5, method="vector")
    assert vector.mode == knowledge_pb2.ANSWER_MODE_TEXT_ONLY
    # plain vector search: the word "transformation" wins
    assert documents(vector)[0] in TRANSFORMATION_DOCS
    assert len(TRANSFORMATION_DOCS & set(documents(vector))) >= 2

    graph = ask(knowledge, a, AMBIGUOUS, k=4)
    assert graph.mode == knowledge_pb2.ANSWER_MODE_REASONED
    assert graph.path_finder == "cypher"  # this machine's Neo4j is community, without GDS
    assert list(graph.paths[0].concepts) == RIGHT_PATH  # "Quotation → Contract"
    on_paths = {c for p in graph.paths for c in p.concepts}
    assert not any("digital transformation" in c for c in on_paths)
    assert set(documents(graph)) == RIGHT_DOCS  # every evidence chunk from the right documents


def test_path_recovery(knowledge, tenants: tuple[str, str], settings: Settings) -> None:
    a, _ = tenants
    reply = ask(knowledge, a, QUESTIONS[1])
    assert reply.mode == knowledge_pb2.ANSWER_MODE_REASONED
    path = reply.paths[0]
    [stored] = cypher(
        settings,
        "MATCH (x:CanonicalConcept {tenant_id: $t, canonical_name: $a})-[r]-"
        "(y:CanonicalConcept {tenant_id: $t, canonical_name: $b}) "
        "RETURN startNode(r).canonical_name AS source, type(r) AS type, "
        "endNode(r).canonical_name AS target, r.evidence_context_ids AS contexts, "
        "r.evidence_quotes AS quotes, r.confidence AS confidence",
        t=a,
        a="service contract execution",
        b="solution quotation management",
    )
    assert list(path.concepts) == ["service contract execution", "solution quotation management"]
    [edge] = path.edges
    assert (edge.source, edge.relation, edge.target) == (
        stored["source"],
        stored["type"],
        stored["target"],
    )
    assert edge.confidence == pytest.approx(stored["confidence"])
    assert [e.context_id for e in edge.evidence] == stored["contexts"]
    assert [e.quote for e in edge.evidence] == stored["quotes"]


def test_evidence_alignment_and_no_spurious_edge(
    knowledge, tenants: tuple[str, str], settings: Settings
) -> None:
    a, _ = tenants
    edges = []
    for question in QUESTIONS:
        reply = ask(knowledge, a, question)
        if reply.mode == knowledge_pb2.ANSWER_MODE_REASONED:
            assert reply.paths
            edges += [e for p in reply.paths for e in p.edges]
    assert len(edges) >= 4
    unproven = [e for e in edges if not e.evidence]
    assert len(unproven) / len(edges) < 0.01  # No Spurious Edge: none at all here
    sections = {
        r["id"]: r["text"]
        for r in cypher(
            settings,
            "MATCH (s:SectionContext {tenant_id: $t}) RETURN s.context_id AS id, s.text AS text",
            t=a,
        )
    }
    for edge in edges:  # Evidence Alignment: 100% of REASONED edges, each quote in its section
        for evidence in edge.evidence:
            assert evidence.context_id in sections
            assert _normalised(evidence.quote) in _normalised(sections[evidence.context_id])
    # and the graph holds no relation without evidence that a path could have used
    bare = cypher(
        settings,
        "MATCH (:CanonicalConcept {tenant_id: $t})-[r]->(:CanonicalConcept) "
        "WHERE size(coalesce(r.evidence_context_ids, [])) = 0 RETURN type(r) AS type",
        t=a,
    )
    assert bare == []


def test_modes_degrade_gracefully(knowledge, tenants: tuple[str, str]) -> None:
    a, _ = tenants
    anchored = ask(knowledge, a, "What does Digital Transformation change?", k=3)
    assert anchored.mode == knowledge_pb2.ANSWER_MODE_ANCHORED
    assert not anchored.paths
    assert documents(anchored)[0] == "digital.md"
    assert anchored.chunks[0].plan_weight > 0
    # each seed says what made it one
    assert [seed.key for seed in anchored.seeds] == list(anchored.seed_concepts)
    assert all(0 < seed.weight <= 1 for seed in anchored.seeds)
    assert any(seed.sections >= 1 for seed in anchored.seeds)
    nothing = ask(knowledge, a, "Where do zebras graze at dawn?", k=3)
    assert nothing.mode == knowledge_pb2.ANSWER_MODE_TEXT_ONLY
    assert not nothing.seed_concepts and not nothing.plan_context_ids
    assert len(nothing.chunks) == 3 and all(c.plan_weight == 0 for c in nothing.chunks)
    assert nothing.topped_up_chunks == 3 and anchored.topped_up_chunks < 3


# --- invariants (§9) -------------------------------------------------------------------------


def test_invariants_hold_on_every_answer(
    knowledge, tenants: tuple[str, str], settings: Settings
) -> None:
    a, _ = tenants
    paths_of_sections = {
        r["id"]: (r["doc"], r["path"])
        for r in cypher(
            settings,
            "MATCH (s:SectionContext {tenant_id: $t}) "
            "RETURN s.context_id AS id, s.document_id AS doc, s.section_path AS path",
            t=a,
        )
    }
    named = []
    linked = "Which digital workflow runs the executable contract?"
    for question, method in itertools.product(
        (*QUESTIONS, linked, "Where do zebras graze at dawn?"), ("graph-first", "", "graph-ppr")
    ):
        reply = ask(knowledge, a, question, k=8, method=method)
        assert reply.method == (method or "graph-ppr")  # the default method
        # I1: the graph stages run before the vector store is read, in every mode
        stages = ["seeds", "paths", "plan", "embed", "vector"]
        if (
            reply.method == "graph-ppr"
        ):  # the walk, and the names in the best answers followed after
            stages = ["seeds", "paths", "propagate", "plan", "embed", "vector", "links"]
        assert [t.stage for t in reply.timings] == stages
        # I2: REASONED only with evidenced paths
        if reply.mode == knowledge_pb2.ANSWER_MODE_REASONED:
            assert all(e.evidence for p in reply.paths for e in p.edges)
            assert all(p.evidence_coverage >= 0.8 for p in reply.paths)
        else:
            assert not reply.paths
        # I3: evidence is addressed by SectionContext: every chunk's context id is a section of
        # the graph made by the one helper, and a weighted chunk's section is in the plan
        plan = set(reply.plan_context_ids)
        for chunk in reply.chunks:
            doc, path = paths_of_sections[chunk.context_id]
            assert (chunk.document_id, chunk.section_path) == (doc, path)
            assert chunk.context_id == make_context_id(doc, path)
            assert chunk.plan_weight == 0 or chunk.context_id in plan
            if chunk.named_by:  # a followed link: from another document's section, in the plan
                named.append(chunk)
                assert chunk.context_id in plan and chunk.plan_weight > 0
                assert paths_of_sections[chunk.named_by][0] != chunk.document_id
        for evidence in (e for p in reply.paths for edge in p.edges for e in edge.evidence):
            assert evidence.context_id in plan
    # `linked`'s best documents are Digital Transformation and Service Contract Execution, whose
    # text names Solution Quotation Management
    assert {(c.document_id, paths_of_sections[c.named_by][0]) for c in named} >= {
        ("quotation.md", "contract.md")
    }


# --- the command line ------------------------------------------------------------------------


def test_pml_ask_prints_the_answer(pml, tenants: tuple[str, str]) -> None:
    a, _ = tenants
    shown = pml("ask", AMBIGUOUS, "--tenant", a, "--k", "3")
    assert shown.returncode == 0, shown.stderr
    assert "REASONED" in shown.stdout and "PART_OF" in shown.stdout
    assert "The commercial proposal is part of Solution Quotation" in shown.stdout
    assert "commercial proposal (" in " ".join(shown.stdout.split())  # a seed, and why
    assert "method: graph-ppr" in shown.stdout  # the default method, named
    as_json = pml("ask", AMBIGUOUS, "--tenant", a, "--json")
    reply = json.loads(as_json.stdout)
    assert reply["mode"] == "ANSWER_MODE_REASONED" and len(reply["chunks"]) == 8
    refused = pml("ask", AMBIGUOUS, "--tenant", a, "--k", "51")
    assert refused.returncode == 2 and "INVALID_ARGUMENT" in refused.stderr
    empty = pml("ask", " ", "--tenant", a)
    assert empty.returncode == 2 and "question must not be empty" in empty.stderr


def test_pml_eval_knowledge(pml, tmp_path: Path) -> None:
    data = tmp_path / "set"
    data.mkdir()
    with (data / "corpus.jsonl").open("w") as corpus:
        for name, text in CORPUS.items():
            title, _, body = text.partition("\n")
            lines = [ln for ln in body.splitlines() if not ln.startswith("#")]
            row = {"id": name, "title": title.lstrip("# "), "text": "\n".join(lines)}
            corpus.write(json.dumps(row) + "\n")
    questions = [
        {"id": "q1", "question": AMBIGUOUS, "supporting": sorted(RIGHT_DOCS), "answer": None},
        {
            "id": "q2",
            "question": "What is Business Process Transformation?",
            "supporting": ["agile.md"],
            "answer": None,
        },
    ]
    (data / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions))
    result = pml(
        "eval", "knowledge", "--data", str(data), "--method", "vector,graph-first", "--json"
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["documents"] == 5 and summary["tenant"].startswith("eval-knowledge-")
    by_method = {m["method"]: m for m in summary["methods"]}
    assert set(by_method) == {"vector", "graph-first"}
    for figures in by_method.values():
        assert figures["questions"] == 2
        assert set(figures) >= {"recall@2", "recall@5", "all_evidence@8"}
    assert by_method["graph-first"]["recall@2"] == 1.0
    assert by_method["graph-first"]["recall@2"] > by_method["vector"]["recall@2"]
    bad = pml("eval", "knowledge", "--data", str(tmp_path / "missing"))
    assert bad.returncode == 1 and "no such file" in bad.stderr


# --- bad input and tenants ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_fields", "message"),
    [
        ({"question": ""}, "question must not be empty"),
        ({"question": "x" * 100_001}, "question is 100001 characters long"),
        ({"question": "ok", "k": 51}, "k must be between 1 and 50"),
        ({"question": "ok", "k": -1}, "k must be between 1 and 50"),
        ({"question": "ok", "method": "bogus"}, "method 'bogus' is not known"),
        ({"question": "ok", "tenant_id": "a\x00b"}, "control characters"),
    ],
)
def test_bad_questions_are_refused(knowledge, request_fields: dict[str, Any], message: str) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        knowledge.Ask(knowledge_pb2.AskRequest(**request_fields), timeout=30)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in refused.value.details()


def _view(stub: knowledge_pb2_grpc.KnowledgeServiceStub, tenant: str) -> list[Any]:
    """What a caller sees of `tenant` for every question, as plain data."""
    seen = []
    for question in (*QUESTIONS, "Who keeps the zanzibar ledger?"):
        reply = ask(stub, tenant, question, k=8)
        seen.append(
            (
                reply.mode,
                list(reply.seed_concepts),
                [list(p.concepts) for p in reply.paths],
                [(c.document_id, c.context_id, c.text) for c in reply.chunks],
            )
        )
    return seen


def test_tenants_see_only_their_own_knowledge(
    knowledge, tenants: tuple[str, str], settings: Settings
) -> None:
    a, b = tenants
    b_view = _view(knowledge, b)
    a_texts = {t for _, _, _, chunks in _view(knowledge, a) for _, _, t in chunks}
    b_texts = {t for _, _, _, chunks in b_view for _, _, t in chunks}
    assert a_texts and b_texts and not a_texts & b_texts  # same document ids, no shared chunk
    assert not any("zanzibar" in t for t in a_texts)
    a_zanzibar = ask(knowledge, a, "Who keeps the zanzibar ledger?")
    assert "zanzibar ledger" not in a_zanzibar.seed_concepts
    assert all(not r.paths for r in (ask(knowledge, b, q) for q in QUESTIONS))  # B has none

    # A deletes a document B also has (same id): B's answers do not move
    with grpc.insecure_channel(settings.ingest_addr) as channel:
        ingest = ingest_pb2_grpc.IngestServiceStub(channel)
        ingest.DeleteDocument(
            ingest_pb2.DeleteDocumentRequest(tenant_id=a, document_id="contract.md"), timeout=30
        )
    deadline = time.monotonic() + 60
    while "contract.md" in documents(ask(knowledge, a, QUESTIONS[1], k=8)):
        assert time.monotonic() < deadline, "contract.md still answers for A"
        time.sleep(0.3)
    assert _view(knowledge, b) == b_view
    # restore A's corpus for the other tests of this module
    with grpc.insecure_channel(settings.ingest_addr) as channel:
        ingest = ingest_pb2_grpc.IngestServiceStub(channel)
        ingest.Submit(
            ingest_pb2.SubmitRequest(
                tenant_id=a,
                documents=[ingest_pb2.Document(id="contract.md", text=CORPUS["contract.md"])],
            ),
            timeout=30,
        )
    while ask(knowledge, a, QUESTIONS[1]).mode != knowledge_pb2.ANSWER_MODE_REASONED:
        assert time.monotonic() < deadline + 120, "contract.md did not come back"
        time.sleep(0.5)


INJECTIONS = (
    "x'}) MATCH (n) DETACH DELETE n //",
    '") MATCH (n) DETACH DELETE n RETURN 1 //',
    "$tenant",
    "{tenant_id: $tenant}",
    "`CanonicalConcept` {tenant_id: 'b'}) DETACH DELETE n //",
    "ｘ'}) ＭＡＴＣＨ (n) ＤＥＴＡＣＨ ＤＥＬＥＴＥ n",
    "\u202e'}) MATCH (n) DELETE n",
)


def test_injection_shaped_questions_and_tenants_are_data(
    knowledge, tenants: tuple[str, str], settings: Settings
) -> None:
    a, b = tenants
    before = cypher(settings, "MATCH (n {tenant_id: $t}) RETURN count(n) AS nodes", t=b)
    for text in INJECTIONS:
        for tenant, question in ((a, text), (text, AMBIGUOUS), (b, f"{AMBIGUOUS} {text}")):
            try:
                reply = ask(knowledge, tenant, question)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.INVALID_ARGUMENT, (tenant, question)
                continue
            if tenant == text:  # an unknown tenant knows nothing
                assert reply.mode == knowledge_pb2.ANSWER_MODE_TEXT_ONLY and not reply.chunks
    assert cypher(settings, "MATCH (n {tenant_id: $t}) RETURN count(n) AS nodes", t=b) == before
