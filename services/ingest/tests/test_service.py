"""IngestService in-process on the real Redis: validation, publication, status."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_common.events import DocumentDeleted, DocumentSubmitted
from pml_common.grpc_server import GrpcServer
from pml_common.settings import Settings
from pml_ingest.service import IngestServicer
from pml_ingest.status import DONE, PASSES, StatusStore


@pytest.fixture
async def status(redis) -> StatusStore:
    return StatusStore(redis)


@pytest.fixture
async def stub(
    settings: Settings, status: StatusStore, recorder
) -> AsyncIterator[ingest_pb2_grpc.IngestServiceStub]:
    server = GrpcServer(settings, 0, "ingest-test")
    servicer = IngestServicer(settings, status, recorder)
    server.add(
        lambda s: ingest_pb2_grpc.add_IngestServiceServicer_to_server(servicer, s),
        "pml.v1.IngestService",
    )
    port = await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield ingest_pb2_grpc.IngestServiceStub(channel)
    await server.stop(0)


def _doc(**fields: str) -> ingest_pb2.Document:
    return ingest_pb2.Document(**{"id": "d1", "title": "T", "text": "Some text.", **fields})


async def test_submit_publishes_and_marks_every_pass_pending(stub, recorder, tenant) -> None:
    reply = await stub.Submit(ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[_doc()]))
    assert list(reply.document_ids) == ["d1"]
    [event] = recorder.of(DocumentSubmitted)
    assert event.event_id == reply.event_ids[0]
    assert (event.tenant_id, event.document_id, event.format) == (tenant, "d1", "markdown")
    status = await stub.GetStatus(ingest_pb2.GetStatusRequest(tenant_id=tenant))
    [doc] = status.documents
    assert [(getattr(p, "pass"), p.state) for p in doc.passes] == [(p, "pending") for p in PASSES]


async def test_unchanged_and_done_documents_are_not_resent(stub, recorder, status, tenant) -> None:
    await stub.Submit(ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[_doc()]))
    stored = await status.get(tenant, "d1")
    assert stored is not None
    for name in PASSES:
        await status.mark(tenant, "d1", stored.content_hash, name, DONE)
    again = await stub.Submit(ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[_doc()]))
    assert list(again.event_ids) == [""]
    changed = await stub.Submit(
        ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[_doc(text="Other text.")])
    )
    assert changed.event_ids[0]
    assert len(recorder.of(DocumentSubmitted)) == 2


async def test_a_document_without_id_gets_a_stable_one(stub, tenant) -> None:
    request = ingest_pb2.SubmitRequest(tenant_id=tenant, documents=[_doc(id="")])
    first = await stub.Submit(request)
    second = await stub.Submit(request)
    assert first.document_ids[0].startswith("doc-")
    assert first.document_ids == second.document_ids


@pytest.mark.parametrize(
    ("documents", "message"),
    [
        ([], "documents must not be empty"),
        ([_doc(text="")], "documents[0]: text is empty"),
        ([_doc(format="docx")], "format 'docx' is not supported"),
        ([_doc(id="a\tb")], "documents[0].id must not contain whitespace"),
        ([_doc(), _doc()], "same id"),
        ([_doc(text="x" * 1_000_001)], "the maximum is 1000000"),
        ([_doc(title="t" * 2001)], "title is longer"),
    ],
)
async def test_bad_submissions_store_nothing(
    stub, recorder, status, tenant, documents, message
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await stub.Submit(ingest_pb2.SubmitRequest(tenant_id=tenant, documents=documents))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in (refused.value.details() or "")
    assert recorder.events == []
    assert await status.documents(tenant) == []


async def test_unknown_status_and_delete(stub, recorder, tenant) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as missing:
        await stub.GetStatus(ingest_pb2.GetStatusRequest(tenant_id=tenant, document_ids=["nope"]))
    assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    reply = await stub.DeleteDocument(
        ingest_pb2.DeleteDocumentRequest(tenant_id=tenant, document_id="d9")
    )
    [event] = recorder.of(DocumentDeleted)
    assert (event.event_id, event.document_id) == (reply.event_id, "d9")
    with pytest.raises(grpc.aio.AioRpcError) as empty:
        await stub.DeleteDocument(ingest_pb2.DeleteDocumentRequest(tenant_id=tenant))
    assert empty.value.code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_status_of_an_older_version_never_overwrites_the_newer(status, tenant) -> None:
    await status.submitted(tenant, "d", "old", "T")
    await status.submitted(tenant, "d", "new", "T")
    assert not await status.mark(tenant, "d", "old", "pass1", DONE)
    current = await status.get(tenant, "d")
    assert current is not None and current.passes[1].state == "pending"
    await status.forget(tenant, "d")
    assert await status.get(tenant, "d") is None
