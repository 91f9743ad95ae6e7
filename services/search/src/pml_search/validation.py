"""Validation of SearchService requests: every rule that turns bad input into INVALID_ARGUMENT.

Each function returns the clean value or raises `RequestError` (via `invalid_argument`) with a
message naming the field and what is wrong, so a caller can fix the request from the message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import ValidationError

from pml.v1 import common_pb2, search_pb2
from pml_common import input_rules
from pml_common.events import CapabilitySpec, ToolSpec
from pml_common.first_stage import schema_fields
from pml_common.grpc_server import invalid_argument
from pml_common.request_validation import MAX_TEXT, text_of
from pml_common.request_validation import context_tools_of as shared_context_tools_of
from pml_common.request_validation import limit_of as limit_of  # shared: re-exported
from pml_common.request_validation import node_id_of as node_id_of  # shared: re-exported
from pml_common.request_validation import tenant_of as tenant_of  # shared: re-exported
from pml_common.settings import Settings
from pml_search.catalog_index import CAPABILITY, TOOL, CatalogEntry

MAX_DESCRIPTION = 20_000
MAX_BATCH = 50_000
#: Longest `input_schema_json` of a tool (JSON Schemas of real MCP tools are a few kB).
MAX_SCHEMA_CHARS = 100_000
#: Most tools, and most sub-capabilities, one capability may name (as `CapabilitySpec` allows).
MAX_MEMBERS = 1000

KIND_OF_ENUM: dict[int, str] = {
    search_pb2.NODE_KIND_TOOL: TOOL,
    search_pb2.NODE_KIND_CAPABILITY: CAPABILITY,
}
ENUM_OF_KIND: dict[str, search_pb2.NodeKind.ValueType] = {
    TOOL: search_pb2.NODE_KIND_TOOL,
    CAPABILITY: search_pb2.NODE_KIND_CAPABILITY,
}


_Item = TypeVar("_Item", common_pb2.Tool, common_pb2.Capability)
_Spec = TypeVar("_Spec", ToolSpec, CapabilitySpec)


def query_of(query: str, settings: Settings) -> str:
    return text_of(query, settings, "query")


def kinds_of(kinds: Sequence[int]) -> list[str]:
    if len(kinds) > len(KIND_OF_ENUM):
        raise invalid_argument(
            f"kinds holds {len(kinds)} values; at most {len(KIND_OF_ENUM)} (TOOL, CAPABILITY)"
        )
    values = list(kinds)
    if not values:
        return [TOOL, CAPABILITY]
    unknown = [k for k in values if k not in KIND_OF_ENUM]
    if unknown:
        raise invalid_argument(f"kinds holds unsupported values {unknown}; use TOOL or CAPABILITY")
    return list(dict.fromkeys(KIND_OF_ENUM[k] for k in values))


def min_score_of(value: float) -> float:
    """The semantic floor; 0 (the proto default) keeps everything, even negative cosines."""
    if not 0.0 <= value <= 1.0:
        raise invalid_argument(f"min_semantic_score must be between 0 and 1; got {value}")
    return value if value > 0 else -1.0


def context_tools_of(ids: Sequence[str], settings: Settings) -> list[str]:
    return list(dict.fromkeys(shared_context_tools_of(ids, settings.max_limit)))


def tool_specs_of(tools: Sequence[common_pb2.Tool]) -> list[ToolSpec]:
    """Validated specs of a RegisterTools batch; any bad tool rejects the whole batch."""
    return _validated_batch("tools", tools, _tool_problem, _tool_spec)


def capability_specs_of(capabilities: Sequence[common_pb2.Capability]) -> list[CapabilitySpec]:
    """Validated specs of a RegisterCapabilities batch; any bad entry rejects the batch.

    Capabilities registered through the API are predefined, not learned from executions, so
    their `source` is `template`.
    """
    return _validated_batch("capabilities", capabilities, _capability_problem, _capability_spec)


def _validated_batch(
    field: str,
    items: Sequence[_Item],
    problem_of: Callable[[_Item, set[str]], str | None],
    spec_of: Callable[[_Item], _Spec],
) -> list[_Spec]:
    """Every item's spec, or INVALID_ARGUMENT listing every bad item (duplicates included)."""
    _check_batch(field, len(items))
    problems: list[str] = []
    specs: list[_Spec] = []
    seen: set[str] = set()
    for n, item in enumerate(items):
        problem = problem_of(item, seen)
        if not problem:
            try:
                specs.append(spec_of(item))
            except ValidationError as exc:  # a rule of the event schema not mirrored above
                problem = "; ".join(e["msg"] for e in exc.errors(include_input=False))
        if problem:
            problems.append(f"{field}[{n}] ({_short(item.id) or '<no id>'}): {problem}")
            continue
        seen.add(item.id)
    _raise_problems(problems)
    return specs


def _tool_spec(tool: common_pb2.Tool) -> ToolSpec:
    return ToolSpec(
        id=tool.id,
        server=tool.server or input_rules.server_of(tool.id),
        name=tool.name.strip(),
        description=tool.description,
        input_schema=_schema_of(tool.input_schema_json),
    )


def _capability_spec(cap: common_pb2.Capability) -> CapabilitySpec:
    return CapabilitySpec(
        id=cap.id,
        name=cap.name.strip(),
        description=cap.description,
        tools=list(cap.tools),
        capabilities=list(cap.capabilities),
        source="template",
    )


