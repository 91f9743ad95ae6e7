"""`pml ingest`: submit documents, follow their passes, show status, delete."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from pml.v1 import ingest_pb2, ingest_pb2_grpc
from pml_cli.client import channel
from pml_cli.ingest_files import SourceDocument
from pml_common.settings import Settings

PASSES = ("chunking", "pass1", "pass2a", "pass2b", "pass3")
#: Documents per Submit request (also bounded by the gRPC message size).
SUBMIT_BATCH = 100
SUBMIT_BYTES = 4 * 1024 * 1024
STATUS_BATCH = 500
#: Seconds between two looks at the documents still in progress: on a large corpus each look
#: reads every one of them, on the cores the passes run on.
POLL_S = 1.0


def ingest_stub(settings: Settings) -> ingest_pb2_grpc.IngestServiceStub:
    return ingest_pb2_grpc.IngestServiceStub(channel(settings.ingest_addr, settings))


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    )


def _batches(docs: Sequence[SourceDocument]) -> list[list[SourceDocument]]:
    batches: list[list[SourceDocument]] = [[]]
    size = 0
    for doc in docs:
        weight = len(doc.text.encode()) + len(doc.title.encode()) + 64
        if batches[-1] and (len(batches[-1]) >= SUBMIT_BATCH or size + weight > SUBMIT_BYTES):
            batches.append([])
            size = 0
        batches[-1].append(doc)
        size += weight
    return [b for b in batches if b]


def submit(
    settings: Settings, tenant: str, docs: Sequence[SourceDocument], console: Console
) -> tuple[list[str], int]:
    """Submit every document; returns their ids and how many were unchanged (not resent)."""
    stub = ingest_stub(settings)
    ids: list[str] = []
    unchanged = 0
    with _progress(console) as progress:
        task = progress.add_task("submitting", total=len(docs))
        for batch in _batches(docs):
            reply = stub.Submit(
                ingest_pb2.SubmitRequest(
                    tenant_id=tenant,
                    documents=[
                        ingest_pb2.Document(id=d.id, title=d.title, text=d.text, format=d.format)
                        for d in batch
                    ],
                ),
                timeout=120,
            )
            ids.extend(reply.document_ids)
            unchanged += sum(1 for e in reply.event_ids if not e)
            progress.advance(task, len(batch))
    return ids, unchanged


def statuses(
    settings: Settings, tenant: str, ids: Sequence[str] | None
) -> list[ingest_pb2.DocumentStatus]:
    stub = ingest_stub(settings)
    if not ids:
        reply = stub.GetStatus(ingest_pb2.GetStatusRequest(tenant_id=tenant), timeout=60)
        return list(reply.documents)
    found: list[ingest_pb2.DocumentStatus] = []
    for start in range(0, len(ids), STATUS_BATCH):
        request = ingest_pb2.GetStatusRequest(
            tenant_id=tenant, document_ids=list(ids[start : start + STATUS_BATCH])
        )
        found.extend(stub.GetStatus(request, timeout=60).documents)
    return found


def state_of(status: ingest_pb2.DocumentStatus) -> str:
    """done, failed, or in progress."""
    states = [p.state for p in status.passes]
    if "failed" in states:
        return "failed"
    return "done" if states and all(s == "done" for s in states) else "in progress"


def wait(
    settings: Settings, tenant: str, ids: Sequence[str], console: Console, timeout_s: float
) -> dict[str, int]:
    """Follow the documents until each is done or failed (or `timeout_s` passes), with a bar
    per pass: on a large corpus a document is done only when its last pass is, which may be
    minutes after the first passes moved on, and a single bar would sit still meanwhile."""
    deadline = time.monotonic() + timeout_s
    ended: dict[str, ingest_pb2.DocumentStatus] = {}  # done or failed: asked no more
    with _progress(console) as progress:
        bars = {name: progress.add_task(f"  {name}", total=len(ids)) for name in PASSES}
        task = progress.add_task("ingested (all passes)", total=len(ids))
        while True:
            pending = [i for i in ids if i not in ended]
            found = statuses(settings, tenant, pending) if pending else []
            ended.update((s.document_id, s) for s in found if state_of(s) != "in progress")
            counts = {"done": 0, "failed": 0, "in progress": len(ids) - len(ended)}
            for status in ended.values():
                counts[state_of(status)] += 1
            known = [*ended.values(), *(s for s in found if s.document_id not in ended)]
            for name, finished in passes_finished(known).items():
                progress.update(bars[name], completed=finished)
            progress.update(task, completed=len(ended))
            if counts["in progress"] == 0 or time.monotonic() > deadline:
                return counts
            time.sleep(POLL_S)


def passes_finished(found: Sequence[ingest_pb2.DocumentStatus]) -> dict[str, int]:
    """Per pass, how many of the documents it has finished (done or failed)."""
    finished = dict.fromkeys(PASSES, 0)
    for status in found:
        for p in status.passes:
            name = getattr(p, "pass")
            if name in finished and p.state in ("done", "failed"):
                finished[name] += 1
    return finished


def delete(settings: Settings, tenant: str, document_id: str) -> str:
    reply = ingest_stub(settings).DeleteDocument(
        ingest_pb2.DeleteDocumentRequest(tenant_id=tenant, document_id=document_id), timeout=30
    )
    return str(reply.event_id)


def status_rows(found: Sequence[ingest_pb2.DocumentStatus]) -> list[dict[str, Any]]:
    return [
        {
            "document_id": s.document_id,
            "state": state_of(s),
            "passes": {
                getattr(p, "pass"): {"state": p.state, "updated_at": p.updated_at, "error": p.error}
                for p in s.passes
            },
        }
        for s in found
    ]


def print_status(console: Console, found: Sequence[ingest_pb2.DocumentStatus]) -> None:
    table = Table("document", *PASSES)
    for status in found:
        by_pass = {getattr(p, "pass"): p for p in status.passes}
        cells = []
        for name in PASSES:
            p = by_pass.get(name)
            if p is None:
                cells.append("-")
                continue
            colour = {"done": "green", "failed": "red", "running": "yellow"}.get(p.state, "white")
            cell = f"[{colour}]{p.state}[/]"
            if p.error:
                cell += f"\n{escape(p.error[:120])}"
            cells.append(cell)
        table.add_row(escape(status.document_id), *cells)
    console.print(table)
