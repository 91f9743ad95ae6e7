"""Event schemas hold events to the rules gRPC requests follow (`pml_common.input_rules`)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from pml_common.events import (
    EventRejected,
    ExecutionCompleted,
    ExecutionStep,
    ToolSpec,
    ToolsRegistered,
    parse_event,
)

REAL_IDS = [
    "MCP Jupiter:jupiter_get_quote",  # spaces, as real server names have them
    "pure.md MCP server:unblock-url",  # dots
    "Peekaboo MCP - Lightning-fast macOS Screenshots:image",
    "Яндекс Трекер:задачи",  # non-Latin letters
    "高德地图:maps_geo",
    "srv:tool:with:colons",  # the tool part may hold the separator
]


def execution(**fields: Any) -> dict[str, Any]:
    event = ExecutionCompleted.create(
        tenant_id="t1",
        intent="read a file",
        steps=[ExecutionStep(node_id="fs:read", success=True)],
        outcome="success",
    )
    return {**json.loads(event.to_json()), **fields}


def reason_of(payload: dict[str, Any]) -> str:
    with pytest.raises(EventRejected) as info:
        parse_event(json.dumps(payload))
    return info.value.reason


def test_event_id_is_required_not_made_up() -> None:
    payload = execution()
    del payload["event_id"]
    assert "event_id: Field required" in reason_of(payload)
    assert "event_id must not be empty" in reason_of(execution(event_id="  "))
    assert "control characters" in reason_of(execution(event_id="a\nb"))
    # created in code, an event gets a fresh id
    assert execution()["event_id"] != execution()["event_id"]


def test_tenant_is_normalised_or_refused_like_a_request() -> None:
    assert parse_event(json.dumps(execution(tenant_id="  acme "))).tenant_id == "acme"
    assert parse_event(json.dumps(execution(tenant_id="ａcme 東京"))).tenant_id == "ａcme 東京"
    assert "tenant_id must not hold control characters" in reason_of(execution(tenant_id="a\x00"))
    assert "tenant_id must not be blank" in reason_of(execution(tenant_id=" "))
    assert "tenant_id is longer than 512" in reason_of(execution(tenant_id="t" * 513))


@pytest.mark.parametrize("tool_id", REAL_IDS)
def test_real_server_names_are_tool_ids(tool_id: str) -> None:
    steps = [{"node_id": tool_id, "success": True, "depends_on": []}]
    assert parse_event(json.dumps(execution(steps=steps))).steps[0].node_id == tool_id  # type: ignore[attr-defined]
    spec = ToolSpec(id=tool_id, server=tool_id.partition(":")[0], name="n")
    assert spec.id == tool_id


@pytest.mark.parametrize(
    ("tool_id", "fragment"),
    [
        ("no separator", "'<server>:<tool>'"),
        (":tool", "'<server>:<tool>'"),
        ("server:", "'<server>:<tool>'"),
        ("server : tool", "spaces around"),
        (" server:tool", "spaces around"),
        ("server:tool\n", "control characters"),
        ("serv\x1ber:tool", "control characters"),
        ("s:" + "t" * 511, "at most 512 characters"),
    ],
)
def test_tool_ids_breaking_the_rules_are_refused(tool_id: str, fragment: str) -> None:
    tools = [{"id": tool_id, "server": "s", "name": "n"}]
    payload = json.loads(
        ToolsRegistered.create(tools=[ToolSpec(id="a:b", server="a", name="b")]).to_json()
    )
    assert fragment in reason_of({**payload, "tools": tools})


def test_server_must_match_the_id_unless_it_holds_the_separator() -> None:
    assert ToolSpec(id="Windows -:find", server="Windows:", name="find").server == "Windows:"
    with pytest.raises(ValueError, match="does not match the id's server"):
        ToolSpec(id="fs:read", server="filesystem", name="read")


def test_an_intent_as_long_as_agents_send_is_accepted() -> None:
    pasted = "describe this image: " + "iVBORw0KGgo" * 1700  # 18,721 characters
    event = parse_event(json.dumps(execution(intent=pasted)))
    assert event.intent == pasted  # type: ignore[attr-defined]
    assert "intent must not be empty" in reason_of(execution(intent="   "))
    assert "intent" in reason_of(execution(intent="x" * 100_001))


def test_ids_of_steps_and_capabilities_have_no_control_characters() -> None:
    steps = [{"node_id": "cap\x07", "success": True, "depends_on": []}]
    assert "control characters" in reason_of(execution(steps=steps))
    assert "control characters" in reason_of(execution(capability_id="c\r\n"))


def test_ids_of_steps_and_capabilities_have_no_whitespace_around_them() -> None:
    """Requests naming a node are stripped: a padded id could be stored, never found again."""
    for padded in (" cap", "cap ", "cap\u3000"):
        steps = [{"node_id": padded, "success": True, "depends_on": []}]
        assert "must not start or end with whitespace" in reason_of(execution(steps=steps))
        assert "whitespace" in reason_of(execution(capability_id=padded))
    steps = [{"node_id": "my cap", "success": True, "depends_on": []}]  # inside: data
    assert parse_event(json.dumps(execution(steps=steps))).steps[0].node_id == "my cap"  # type: ignore[attr-defined]


def test_occurred_at_within_the_clock_skew() -> None:
    soon = datetime.now(UTC) + timedelta(minutes=5)
    assert parse_event(json.dumps(execution(occurred_at=soon.isoformat()))).occurred_at == soon
    later = datetime.now(UTC) + timedelta(hours=2)
    assert "in the future" in reason_of(execution(occurred_at=later.isoformat()))
    naive = datetime(2025, 1, 2, 3, 4, 5).isoformat()  # no zone: read as UTC
    assert parse_event(json.dumps(execution(occurred_at=naive))).occurred_at.tzinfo is not None


@pytest.mark.parametrize("version", ["1", True, 1.0])
def test_a_version_that_is_not_an_integer_is_refused_by_both_parsers(version: object) -> None:
    payload = json.dumps(execution(version=version))
    with pytest.raises(EventRejected, match="non-integer `version`"):
        parse_event(payload)
    with pytest.raises(ValidationError, match="version"):  # the consumers' one-pass parse
        ExecutionCompleted.model_validate_json(payload)


def test_nesting_beyond_any_decoder_is_a_rejection_not_a_crash() -> None:
    deep = json.dumps(execution(steps="X")).replace('"X"', "[" * 5000 + "]" * 5000)
    with pytest.raises(EventRejected, match="nested too deeply"):
        parse_event(deep)
    schema: dict[str, Any] = {}
    for _ in range(300):
        schema = {"a": schema}
    with pytest.raises(ValueError, match="nested deeper than 64 levels"):
        ToolSpec(id="a:b", server="a", name="b", input_schema=schema)


def test_document_ids_follow_the_ingest_rule() -> None:
    submitted = {
        "event_id": "e1",
        "type": "DocumentSubmitted",
        "version": 1,
        "tenant_id": "t1",
        "document_id": "doc-1",
        "text": "Some text.",
    }
    assert parse_event(json.dumps(submitted)).document_id == "doc-1"  # type: ignore[attr-defined]
    for bad in ("two words", "tab\there", ""):
        reason = reason_of({**submitted, "document_id": bad})
        assert "document_id" in reason
