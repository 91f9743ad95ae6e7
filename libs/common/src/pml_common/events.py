"""Event schemas of PML and the streams that carry them.

Every event is a JSON object with `event_id`, `type`, `version`, `occurred_at`, `tenant_id` and
`trace` (W3C trace context). Each event type has its own Redis stream; `STREAM_OF` maps one to
the other. A payload that does not validate, names an unknown type or a version this code does
not know is rejected with `EventRejected`, whose reason goes to the dead-letter stream.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from pml_common import input_rules


def _tenant(value: str) -> str:
    clean = input_rules.tenant(value)
    if not clean:  # the publisher resolved the default tenant; a blank one is a broken event
        raise input_rules.InputError("tenant_id must not be blank")
    return clean


# The rules of `pml_common.input_rules`, the same the gRPC requests follow; a pydantic
# `max_length` first refuses a huge value before a validator reads it.
NonEmpty = Annotated[str, Field(min_length=1, max_length=input_rules.MAX_ID_CHARS)]
Id = Annotated[
    str,
    Field(max_length=input_rules.MAX_ID_CHARS),
    AfterValidator(lambda v: input_rules.node_id(v, field="id")),
]
ToolId = Annotated[
    str,
    Field(max_length=input_rules.MAX_ID_CHARS),
    AfterValidator(lambda v: input_rules.tool_id(v, field="tool id")),
]
DocumentId = Annotated[
    str,
    Field(max_length=input_rules.MAX_ID_CHARS),
    AfterValidator(input_rules.document_id),
]
TenantId = Annotated[str, Field(max_length=input_rules.MAX_ID_CHARS * 2), AfterValidator(_tenant)]


def new_event_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


class Streams:
    """Stream names, one per event type, plus the dead-letter stream."""

    TOOLS_REGISTERED = "pml:events:tools-registered"
    CAPABILITY_LEARNED = "pml:events:capability-learned"
    EXECUTION_COMPLETED = "pml:events:execution-completed"
    GRAPH_CHANGED = "pml:events:graph-changed"
    MODEL_PUBLISHED = "pml:events:model-published"
    TENANT_DELETED = "pml:events:tenant-deleted"
    DOCUMENT_SUBMITTED = "pml:events:document-submitted"
    DOCUMENT_DELETED = "pml:events:document-deleted"
    CHUNKS_EXTRACTED = "pml:events:chunks-extracted"
    CHUNKING_COMPLETED = "pml:events:chunking-completed"
    PASS1_COMPLETED = "pml:events:pass1-completed"
    PASS2A_COMPLETED = "pml:events:pass2a-completed"
    PASS2B_COMPLETED = "pml:events:pass2b-completed"
    PASS3_COMPLETED = "pml:events:pass3-completed"
    DEAD_LETTER = "pml:events:dead-letter"


class Event(BaseModel):
    """Envelope shared by every event."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    STREAM: ClassVar[str]

    # Required: a redelivered entry must carry the same id, or it would count twice
    # (`create` makes one for events built in code).
    event_id: Annotated[
        str,
        Field(max_length=input_rules.MAX_EVENT_ID_CHARS),
        AfterValidator(input_rules.event_id),
    ]
    type: str
    # Strict, so that validating the JSON in one pass (what the consumers do first) refuses
    # what `parse_event` refuses: lax mode would read "1", true or 1.0 as version 1.
    version: int = Field(strict=True)
    occurred_at: Annotated[datetime, AfterValidator(input_rules.occurred_at)] = Field(
        default_factory=utcnow
    )
    tenant_id: TenantId = "default"
    trace: dict[str, str] = Field(
        default_factory=dict, description="W3C trace context (traceparent, tracestate)."
    )

    @classmethod
    def create(cls, **fields: Any) -> Any:
        """Build the event with its type, version and (unless given) a new event id filled in."""
        fields.setdefault("event_id", new_event_id())
        return cls(type=cls.TYPE, version=cls.VERSION, **fields)

    def to_json(self) -> str:
        return self.model_dump_json()


class ToolSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: ToolId
    server: NonEmpty
    name: NonEmpty
    description: str = Field("", max_length=20_000)
    input_schema: Annotated[dict[str, Any] | None, AfterValidator(input_rules.input_schema)] = None

    @model_validator(mode="after")
    def _server_matches_id(self) -> ToolSpec:
        problem = input_rules.server_problem(self.server, self.id)
        if problem:
            raise ValueError(problem)
        return self


class CapabilitySpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: Id
    name: NonEmpty
    description: str = Field("", max_length=20_000)
    tools: list[ToolId] = Field(default_factory=list, max_length=1000)
    capabilities: list[Id] = Field(default_factory=list, max_length=1000)
    source: Literal["observed", "inferred", "template"] = "observed"


class ExecutionStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    node_id: Id = Field(description="Tool id, or capability id for a nested capability.")
    success: bool
    duration_ms: float = Field(0.0, ge=0)
    error: str | None = Field(None, max_length=4000)
    depends_on: list[Id] = Field(
        default_factory=list,
        max_length=1000,
        description="Node ids of earlier steps whose output this step used (dependency edges).",
    )


class ToolsRegistered(Event):
    TYPE: ClassVar[str] = "ToolsRegistered"
    STREAM: ClassVar[str] = Streams.TOOLS_REGISTERED
    type: Literal["ToolsRegistered"]
    tools: list[ToolSpec] = Field(min_length=1, max_length=50_000)


class CapabilityLearned(Event):
    TYPE: ClassVar[str] = "CapabilityLearned"
    STREAM: ClassVar[str] = Streams.CAPABILITY_LEARNED
    type: Literal["CapabilityLearned"]
    capability: CapabilitySpec


class ExecutionCompleted(Event):
    TYPE: ClassVar[str] = "ExecutionCompleted"
    STREAM: ClassVar[str] = Streams.EXECUTION_COMPLETED
    type: Literal["ExecutionCompleted"]
    intent: Annotated[str, AfterValidator(input_rules.intent)] = Field(
        max_length=input_rules.MAX_INTENT_CHARS
    )
    steps: list[ExecutionStep] = Field(min_length=1, max_length=1000)
    outcome: Literal["success", "failure", "partial"]
    capability_id: Id | None = Field(None, description="Capability the run executed, if any.")


class GraphChanged(Event):
    """Published by the trainer after it changed statistics or edges of the tool graph."""

    TYPE: ClassVar[str] = "GraphChanged"
    STREAM: ClassVar[str] = Streams.GRAPH_CHANGED
    type: Literal["GraphChanged"]
    reason: str
    node_ids: list[str] = Field(default_factory=list)

    #: `reason` of a change made by an execution: statistics and links of existing nodes
    #: (plus any node the run named that the graph did not have yet), never texts or members.
    EXECUTION: ClassVar[str] = "execution_completed"


class ModelPublished(Event):
    TYPE: ClassVar[str] = "ModelPublished"
    STREAM: ClassVar[str] = Streams.MODEL_PUBLISHED
    type: Literal["ModelPublished"]
    model_version: NonEmpty
    fencing_token: int = Field(ge=0)
    metrics: dict[str, float] = Field(default_factory=dict)


class TenantDeleted(Event):
    TYPE: ClassVar[str] = "TenantDeleted"
    STREAM: ClassVar[str] = Streams.TENANT_DELETED
    type: Literal["TenantDeleted"]


class DocumentSubmitted(Event):
    TYPE: ClassVar[str] = "DocumentSubmitted"
    STREAM: ClassVar[str] = Streams.DOCUMENT_SUBMITTED
    type: Literal["DocumentSubmitted"]
    document_id: DocumentId
    title: str = Field("", max_length=2000)
    text: str = Field(max_length=5_000_000)
    format: Literal["markdown", "text"] = "markdown"


class DocumentDeleted(Event):
    TYPE: ClassVar[str] = "DocumentDeleted"
    STREAM: ClassVar[str] = Streams.DOCUMENT_DELETED
    type: Literal["DocumentDeleted"]
    document_id: DocumentId


class ChunkPayload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    chunk_id: NonEmpty
    context_id: NonEmpty
    section_path: str
    text: str
    char_start: int = Field(ge=0)
    char_end: int = Field(ge=0)


