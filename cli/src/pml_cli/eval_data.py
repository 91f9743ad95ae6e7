"""The tool sets of the evaluation exchange format: catalog and queries, read and checked."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


class QuerySelection(BaseModel):
    """Which of a set's queries an evaluation runs (`--id-prefix`, `--min-relevant`,
    `--max-queries`), applied in that order."""

    id_prefixes: tuple[str, ...] = ()
    min_relevant: int = Field(default=1, ge=1)
    max_queries: int | None = Field(default=None, ge=1)

    def apply(self, queries: list[ToolQuery]) -> list[ToolQuery]:
        kept = [
            q
            for q in queries
            if len(q.relevant) >= self.min_relevant
            and (not self.id_prefixes or q.id.startswith(self.id_prefixes))
        ]
        return kept[: self.max_queries]

    def describe(self) -> str:
        """What was asked, for the message when nothing is left."""
        parts = [f"{self.min_relevant}+ relevant tools"]
        if self.id_prefixes:
            parts.append("an id starting with " + " or ".join(self.id_prefixes))
        return " and ".join(parts)


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


def variant(
    src: Path, out: Path, descriptions: Path | None = None, queries: Path | None = None
) -> dict[str, Any]:
    """Write `src`'s set to `out` worded otherwise (translated, reworded), so that what the
    wording alone changes can be measured: the tool descriptions of `descriptions` (a JSON
    object, tool id → description) in place of the catalog's, and the requests of `queries`
    (query id → request) in place of theirs. With `queries`, the variant holds those queries
    only (with their relevant tools and, where the set has it, their `query_meta.jsonl` line);
    without, every query unchanged. Every id must be one of the set's."""
    if descriptions is None and queries is None:
        raise EvalError("name --descriptions, --queries or both")
    if src.resolve() == out.resolve():
        raise EvalError("--from and --out must be different folders")
    load_tool_catalog(src)  # the set reads before anything is written
    tools = [json.loads(line) for line in _lines(src / "catalog.jsonl")]
    asked = [json.loads(line) for line in _lines(src / "queries.jsonl")]
    summary: dict[str, Any] = {"out": str(out), "from": str(src), "tools": len(tools)}
    if descriptions is not None:
        replacing = _rewording(descriptions, {row["id"] for row in tools}, "tool")
        for row in tools:
            row["description"] = replacing.get(row["id"], row["description"])
        summary["redescribed"] = len(replacing)
    if queries is not None:
        requests = _rewording(queries, {row["id"] for row in asked}, "query")
        asked = [{**row, "query": requests[row["id"]]} for row in asked if row["id"] in requests]
        summary["reworded"] = len(requests)
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "catalog.jsonl", tools)
    write_jsonl(out / "queries.jsonl", asked)
    if (src / "query_meta.jsonl").exists():
        kept = {row["id"] for row in asked}
        meta = [json.loads(line) for line in _lines(src / "query_meta.jsonl")]
        write_jsonl(out / "query_meta.jsonl", [row for row in meta if row.get("id") in kept])
    summary["queries"] = len(asked)
    return summary


def _rewording(path: Path, known: set[str], kind: str) -> dict[str, str]:
    """A JSON object of `kind` id → its new text, every id one of `known`."""
    try:
        replacing = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EvalError(f"{path}: cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise EvalError(f"{path}: not JSON: {exc}") from exc
    if not isinstance(replacing, dict) or not all(
        isinstance(v, str) and v.strip() for v in replacing.values()
    ):
        raise EvalError(f"{path}: must be an object of {kind} id → non-empty text")
    unknown = sorted(set(replacing) - known)
    if unknown:
        raise EvalError(f"{path}: not {kind} ids of the set: {', '.join(unknown[:5])}")
    return replacing


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One JSON object a line, non-ASCII kept as it is (server names, Chinese descriptions)."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
