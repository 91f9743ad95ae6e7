"""Validation rules every gRPC service applies to the same kinds of field.

A tenant id, a free text (a query, an intent) and a result count mean the same thing in every
service, so they are checked, defaulted and reported alike. Each function returns the clean
value or raises `RequestError` (via `invalid_argument`) with a message naming the field and what
is wrong. Rules of one service's own fields stay in that service's `validation` module.
What an id, a tenant or an intent may be is `pml_common.input_rules`, which events follow too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from opentelemetry import trace

from pml_common import input_rules
from pml_common.grpc_server import invalid_argument
from pml_common.settings import Settings

#: Longest id a request may name (tenant ids, node ids).
MAX_TEXT = input_rules.MAX_ID_CHARS
#: How many results a count of 0 (the proto default) asks for, capped by `max_limit`.
DEFAULT_LIMIT = 10

_T = TypeVar("_T")


def checked(rule: Callable[[], _T]) -> _T:
    """`rule()`'s clean value; its `InputError` becomes INVALID_ARGUMENT with the same words."""
    try:
        return rule()
    except input_rules.InputError as exc:
        raise invalid_argument(str(exc)) from exc


def tenant_of(tenant_id: str, settings: Settings) -> str:
    """The tenant a request names; blank means the default tenant.

    Any other text is a tenant of its own, matched exactly (stores only ever receive it as a
    query parameter or a payload value), except control characters, which have no business in
    an id and would garble the logs that quote it. Every handler names its tenant here, so the
    request's server span is tagged with it (`pml.tenant_id`) for every RPC alike.
    """
    tenant = checked(lambda: input_rules.tenant(tenant_id)) or settings.default_tenant
    trace.get_current_span().set_attribute("pml.tenant_id", tenant)
    return tenant


def text_of(text: str, settings: Settings, field: str) -> str:
    """A query or intent: not blank, at most `max_query_chars` long; returned stripped.

    Long texts are accepted (agents paste documents into intents); what is embedded of them is
    cut to `embed_query_max_chars` by the embedder.
    """
    return checked(
        lambda: input_rules.intent(text, field=field, max_chars=settings.max_query_chars)
    )


def node_id_of(node_id: str, field: str = "id") -> str:
    """A node id a request names, stripped: not blank, bounded, no control characters."""
    return checked(lambda: input_rules.node_id(node_id.strip(), field=field))


def context_tools_of(ids: Sequence[str], most: int, field: str = "context_tools") -> list[str]:
    """Tool ids a request gives as context (SearchTools' and PredictNext's alike), in order."""
    if len(ids) > most:
        raise invalid_argument(f"{field} holds {len(ids)} ids; the maximum is {most}")
    bad = [i for i in ids if not input_rules.is_tool_id(i)]
    if bad:
        shown = ", ".join(repr(v if len(v) <= 80 else v[:80] + "…") for v in bad[:10])
        raise invalid_argument(
            f"{field} must be tool ids '<server>:<tool>' (at most {MAX_TEXT} characters, no "
            f"control characters); invalid: {shown}{' ...' if len(bad) > 10 else ''}"
        )
    return list(ids)


def limit_of(value: int, settings: Settings, field: str = "limit") -> int:
    """How many results to return: 1 to `max_limit`, 0 for the default."""
    if value == 0:
        return min(DEFAULT_LIMIT, settings.max_limit)
    if not 1 <= value <= settings.max_limit:
        raise invalid_argument(
            f"{field} must be between 1 and {settings.max_limit} (0 means {DEFAULT_LIMIT}); "
            f"got {value}"
        )
    return value
