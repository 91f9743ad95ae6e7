"""`pml eval knowledge` pieces: metrics as the data README defines them, the data files, the
corpus tenant, and the wait for search's chunk indexing (on the suite's real Redis)."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import redis
from rich.console import Console

from pml.v1 import knowledge_pb2
from pml_cli.eval_knowledge import (
    CHUNK_GROUP,
    EvalError,
    KnowledgeQuestion,
    _chunk_backlog,
    corpus_tenant,
    load_corpus,
    load_questions,
    methods_of,
    query_record,
    wait_chunks_indexed,
    write_per_query,
)
from pml_cli.metrics import KnowledgeMetrics
from pml_common.settings import Settings


def test_metrics_follow_the_data_readme() -> None:
    metrics = KnowledgeMetrics()
    # 2 supporting documents: one at rank 1, one at rank 6
    metrics.add(["a", "x", "y", "z", "w", "b", "v", "u"], ["a", "b"])
    # 2 supporting documents, both in the top 2
    metrics.add(["c", "d", "e"], ["d", "c"])
    # one supporting document never ranked
    metrics.add(["e"], ["f"])
    result = metrics.result()
    assert result["recall@2"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-4)
    assert result["recall@5"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-4)
    assert result["all_evidence@8"] == pytest.approx((1 + 1 + 0) / 3, abs=1e-4)
    assert result["questions"] == 3
    assert KnowledgeMetrics().result() == {
        "recall@2": 0.0,
        "recall@5": 0.0,
        "all_evidence@8": 0.0,
        "questions": 0,
    }


def test_per_query_records_say_where_each_supporting_document_ranks_and_why(
    tmp_path: Path,
) -> None:
    reply = knowledge_pb2.AskResponse(
        chunks=[knowledge_pb2.EvidenceChunk(document_id=d) for d in ("x", "a", "x", "y")],
        seeds=[
            knowledge_pb2.SeedConcept(
                key="tikhaya sosna river",
                link="fuzzy",
                link_score=0.92,
                span="Tikhaya Sosna",
                entity_type="LOC",
            )
        ],
    )
    question = KnowledgeQuestion(id="q1", question="Where?", supporting=["a", "b"])
    record = query_record("graph-ppr", question, reply)
    assert record["ranks"] == {"a": 2, "b": None} and record["ranked"] == ["x", "a", "y"]
    (seed,) = record["seeds"]
    assert seed["link"] == "fuzzy" and seed["span"] == "Tikhaya Sosna"
    assert seed["link_score"] == pytest.approx(0.92) and seed["entity_type"] == "LOC"
    path = tmp_path / "per-query.jsonl"
    write_per_query(path, [{**record, "id": "q2"}, record])
    assert [json.loads(line)["id"] for line in path.read_text().splitlines()] == ["q1", "q2"]


def test_data_files_are_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "corpus.jsonl").write_text(
        json.dumps({"id": "d1", "title": "One", "text": "First."}) + "\n"
    )
    (tmp_path / "questions.jsonl").write_text(
        json.dumps({"id": "q", "question": "Which?", "supporting": ["d1"], "answer": None})
        + "\n\n"
        + json.dumps({"id": "q2", "question": "What?", "supporting": ["d1"]})
        + "\n"
    )
    docs = load_corpus(tmp_path)
    assert [(d.id, d.title, d.format) for d in docs] == [("d1", "One", "text")]
    assert [q.id for q in load_questions(tmp_path / "questions.jsonl")] == ["q", "q2"]
    assert len(load_questions(tmp_path / "questions.jsonl", 1)) == 1
    assert corpus_tenant(docs) == corpus_tenant(load_corpus(tmp_path))
    assert corpus_tenant(docs).startswith("eval-knowledge-")
    (tmp_path / "questions.jsonl").write_text('{"id": "q", "question": "no supporting"}\n')
    with pytest.raises(EvalError, match=r"questions\.jsonl:1"):
        load_questions(tmp_path / "questions.jsonl")
    with pytest.raises(EvalError, match="no such file"):
        load_corpus(tmp_path / "missing")
    assert methods_of("vector, graph-first,vector") == ["vector", "graph-first"]
    with pytest.raises(EvalError, match="unknown method"):
        methods_of("bm25")


def test_waits_until_search_has_acknowledged_every_chunk_event(
    settings: Settings, tenant: str
) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    stream = f"test:chunks-extracted:{tenant}"  # not the live stream of the suite's Redis
    assert _chunk_backlog(client, stream) is None
    client.xgroup_create(stream, CHUNK_GROUP, id="0", mkstream=True)
    assert _chunk_backlog(client, stream) == 0
    client.xadd(stream, {"data": "{}"})
    client.xadd(stream, {"data": "{}"})
    assert _chunk_backlog(client, stream) == 2  # not read yet
    read = client.xreadgroup(CHUNK_GROUP, "search-1", {stream: ">"}, count=1)
    assert _chunk_backlog(client, stream) == 2  # one read but pending, one not read
    client.xack(stream, CHUNK_GROUP, read[0][1][0][0])
    assert _chunk_backlog(client, stream) == 1
    with pytest.raises(EvalError, match="backlog 1"):
        wait_chunks_indexed(settings, Console(quiet=True), stall_s=0.5, stream=stream)
    for _, entries in client.xreadgroup(CHUNK_GROUP, "search-1", {stream: ">"}):
        client.xack(stream, CHUNK_GROUP, *[entry_id for entry_id, _ in entries])
    wait_chunks_indexed(settings, Console(quiet=True), stall_s=5, stream=stream)
    # A backlog that keeps shrinking is waited for longer than it may stall.
    for _ in range(8):
        client.xadd(stream, {"data": "{}"})
    read = client.xreadgroup(CHUNK_GROUP, "search-1", {stream: ">"})[0][1]

    def ack_slowly() -> None:
        for entry_id, _ in read:
            time.sleep(0.5)
            client.xack(stream, CHUNK_GROUP, entry_id)

    acking = threading.Thread(target=ack_slowly)
    acking.start()
    started = time.monotonic()
    wait_chunks_indexed(settings, Console(quiet=True), stall_s=2.0, stream=stream)
    assert time.monotonic() - started > 2.0  # 8 acks half a second apart
    acking.join()
    client.delete(stream)
    client.close()
