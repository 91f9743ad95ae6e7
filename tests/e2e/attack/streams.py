"""Stream entries an attacker with write access to Redis could append, what the bus must do with
each (handle it, or dead-letter it with a reason), and how a test watches the running groups."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import redis
from hypothesis import strategies as st

from pml_common.bus import EVENT_FIELD
from pml_common.events import EVENT_TYPES, Event, EventRejected, Streams, parse_event

from . import hostile
from .report import Terse

#: An entry's fields as XADD writes them.
Fields = dict[str, bytes]

#: The event class each stream carries.
EVENT_OF_STREAM: dict[str, type[Event]] = {cls.STREAM: cls for cls in EVENT_TYPES}
_PAST = "2025-01-01T00:00:00+00:00"


@dataclass(frozen=True)
class _Values:
    """Where an event's tenant, ids and texts come from."""

    tenants: st.SearchStrategy[str]
    tool_ids: st.SearchStrategy[str]
    ids: st.SearchStrategy[str]
    texts: st.SearchStrategy[str]


_sane_tool_ids = st.tuples(hostile.sane, hostile.sane).map(":".join)
#: What a publisher usually writes: valid events, of which the consumers make something.
_USUAL = _Values(
    st.sampled_from([t for t in hostile.ATTACKERS if t]),
    st.one_of(_sane_tool_ids, st.sampled_from(hostile.VICTIM_TOOLS)),
    hostile.sane,
    st.sampled_from(("read a file", "open the vault")),
)
_big = hostile.oversized_for_events
_HOSTILE = _Values(
    hostile.tenants_with(_big),
    st.one_of(_sane_tool_ids, hostile.ids_with(_big)),
    hostile.ids_with(_big),
    hostile.texts_with(_big),
)


def _tool_spec(tool_id: str, description: str) -> dict[str, Any]:
    server, _, name = tool_id.partition(":")
    return {"id": tool_id, "server": server, "name": name or "x", "description": description}


def _chunk(chunk_id: str, text: str) -> dict[str, Any]:
    return {
        "chunk_id": chunk_id,
        "context_id": f"ctx-{chunk_id}",
        "section_path": "",
        "text": text,
        "char_start": 0,
        "char_end": len(text),
    }


def _body(event_type: str, v: _Values) -> st.SearchStrategy[dict[str, Any]]:
    """The fields of an event of `event_type` beyond its envelope."""
    bodies: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        "ToolsRegistered": st.builds(
            lambda tools: {"tools": tools},
            st.lists(st.builds(_tool_spec, v.tool_ids, v.texts), min_size=1, max_size=3),
        ),
        "CapabilityLearned": st.builds(
            lambda id_, name, members: {"capability": {"id": id_, "name": name, "tools": members}},
            v.ids,
            v.texts,
            st.lists(v.tool_ids, max_size=3),
        ),
        "ExecutionCompleted": st.builds(
            lambda intent, nodes, outcome: {
                "intent": intent,
                "steps": [{"node_id": n, "success": True} for n in nodes],
                "outcome": outcome,
            },
            v.texts,
            st.lists(v.tool_ids, min_size=1, max_size=3),
            st.sampled_from(("success", "failure", "partial")),
        ),
        "GraphChanged": st.builds(
            lambda reason, nodes: {"reason": reason, "node_ids": nodes},
            st.sampled_from(("execution_completed", "tools_registered", "")),
            st.lists(v.tool_ids, max_size=3),
        ),
        "ModelPublished": st.builds(
            lambda version, token: {
                "model_version": version,
                "fencing_token": token,
                "metrics": {},
            },
            v.ids,
            st.integers(-1, 2**70),
        ),
        "TenantDeleted": st.just({}),
        "ChunksExtracted": st.builds(
            lambda doc, chunks: {"document_id": doc, "chunks": chunks},
            v.ids,
            st.lists(st.builds(_chunk, hostile.sane, v.texts), max_size=2),
        ),
    }
    return bodies.get(event_type, st.builds(lambda doc: {"document_id": doc}, v.ids))


