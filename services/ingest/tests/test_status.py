"""Document statuses in the real Redis: one tenant's documents never touch another's."""

from __future__ import annotations

import uuid

from pml_ingest.status import DONE, PENDING, StatusStore


async def test_tenant_and_document_ids_holding_colons_never_share_a_status(redis) -> None:
    """Tenant `a:x` with document `y` and tenant `a` with document `x:y` once had the same
    key: one tenant read the other's status, skipped its document as unchanged, and deleted
    the other's status."""
    status = StatusStore(redis)
    base = f"t{uuid.uuid4().hex[:8]}"
    first, second = (f"{base}:x", "y"), (base, "x:y")
    await status.submitted(*first, content_hash="h-first", title="first")
    await status.submitted(*second, content_hash="h-second", title="second")
    assert await status.mark(*first, "h-first", "chunking", DONE)

    got_first, got_second = await status.get(*first), await status.get(*second)
    assert got_first is not None and got_second is not None
    assert (got_first.title, got_first.content_hash) == ("first", "h-first")
    assert (got_second.title, got_second.content_hash) == ("second", "h-second")
    assert got_second.passes[0].state == PENDING  # the other tenant's progress is not its own

    assert await status.forget_tenant(first[0]) == 1
    assert await status.get(*first) is None
    assert await status.get(*second) is not None
    assert await status.documents(second[0]) == ["x:y"]
