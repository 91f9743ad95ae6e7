"""What a tenant, an id, an intent and an event's envelope may be: one set of rules for every door.

A gRPC request (`pml_common.request_validation` and each service's `validation` module) and a
stream entry (`pml_common.events`) carry the same kinds of value, so both are held to the rules
here and refuse the same inputs with the same words. Each check returns the clean value or
raises `InputError` with a message that names the field; the gRPC side turns it into
INVALID_ARGUMENT, the event side into a dead letter with that reason.

Ids are the names agents and servers really use: spaces, dots and any script are data, matched
exactly. Refused are control characters (they garble the logs that quote an id and have no
business in a name), blank ids, ids past `MAX_ID_CHARS`, ids with whitespace around them, and
tool ids that break the `<server>:<tool>` separator rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

#: Longest id (tenant, tool, capability, node, document) any door accepts.
MAX_ID_CHARS = 512
#: Longest `event_id` of an event.
MAX_EVENT_ID_CHARS = 128
#: Longest intent or query accepted anywhere. Agents paste whole documents (an 18,686-character
#: intent holding an image was seen); what is embedded is cut to `PML_EMBED_QUERY_MAX_CHARS`.
MAX_INTENT_CHARS = 100_000
#: Deepest nesting of a tool's `input_schema`. Real JSON Schemas nest a handful of levels; the
#: JSON codecs of the pipeline refuse a few hundred (pydantic serialises at most ~200 deep).
MAX_SCHEMA_DEPTH = 64
#: How far in the future an event's `occurred_at` may be. Events order a document's versions
#: and deletions (`pml_common.latest_wins`), so a clock far ahead would win every later race.
MAX_CLOCK_SKEW = timedelta(minutes=10)

#: The separator of a tool id: `<server>:<tool>`, the server being all before the first one.
TOOL_ID_SEPARATOR = ":"

# C0, DEL and C1 controls, plus the Unicode line and paragraph separators (they break log lines).
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


class InputError(ValueError):
    """A value no door accepts; the message names the field and says what is wrong."""


def has_control(value: str) -> bool:
    return _CONTROL.search(value) is not None


def tenant(value: str, *, field: str = "tenant_id") -> str:
    """The tenant named by `value`, stripped; blank is returned blank (each door decides what
    a blank tenant means: the default tenant for gRPC, a refusal for events)."""
    clean = value.strip()
    if len(clean) > MAX_ID_CHARS:
        raise InputError(f"{field} is longer than {MAX_ID_CHARS} characters")
    if has_control(clean):
        raise InputError(f"{field} must not hold control characters")
    return clean


def node_id_problem(value: str) -> str | None:
    """Why `value` cannot be a node id (tool, capability, step), or None: not blank, bounded,
    no control characters, and no whitespace around it, since requests naming a node are
    stripped (`" cap"` could be stored but never found again)."""
    if not value.strip():
        return "must not be empty"
    if len(value) > MAX_ID_CHARS:
        return f"is longer than {MAX_ID_CHARS} characters"
    if has_control(value):
        return "must not hold control characters"
    if value != value.strip():
        return "must not start or end with whitespace"
    return None


def node_id(value: str, *, field: str = "id") -> str:
    problem = node_id_problem(value)
    if problem:
        raise InputError(f"{field} {problem}")
    return value


#: Longest document id (ingest); shorter than other ids, as it is part of every context id.
MAX_DOCUMENT_ID_CHARS = 256
_BLANK_OR_CONTROL = re.compile(r"[\s\x00-\x1f\x7f-\x9f]")


def document_id_problem(value: str) -> str | None:
    """Why `value` cannot be a document id, or None: documents are named by a token (it is
    quoted in context ids and file-like names), so no whitespace, no control characters."""
    if not value:
        return "must not be empty"
    if len(value) > MAX_DOCUMENT_ID_CHARS:
        return f"is longer than {MAX_DOCUMENT_ID_CHARS} characters"
    if _BLANK_OR_CONTROL.search(value):
        return "must not contain whitespace or control characters"
    return None


def document_id(value: str, *, field: str = "document_id") -> str:
    problem = document_id_problem(value)
    if problem:
        raise InputError(f"{field} {problem}")
    return value


def tool_id_problem(value: str) -> str | None:
    """Why `value` is not a tool id, or None when it is one.

    `<server>:<tool>`: the server is everything before the first `:` (so a server name cannot
    hold one; the tool name may), both parts are non-blank and neither starts or ends with
    whitespace (ids are matched exactly, and `"a :b"` next to `"a:b"` would be a trap).
    """
    if len(value) > MAX_ID_CHARS:
        return f"is longer than {MAX_ID_CHARS} characters"
    if has_control(value):
        return "must not hold control characters"
    server, sep, name = value.partition(TOOL_ID_SEPARATOR)
    if not sep or not server.strip() or not name.strip():
        return "must be '<server>:<tool>' with a server and a tool name"
    if server != server.strip() or name != name.strip():
        return "must not have spaces around the server or the tool name"
    return None


def is_tool_id(value: str) -> bool:
    return tool_id_problem(value) is None


def tool_id(value: str, *, field: str = "id") -> str:
    problem = tool_id_problem(value)
    if problem:
        raise InputError(f"{field} {problem}")
    return value


def server_of(tool: str) -> str:
    """The server part of a valid tool id."""
    return tool.partition(TOOL_ID_SEPARATOR)[0]


def server_problem(server: str, tool: str) -> str | None:
    """Why `server` cannot be the server of tool id `tool`, or None.

    The id's server part is the server's name, unless the name holds the separator, which an
    id cannot: then the catalog spells the id's part its own way and the name is kept as given.
    """
    if has_control(server):
        return "server must not hold control characters"
    if TOOL_ID_SEPARATOR in server:
        return None
    if server != server_of(tool):
        return f"server {server!r} does not match the id's server {server_of(tool)!r}"
    return None


def intent(value: str, *, field: str = "intent", max_chars: int = MAX_INTENT_CHARS) -> str:
    """An intent or query: not blank, at most `max_chars` long; returned stripped."""
    clean = value.strip()
    if not clean:
        raise InputError(f"{field} must not be empty")
    if len(value) > max_chars:
        raise InputError(f"{field} is {len(value)} characters long; the maximum is {max_chars}")
    return clean


def event_id(value: str) -> str:
    if not value.strip():
        raise InputError("event_id must not be empty")
    if len(value) > MAX_EVENT_ID_CHARS:
        raise InputError(f"event_id is longer than {MAX_EVENT_ID_CHARS} characters")
    if has_control(value):
        raise InputError("event_id must not hold control characters")
    return value


def occurred_at(value: datetime, *, now: datetime | None = None) -> datetime:
    """An event's time, in UTC (a time without zone is read as UTC), not past the clock skew."""
    at = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    limit = (now or datetime.now(UTC)) + MAX_CLOCK_SKEW
    if at > limit:
        raise InputError(
            f"occurred_at {at.isoformat()} is in the future by more than "
            f"{int(MAX_CLOCK_SKEW.total_seconds())} s (a clock is wrong)"
        )
    return at


def json_depth(value: Any) -> int:
    """How deep containers nest in a decoded JSON value (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        children = _children(item)
        if children is None:
            continue
        deepest = max(deepest, depth + 1)
        stack.extend((child, depth + 1) for child in children)
    return deepest


def _children(item: Any) -> Iterator[Any] | None:
    if isinstance(item, dict):
        return iter(item.values())
    if isinstance(item, list | tuple):
        return iter(item)
    return None


def input_schema(value: dict[str, Any] | None, *, field: str = "input_schema") -> Any:
    """A tool's JSON Schema: an object nested at most `MAX_SCHEMA_DEPTH` levels."""
    if value is not None and json_depth(value) > MAX_SCHEMA_DEPTH:
        raise InputError(f"{field} is nested deeper than {MAX_SCHEMA_DEPTH} levels")
    return value
