"""The tool sets of the evaluation exchange format: catalog and queries, read and checked."""

from __future__ import annotations

import json
import shutil
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


def redescribed(src: Path, descriptions: Path, out: Path) -> dict[str, Any]:
    """Write `src`'s set to `out` with the tool descriptions of `descriptions` (a JSON object,
    tool id → description) in place of the catalog's: the same tasks over tools described
    otherwise (translated, reworded), so that what the wording alone changes can be measured.
    Every id must be one of the catalog's; the queries are copied unchanged."""
    if src.resolve() == out.resolve():
        raise EvalError("--from and --out must be different folders")
    load_tool_catalog(src)  # the set reads before anything is written
    try:
        replacing = json.loads(descriptions.read_text(encoding="utf-8"))
    except OSError as exc:
        raise EvalError(f"{descriptions}: cannot read: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise EvalError(f"{descriptions}: not JSON: {exc}") from exc
    if not isinstance(replacing, dict) or not all(
        isinstance(v, str) and v.strip() for v in replacing.values()
    ):
        raise EvalError(f"{descriptions}: must be an object of tool id → non-empty description")
    rows = [json.loads(line) for line in _lines(src / "catalog.jsonl")]
    unknown = sorted(set(replacing) - {row["id"] for row in rows})
    if unknown:
        raise EvalError(f"{descriptions}: not tools of {src}: {', '.join(unknown[:5])}")
    for row in rows:
        row["description"] = replacing.get(row["id"], row["description"])
    out.mkdir(parents=True, exist_ok=True)
    write_jsonl(out / "catalog.jsonl", rows)
    shutil.copyfile(src / "queries.jsonl", out / "queries.jsonl")
    return {"out": str(out), "from": str(src), "tools": len(rows), "redescribed": len(replacing)}


def write_jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    """One JSON object a line, non-ASCII kept as it is (server names, Chinese descriptions)."""
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
