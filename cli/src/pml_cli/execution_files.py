"""Read ExecutionCompleted events from a JSON or JSONL file, as an executor would publish them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pml_common.events import EventRejected, ExecutionCompleted, new_event_id, parse_event


class ExecutionFileError(ValueError):
    """The file does not hold valid executions; the message names the file and the entry."""


def load_executions(path: Path, tenant: str) -> list[ExecutionCompleted]:
    """Events of `path`; envelope fields left out (id, type, version, time) are filled in."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ExecutionFileError(f"{path}: cannot read: {exc.strerror}") from exc
    rows = _rows(path, text)
    if not rows:
        raise ExecutionFileError(f"{path}: no execution found")
    return [_event(path, where, row, tenant) for where, row in rows]


def _rows(path: Path, text: str) -> list[tuple[int, Any]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, list):
        return list(enumerate(doc, start=1))
    if isinstance(doc, dict):
        return [(1, doc)]
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                rows.append((number, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise ExecutionFileError(f"{path}:{number}: not JSON: {exc.msg}") from exc
    return rows


def _event(path: Path, where: int, row: Any, tenant: str) -> ExecutionCompleted:
    if not isinstance(row, dict):
        raise ExecutionFileError(f"{path}:{where}: expected a JSON object")
    filled = {"type": ExecutionCompleted.TYPE, "version": ExecutionCompleted.VERSION, **row}
    filled.setdefault("tenant_id", tenant)
    # A file is what an executor would publish: an execution without an id gets one here (the
    # bus then keeps it on redelivery); give `event_id` in the file to make a re-publish a no-op.
    filled.setdefault("event_id", new_event_id())
    try:
        event = parse_event(filled)
    except EventRejected as exc:
        raise ExecutionFileError(f"{path}:{where}: {exc.reason}") from exc
    if not isinstance(event, ExecutionCompleted):
        raise ExecutionFileError(f"{path}:{where}: not an ExecutionCompleted event")
    return event