def tool_entry(tenant: str, spec: ToolSpec) -> CatalogEntry:
    return CatalogEntry(
        tenant_id=tenant,
        id=spec.id,
        kind=TOOL,
        name=spec.name,
        server=spec.server,
        description=spec.description,
        fields=schema_fields(spec.input_schema),
    )


def capability_entry(tenant: str, spec: CapabilitySpec) -> CatalogEntry:
    return CatalogEntry(
        tenant_id=tenant,
        id=spec.id,
        kind=CAPABILITY,
        name=spec.name,
        server="",
        description=spec.description,
    )


def _tool_problem(tool: common_pb2.Tool, seen: set[str]) -> str | None:
    problem = input_rules.tool_id_problem(tool.id)
    if problem:
        return f"id {problem}"
    if tool.id in seen:
        return "id appears more than once in the batch"
    problem = input_rules.server_problem(tool.server, tool.id) if tool.server else None
    if problem:
        return problem
    if not tool.name.strip():
        return "name must not be empty"
    if len(tool.name) > MAX_TEXT:
        return f"name is longer than {MAX_TEXT} characters"
    if len(tool.description) > MAX_DESCRIPTION:
        return f"description is longer than {MAX_DESCRIPTION} characters"
    if len(tool.input_schema_json) > MAX_SCHEMA_CHARS:
        return f"input_schema_json is longer than {MAX_SCHEMA_CHARS} characters"
    if tool.input_schema_json:
        try:
            schema = _schema_of(tool.input_schema_json)
        except ValueError as exc:
            return f"input_schema_json is not a JSON object: {exc}"
        except RecursionError:
            return "input_schema_json is nested too deeply"
        if input_rules.json_depth(schema) > input_rules.MAX_SCHEMA_DEPTH:
            return f"input_schema_json is nested deeper than {input_rules.MAX_SCHEMA_DEPTH} levels"
    return None


def _capability_problem(cap: common_pb2.Capability, seen: set[str]) -> str | None:
    problem = input_rules.node_id_problem(cap.id)
    if problem:
        return f"id {problem}"
    if cap.id in seen:
        return "id appears more than once in the batch"
    if not cap.name.strip():
        return "name must not be empty"
    if len(cap.name) > MAX_TEXT:
        return f"name is longer than {MAX_TEXT} characters"
    if len(cap.description) > MAX_DESCRIPTION:
        return f"description is longer than {MAX_DESCRIPTION} characters"
    if len(cap.tools) > MAX_MEMBERS or len(cap.capabilities) > MAX_MEMBERS:
        return f"a capability names at most {MAX_MEMBERS} tools and {MAX_MEMBERS} capabilities"
    bad_tools = [t for t in cap.tools if not input_rules.is_tool_id(t)]
    if bad_tools:
        return f"tools must be tool ids '<server>:<tool>'; invalid: {_names(bad_tools)}"
    if any(input_rules.node_id_problem(c) for c in cap.capabilities):
        return (
            f"capabilities must hold ids of 1 to {MAX_TEXT} characters, no control characters, "
            "no whitespace around them"
        )
    if cap.id in cap.capabilities:
        return "a capability cannot contain itself"
    return None


def _schema_of(text: str) -> dict[str, Any] | None:
    if not text:
        return None
    value = json.loads(text)  # JSONDecodeError is a ValueError
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    return value


def _check_batch(field: str, size: int) -> None:
    if size == 0:
        raise invalid_argument(f"{field} must not be empty")
    if size > MAX_BATCH:
        raise invalid_argument(f"{field} holds {size} entries; the maximum is {MAX_BATCH}")


def _raise_problems(problems: list[str]) -> None:
    if not problems:
        return
    shown = "; ".join(problems[:10])
    more = len(problems) - 10
    suffix = f" (+{more} more)" if more > 0 else ""
    raise invalid_argument(f"nothing was registered: {shown}{suffix}")


def _short(value: str, chars: int = 80) -> str:
    """`value` as quoted in a message: whole when short, else its start (inputs may be huge)."""
    return value if len(value) <= chars else value[:chars] + "…"


def _names(values: Sequence[str]) -> str:
    shown = ", ".join(repr(_short(v)) for v in values[:10])
    return shown + (" ..." if len(values) > 10 else "")


# --- KnowledgeService.Ask ---------------------------------------------------------------------

#: Evidence chunks an Ask returns when `k` is 0, and the most it may ask for.
DEFAULT_ASK_K = 8
MAX_ASK_K = 50
#: The first is the default: propagation ranks better than the anchoring and bridge hop of
#: `graph-first` on every dev set (docs/benchmarks.md), at a few milliseconds more per question.
ASK_METHODS = ("graph-ppr", "graph-first", "vector")


def question_of(question: str, settings: Settings) -> str:
    return text_of(question, settings, "question")


def ask_k_of(k: int) -> int:
    """How many evidence chunks: 1 to `MAX_ASK_K`, 0 for `DEFAULT_ASK_K`."""
    if k == 0:
        return DEFAULT_ASK_K
    if not 1 <= k <= MAX_ASK_K:
        raise invalid_argument(f"k must be between 1 and {MAX_ASK_K} (0 means {DEFAULT_ASK_K})")
    return k


def ask_method_of(method: str) -> str:
    """`graph-ppr` (the default, also for ""; graph-first with propagation), `graph-first`
    (anchoring and one bridge hop) or `vector` (the plain baseline)."""
    value = method.strip().lower() or ASK_METHODS[0]
    if value not in ASK_METHODS:
        raise invalid_argument(
            f"method {_short(method)!r} is not known; use one of {', '.join(ASK_METHODS)}"
        )
    return value
