"""Validation rules every gRPC service applies to the same kinds of field.

A tenant id, a free text (a query, an intent) and a result count mean the same thing in every
service, so they are checked, defaulted and reported alike. Each function returns the clean
value or raises `RequestError` (via `invalid_argument`) with a message naming the field and what
is wrong. Rules of one service's own fields stay in that service's `validation` module.
"""

from __future__ import annotations

import re

from opentelemetry import trace

from pml_common.grpc_server import invalid_argument
from pml_common.settings import Settings

#: Longest id a request may name (tenant ids, node ids).
MAX_TEXT = 512
#: How many results a count of 0 (the proto default) asks for, capped by `max_limit`.
DEFAULT_LIMIT = 10
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def tenant_of(tenant_id: str, settings: Settings) -> str:
    """The tenant a request names; blank means the default tenant.

    Any other text is a tenant of its own, matched exactly (stores only ever receive it as a
    query parameter or a payload value), except control characters, which have no business in
    an id and would garble the logs that quote it. Every handler names its tenant here, so the
    request's server span is tagged with it (`pml.tenant_id`) for every RPC alike.
    """
    tenant = tenant_id.strip()
    if len(tenant) > MAX_TEXT:
        raise invalid_argument(f"tenant_id is longer than {MAX_TEXT} characters")
    if _CONTROL.search(tenant):
        raise invalid_argument("tenant_id must not hold control characters")
    tenant = tenant or settings.default_tenant
    trace.get_current_span().set_attribute("pml.tenant_id", tenant)
    return tenant


def text_of(text: str, settings: Settings, field: str) -> str:
    """A query or intent: not blank, at most `max_query_chars` long; returned stripped."""
    value = text.strip()
    if not value:
        raise invalid_argument(f"{field} must not be empty")
    if len(text) > settings.max_query_chars:
        raise invalid_argument(
            f"{field} is {len(text)} characters long; the maximum is {settings.max_query_chars}"
        )
    return value


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
