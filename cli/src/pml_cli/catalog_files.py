"""Read tool catalogs from the evaluation exchange format and from MCP `tools/list` answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pml_common.events import ToolSpec


class CatalogFileError(ValueError):
    """The file cannot be read as a catalog; the message names the file and the line."""


def load_catalog(path: Path, server: str | None = None) -> list[ToolSpec]:
    """Tools of `path`: a `catalog.jsonl` (one tool a line) or an MCP `tools/list` JSON.

    `server` is required for `tools/list`, whose tools do not name their server.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CatalogFileError(f"{path}: cannot read: {exc.strerror}") from exc
    stripped = text.lstrip()
    if not stripped:
        raise CatalogFileError(f"{path}: the file is empty")
    if path.suffix == ".jsonl" or _looks_like_jsonl(stripped):
        tools = _from_jsonl(path, text)
    else:
        tools = _from_tools_list(path, text, server)
    if not tools:
        raise CatalogFileError(f"{path}: no tools found")
    _reject_duplicates(path, tools)
    return tools


def _looks_like_jsonl(text: str) -> bool:
    first = text.splitlines()[0].strip()
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and "id" in row and "server" in row


def _from_jsonl(path: Path, text: str) -> list[ToolSpec]:
    tools = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CatalogFileError(f"{path}:{number}: not JSON: {exc.msg}") from exc
        tools.append(_tool(path, number, row))
    return tools


def _from_tools_list(path: Path, text: str, server: str | None) -> list[ToolSpec]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CatalogFileError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    if isinstance(doc, dict) and isinstance(doc.get("result"), dict):
        doc = doc["result"]  # a whole JSON-RPC response
    if not isinstance(doc, dict) or not isinstance(doc.get("tools"), list):
        raise CatalogFileError(
            f"{path}: neither catalog.jsonl nor an MCP tools/list result (no `tools` array)"
        )
    if not server:
        raise CatalogFileError(f"{path}: an MCP tools/list file needs --server NAME")
    tools = []
    for number, item in enumerate(doc["tools"], start=1):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise CatalogFileError(f"{path}: tool #{number} has no string `name`")
        row = {
            "id": f"{server}:{item['name']}",
            "server": server,
            "name": item["name"],
            "description": item.get("description") or "",
            "input_schema": item.get("inputSchema"),
        }
        tools.append(_tool(path, number, row))
    return tools


def _tool(path: Path, where: int, row: Any) -> ToolSpec:
    if not isinstance(row, dict):
        raise CatalogFileError(f"{path}:{where}: expected a JSON object")
    try:
        return ToolSpec.model_validate(row)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"])
        raise CatalogFileError(f"{path}:{where}: {field}: {first['msg']}") from exc


def _reject_duplicates(path: Path, tools: list[ToolSpec]) -> None:
    seen: set[str] = set()
    for tool in tools:
        if tool.id in seen:
            raise CatalogFileError(f"{path}: tool id {tool.id!r} appears twice")
        seen.add(tool.id)