def _event(cls: type[Event], v: _Values) -> st.SearchStrategy[dict[str, Any]]:
    """An event of `cls` as a publisher would write it, with values from `v`."""
    envelope = st.builds(
        lambda event_id, tenant: {
            "event_id": event_id,
            "type": cls.TYPE,
            "version": cls.VERSION,
            "occurred_at": _PAST,
            "tenant_id": tenant,
            "trace": {},
        },
        st.one_of(st.uuids().map(lambda u: u.hex), v.ids),
        v.tenants,
    )
    return st.builds(lambda head, rest: {**head, **rest}, envelope, _body(cls.TYPE, v))


_NESTED = "@nested@"  # stands for deeply nested JSON spliced into the encoded text
_BAD_VERSIONS = (0, 2, 9, -1, "1", True, 1.0, 2**70, None)
_BAD_TIMES = ("2999-01-01T00:00:00Z", "yesterday", 0, "", None)


def _mutated(payload: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`payload` broken in one way: a field missing, mistyped, nested too deeply,
    an unknown field, another type or version, a time that is not one or too far ahead."""
    keys = sorted(payload)
    other_types = [cls.TYPE for cls in EVENT_TYPES] + ["", "Nope", 1, None]

    def with_(key: str, value: Any) -> dict[str, Any]:
        return {**payload, key: value}

    return st.one_of(
        st.sampled_from(keys).map(lambda k: {kk: v for kk, v in payload.items() if kk != k}),
        st.builds(with_, st.sampled_from(keys), hostile.json_values),
        st.builds(with_, st.sampled_from(keys), st.just(_NESTED)),
        st.just(with_("unexpected", 1)),
        st.sampled_from(_BAD_VERSIONS).map(lambda v: with_("version", v)),
        st.sampled_from(other_types).map(lambda t: with_("type", t)),
        st.sampled_from(_BAD_TIMES).map(lambda t: with_("occurred_at", t)),
    )


def _encoded(payload: dict[str, Any], nested: str) -> bytes:
    return json.dumps(payload, ensure_ascii=False).replace(json.dumps(_NESTED), nested).encode()


def entries_for(stream: str) -> st.SearchStrategy[Fields]:
    """Fields of one entry appended to `stream`: an event of the stream's type (usual, with
    hostile values, or broken), another stream's event, or no event at all (not JSON, not
    UTF-8, no `data` field)."""
    cls = EVENT_OF_STREAM[stream]
    usual = _event(cls, _USUAL)
    events = hostile.weighted(
        (3, usual),
        (1, _event(cls, _HOSTILE)),
        (1, usual.flatmap(_mutated)),
        (1, _event(cls, _HOSTILE).flatmap(_mutated)),
        (1, st.sampled_from(EVENT_TYPES).flatmap(lambda other: _event(other, _USUAL))),
    )
    as_data = st.builds(
        lambda payload, nested: {EVENT_FIELD: _encoded(payload, nested)}, events, hostile.nested
    )
    garbage = st.one_of(
        st.binary(max_size=40),
        st.text(max_size=40).map(str.encode),
        hostile.json_values.map(lambda v: json.dumps(v).encode()),
        hostile.nested.map(str.encode),
    ).map(lambda data: {EVENT_FIELD: data})
    no_data = st.dictionaries(
        st.text(min_size=1, max_size=8).filter(lambda k: k != EVENT_FIELD),
        st.binary(max_size=16),
        min_size=1,
        max_size=3,
    )
    return hostile.weighted((3, as_data), (1, garbage), (1, no_data))


def must_reject(stream: str, fields: Fields) -> bool:
    """Whether the event rules refuse this entry on `stream`, decided here with the same
    `parse_event` the consumers use. (The words of the reason may differ: JSON nested about as
    deep as the interpreter's recursion limit is "not an object" here and "nested too deeply"
    in a service whose stack is deeper already.)"""
    payload = fields.get(EVENT_FIELD)
    if payload is None:
        return True
    try:
        event = parse_event(payload)
    except EventRejected:
        return True
    return stream != event.STREAM


def named_nodes(fields: Fields) -> tuple[str, list[str]] | None:
    """(tenant, node ids) a ToolsRegistered or CapabilityLearned entry would write, when its
    payload is readable enough to say."""
    try:
        data = json.loads(fields.get(EVENT_FIELD, b""))
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("tenant_id"), str):
        return None
    found: list[Any] = []
    if isinstance(data.get("tools"), list):
        found = [t.get("id") for t in data["tools"] if isinstance(t, dict)]
    elif isinstance(data.get("capability"), dict):
        found = [data["capability"].get("id")]
    named = [n for n in found if isinstance(n, str) and n.strip()]
    return (data["tenant_id"], named) if named else None


# --- watching the running groups -----------------------------------------------------------------


def _entry_key(entry_id: str) -> tuple[int, int]:
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


@dataclass(frozen=True)
class BusWatch(Terse):
    """The consumer groups of the services under test, seen through Redis.

    Groups of services stopped earlier in the session (other modules' stacks) stay in Redis
    and never read again, so a group counts when one of its consumers is a running process's.
    `client` decodes replies; `raw` does not, for replies that quote entries (which need not
    be UTF-8).
    """

    client: redis.Redis
    raw: redis.Redis
    consumers: frozenset[str]

    def append(self, stream: str, fields: Fields) -> str:
        return str(self.client.xadd(stream, fields))  # type: ignore[arg-type]

    def close(self) -> None:
        self.client.close()
        self.raw.close()

    def live_groups(self, stream: str) -> list[str]:
        return [
            group["name"]
            for group in self.client.xinfo_groups(stream)
            if self.consumers
            & {c["name"] for c in self.client.xinfo_consumers(stream, group["name"])}
        ]

    def attacked_streams(self) -> list[str]:
        """Event streams some running group consumes."""
        return [s for s in EVENT_OF_STREAM if self.client.exists(s) and self.live_groups(s)]

    def last_id(self, stream: str) -> str:
        if not self.client.exists(stream):
            return "0-0"
        last: bytes = self.raw.xinfo_stream(stream)["last-generated-id"]
        return last.decode()

    def settled(self, stream: str, entry_id: str, groups: Iterable[str]) -> bool:
        """Every group in `groups` has read the entry and acknowledged it."""
        info = {g["name"]: g for g in self.client.xinfo_groups(stream)}
        for group in groups:
            if _entry_key(info[group]["last-delivered-id"]) < _entry_key(entry_id):
                return False
            if self.client.xpending_range(stream, group, entry_id, entry_id, 1):
                return False
        return True

    def dead_letters_after(self, start: str) -> list[dict[str, str]]:
        entries = self.client.xrange(Streams.DEAD_LETTER, min=f"({start}")
        return [fields for _, fields in cast("list[tuple[str, dict[str, str]]]", entries)]

    def quiet(self) -> bool:
        """No running group has an entry left to read or to acknowledge."""
        for stream in self.attacked_streams():
            last = _entry_key(self.last_id(stream))
            live = set(self.live_groups(stream))
            for group in self.client.xinfo_groups(stream):
                if group["name"] in live and (
                    group["pending"] or _entry_key(group["last-delivered-id"]) < last
                ):
                    return False
        return True


def watch(url: str, pids: Iterable[int]) -> BusWatch:
    """A watch over the groups of the processes `pids`, whose consumer names the process
    launcher set in their environment (`PML_CONSUMER_NAME`)."""
    return BusWatch(
        redis.Redis.from_url(url, decode_responses=True),
        redis.Redis.from_url(url),
        frozenset(_consumer_name(pid) for pid in pids),
    )


def _consumer_name(pid: int) -> str:
    with open(f"/proc/{pid}/environ", "rb") as environ:
        for item in environ.read().split(b"\0"):
            name, _, value = item.partition(b"=")
            if name == b"PML_CONSUMER_NAME":
                return value.decode()
    raise LookupError(f"process {pid} has no PML_CONSUMER_NAME")
