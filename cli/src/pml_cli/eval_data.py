"""The tool sets of the evaluation exchange format: catalog and queries, read and checked."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from pml_cli.catalog_files import CatalogFileError, load_catalog
from pml_common.events import ToolSpec


class EvalError(ValueError):
    """The evaluation cannot run; the message says why."""


class ToolQuery(BaseModel):
    id: str
    query: str = Field(min_length=1)
    relevant: list[str] = Field(min_length=1)
    sequence: list[str] | None = None


def load_queries(path: Path, limit: int | None = None) -> list[ToolQuery]:
    queries = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalError(f"{path}: cannot read: {exc.strerror}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            queries.append(ToolQuery.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            raise EvalError(f"{path}:{number}: not a query of the exchange format: {exc}") from exc
        if limit is not None and len(queries) >= limit:
            break
    return queries


def load_tool_catalog(data: Path) -> list[ToolSpec]:
    """The set's `catalog.jsonl`, or an `EvalError` saying what is wrong with it."""
    try:
        return load_catalog(data / "catalog.jsonl")
    except CatalogFileError as exc:
        raise EvalError(str(exc)) from exc