class ChunksExtracted(Event):
    TYPE: ClassVar[str] = "ChunksExtracted"
    STREAM: ClassVar[str] = Streams.CHUNKS_EXTRACTED
    type: Literal["ChunksExtracted"]
    document_id: DocumentId
    chunks: list[ChunkPayload]
    submitted_at: datetime | None = Field(
        None,
        description="When the submission these chunks come from was made; orders them against "
        "deletions and other versions of the document (`pml_common.latest_wins`).",
    )


class _PassCompleted(Event):
    document_id: DocumentId
    content_hash: str = ""


class ChunkingCompleted(_PassCompleted):
    TYPE: ClassVar[str] = "ChunkingCompleted"
    STREAM: ClassVar[str] = Streams.CHUNKING_COMPLETED
    type: Literal["ChunkingCompleted"]


class Pass1Completed(_PassCompleted):
    TYPE: ClassVar[str] = "Pass1Completed"
    STREAM: ClassVar[str] = Streams.PASS1_COMPLETED
    type: Literal["Pass1Completed"]


class Pass2aCompleted(_PassCompleted):
    TYPE: ClassVar[str] = "Pass2aCompleted"
    STREAM: ClassVar[str] = Streams.PASS2A_COMPLETED
    type: Literal["Pass2aCompleted"]


class Pass2bCompleted(_PassCompleted):
    TYPE: ClassVar[str] = "Pass2bCompleted"
    STREAM: ClassVar[str] = Streams.PASS2B_COMPLETED
    type: Literal["Pass2bCompleted"]


class Pass3Completed(_PassCompleted):
    TYPE: ClassVar[str] = "Pass3Completed"
    STREAM: ClassVar[str] = Streams.PASS3_COMPLETED
    type: Literal["Pass3Completed"]


EVENT_TYPES: tuple[type[Event], ...] = (
    ToolsRegistered,
    CapabilityLearned,
    ExecutionCompleted,
    GraphChanged,
    ModelPublished,
    TenantDeleted,
    DocumentSubmitted,
    DocumentDeleted,
    ChunksExtracted,
    ChunkingCompleted,
    Pass1Completed,
    Pass2aCompleted,
    Pass2bCompleted,
    Pass3Completed,
)

#: (type, version) -> schema. A new version is a new class registered here beside the old one.
SCHEMAS: dict[tuple[str, int], type[Event]] = {(e.TYPE, e.VERSION): e for e in EVENT_TYPES}
STREAM_OF: dict[str, str] = {e.TYPE: e.STREAM for e in EVENT_TYPES}


class EventRejected(ValueError):
    """A payload that can never be handled; `reason` says why, for the dead-letter stream."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def parse_event(payload: str | bytes | dict[str, Any]) -> Event:
    """Validate a raw payload into its event class, or raise `EventRejected`."""
    if isinstance(payload, str | bytes):
        try:
            data = json.loads(payload)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise EventRejected(f"payload is not JSON: {exc}") from exc
        except RecursionError as exc:  # the decoder recurses once per level of nesting
            raise EventRejected("payload is nested too deeply to decode") from exc
    else:
        data = payload
    if not isinstance(data, dict):
        raise EventRejected("payload is not a JSON object")
    event_type, version = data.get("type"), data.get("version")
    if not isinstance(event_type, str):
        raise EventRejected("missing or non-string `type`")
    if not isinstance(version, int) or isinstance(version, bool):
        raise EventRejected("missing or non-integer `version`")
    schema = SCHEMAS.get((event_type, version))
    if schema is None:
        known = sorted(v for (t, v) in SCHEMAS if t == event_type)
        if not known:
            raise EventRejected(f"unknown event type {event_type!r}")
        raise EventRejected(f"unsupported version {version} of {event_type} (supported: {known})")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise EventRejected(f"invalid {event_type} v{version}: {_summarise(exc)}") from exc
    except RecursionError as exc:
        raise EventRejected(f"invalid {event_type} v{version}: nested too deeply") from exc


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        where = ".".join(str(p) for p in err["loc"]) or "<root>"
        parts.append(f"{where}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")
