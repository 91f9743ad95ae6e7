"""`IngestService`: Submit, GetStatus and DeleteDocument (proto/pml/v1/ingest.proto).

Submit validates every document first (a request with one bad document stores nothing), then
announces each with `DocumentSubmitted`; a document whose content is unchanged and fully
ingested is not announced again (its event id is returned empty). GetStatus reads the status
store; DeleteDocument announces `DocumentDeleted` (the chunking worker removes the graph part,
search the chunks).

Submit is all or nothing: every document is marked submitted (all passes pending) first, then
the events are published (`publish_all`: once started, to the end even if the caller goes
away). If a status write or the first event fails, or the caller goes away before publishing,
each document gets back the status it had (none, or its content hash, title and pass states and
errors; their times are those of the restore) and the answer says why and that nothing was
submitted. Should the bus fail after some events are out, those documents are submitted and
named, and the others are put back as they were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import structlog

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_common.events import DocumentDeleted, DocumentSubmitted
from pml_common.grpc_server import RequestError, invalid_argument, not_found
from pml_common.publishing import PublishInterrupted, publish_all
from pml_common.request_validation import tenant_of
from pml_common.settings import Settings
from pml_ingest.documents import (
    FORMATS,
    content_hash,
    default_document_id,
    id_problem,
    text_problem,
)
from pml_ingest.passes import Publisher
from pml_ingest.status import DocumentStatus, StatusStore

log = structlog.get_logger(__name__)
MAX_TITLE_CHARS = 2000
#: Ids of the documents announced before the bus failed, quoted in the answer.
_SHOWN_IDS = 10


@dataclass(frozen=True)
class ValidDocument:
    document_id: str
    title: str
    text: str
    format: str
    content_hash: str


def valid_document(doc: ingest_pb2.Document, index: int, settings: Settings) -> ValidDocument:
    """The document as it will be ingested, or INVALID_ARGUMENT naming what is wrong."""
    where = f"documents[{index}]"
    fmt = doc.format.strip().lower() or "markdown"
    if fmt not in FORMATS:
        raise invalid_argument(
            f"{where}.format {doc.format!r} is not supported; use one of {', '.join(FORMATS)}"
        )
    problem = text_problem(doc.text, settings.ingest_max_document_chars)
    if problem:
        raise invalid_argument(f"{where}: {problem}")
    title = doc.title.strip()
    if len(title) > MAX_TITLE_CHARS:
        raise invalid_argument(f"{where}.title is longer than {MAX_TITLE_CHARS} characters")
    document_id = doc.id.strip() or default_document_id(title, doc.text)
    problem = id_problem(document_id)
    if problem:
        raise invalid_argument(f"{where}.id {problem}")
    return ValidDocument(document_id, title, doc.text, fmt, content_hash(title, doc.text, fmt))


class IngestServicer(ingest_pb2_grpc.IngestServiceServicer):
    def __init__(self, settings: Settings, status: StatusStore, publisher: Publisher) -> None:
        self._settings = settings
        self._status = status
        self._publisher = publisher

    async def Submit(
        self, request: ingest_pb2.SubmitRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.SubmitResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        if not request.documents:
            raise invalid_argument("documents must not be empty")
        if len(request.documents) > self._settings.ingest_max_documents:
            raise invalid_argument(
                f"{len(request.documents)} documents in one request; the maximum is "
                f"{self._settings.ingest_max_documents}"
            )
        docs = [valid_document(d, i, self._settings) for i, d in enumerate(request.documents)]
        ids = [d.document_id for d in docs]
        if len(set(ids)) != len(ids):
            raise invalid_argument("two documents of the request have the same id")
        todo: list[tuple[ValidDocument, DocumentStatus | None]] = []
        for doc, current in zip(docs, await self._status.many(tenant, ids), strict=True):
            if current is not None and current.content_hash == doc.content_hash and current.done:
                log.info("ingest.unchanged_skipped", tenant=tenant, document_id=doc.document_id)
            else:
                todo.append((doc, current))
        events = [_submitted_event(tenant, doc) for doc, _ in todo]
        await self._submit_all(tenant, todo, events)
        event_ids = {e.document_id: e.event_id for e in events}
        return ingest_pb2.SubmitResponse(
            document_ids=ids, event_ids=[event_ids.get(i, "") for i in ids]
        )

    async def _submit_all(
        self,
        tenant: str,
        todo: Sequence[tuple[ValidDocument, DocumentStatus | None]],
        events: Sequence[DocumentSubmitted],
    ) -> None:
        """Mark the documents submitted, then announce them: all or nothing (module doc)."""
        marked: list[tuple[ValidDocument, DocumentStatus | None]] = []
        try:
            for doc, previous in todo:
                marked.append((doc, previous))  # first: a write cut short may have landed
                await self._status.submitted(tenant, doc.document_id, doc.content_hash, doc.title)
            await publish_all(self._publisher, events)
        except PublishInterrupted as exc:
            announced = [doc.document_id for doc, _ in marked[: len(exc.published)]]
            await self._put_back(tenant, marked[len(exc.published) :])
            shown = ", ".join(repr(i) for i in announced[:_SHOWN_IDS])
            more = " ..." if len(announced) > _SHOWN_IDS else ""
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                f"{exc}: {shown}{more} are submitted; the other "
                f"{len(todo) - len(announced)} are not, submit them again",
            ) from exc
        except BaseException as exc:
            await self._put_back(tenant, marked)
            if not isinstance(exc, Exception):
                raise  # cancelled: nobody is left to answer
            log.warning("ingest.submit_failed", tenant=tenant, error=f"{type(exc).__name__}: {exc}")
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                f"the documents could not be stored and announced ({type(exc).__name__}: {exc});"
                " nothing was submitted, retry later",
            ) from exc

    async def _put_back(
        self, tenant: str, marked: Sequence[tuple[ValidDocument, DocumentStatus | None]]
    ) -> None:
        """Give the documents back the status they had, even if the task is being cancelled;
        a failure to do so is logged (the request's own failure is what the caller hears)."""
        try:
            await asyncio.shield(self._restore(tenant, marked))
        except Exception:
            log.exception("ingest.status_not_restored", tenant=tenant, documents=len(marked))

    async def _restore(
        self, tenant: str, marked: Sequence[tuple[ValidDocument, DocumentStatus | None]]
    ) -> None:
        for doc, previous in marked:
            if previous is None:
                await self._status.forget(tenant, doc.document_id)
                continue
            digest = previous.content_hash
            await self._status.submitted(tenant, doc.document_id, digest, previous.title)
            for p in previous.passes:
                await self._status.mark(tenant, doc.document_id, digest, p.name, p.state, p.error)

    async def GetStatus(
        self, request: ingest_pb2.GetStatusRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.GetStatusResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        ids = list(request.document_ids) or await self._status.documents(tenant)
        found = await self._status.many(tenant, ids)
        missing = [i for i, s in zip(ids, found, strict=True) if s is None]
        if missing:
            names = ", ".join(missing[:10])
            raise not_found(f"unknown document id(s) for tenant {tenant!r}: {names}")
        return ingest_pb2.GetStatusResponse(documents=[_status_message(s) for s in found if s])

    async def DeleteDocument(
        self, request: ingest_pb2.DeleteDocumentRequest, context: grpc.aio.ServicerContext
    ) -> ingest_pb2.DeleteDocumentResponse:
        tenant = tenant_of(request.tenant_id, self._settings)
        document_id = request.document_id.strip()
        if not document_id:
            raise invalid_argument("document_id must not be empty")
        problem = id_problem(document_id)
        if problem:
            raise invalid_argument(f"document_id {problem}")
        event = DocumentDeleted.create(tenant_id=tenant, document_id=document_id)
        await self._publisher.publish(event)
        return ingest_pb2.DeleteDocumentResponse(event_id=event.event_id)


def _submitted_event(tenant: str, doc: ValidDocument) -> DocumentSubmitted:
    event: DocumentSubmitted = DocumentSubmitted.create(
        tenant_id=tenant,
        document_id=doc.document_id,
        title=doc.title,
        text=doc.text,
        format=doc.format,
    )
    return event


def _status_message(status: DocumentStatus) -> ingest_pb2.DocumentStatus:
    return ingest_pb2.DocumentStatus(
        document_id=status.document_id,
        passes=[
            # `pass` is a Python keyword: the field can only be given by name in a mapping.
            ingest_pb2.PassStatus(
                **{"pass": p.name}, state=p.state, updated_at=p.updated_at, error=p.error
            )
            for p in status.passes
        ],
    )
