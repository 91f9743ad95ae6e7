"""The validation rules shared by the services: clean values, defaults, and the messages."""

from __future__ import annotations

import grpc
import pytest

from pml_common.grpc_server import RequestError
from pml_common.request_validation import DEFAULT_LIMIT, MAX_TEXT, limit_of, tenant_of, text_of
from pml_common.settings import Settings

SETTINGS = Settings(default_tenant="acme", max_query_chars=20, max_limit=50)


def message_of(call: object) -> str:
    assert isinstance(call, RequestError)
    assert call.code == grpc.StatusCode.INVALID_ARGUMENT
    return call.message


def test_tenant_is_stripped_and_blank_means_the_default() -> None:
    assert tenant_of("  t1 ", SETTINGS) == "t1"
    assert tenant_of("   ", SETTINGS) == "acme"
    assert tenant_of("t" * MAX_TEXT, SETTINGS) == "t" * MAX_TEXT
    with pytest.raises(RequestError) as info:
        tenant_of("t" * (MAX_TEXT + 1), SETTINGS)
    assert message_of(info.value) == f"tenant_id is longer than {MAX_TEXT} characters"


def test_tenant_is_any_exact_text_but_control_characters() -> None:
    for odd in ("x'}) MATCH (n) DETACH DELETE n //", "$tenant", "`a`", "ａcme", "a\u200bb"):
        assert tenant_of(odd, SETTINGS) == odd
    for bad in ("a\x00b", "a\nb", "a\x1bb"):
        with pytest.raises(RequestError) as info:
            tenant_of(bad, SETTINGS)
        assert message_of(info.value) == "tenant_id must not hold control characters"


def test_text_is_stripped_not_blank_and_bounded_with_the_field_named() -> None:
    assert text_of("  read a file ", SETTINGS, "query") == "read a file"
    with pytest.raises(RequestError) as info:
        text_of(" \n ", SETTINGS, "intent")
    assert message_of(info.value) == "intent must not be empty"
    with pytest.raises(RequestError) as info:
        text_of("x" * 21, SETTINGS, "query")
    assert message_of(info.value) == "query is 21 characters long; the maximum is 20"


def test_limit_zero_is_the_default_and_bounds_name_the_field() -> None:
    assert limit_of(0, SETTINGS) == DEFAULT_LIMIT
    assert limit_of(0, Settings(max_limit=3)) == 3
    assert limit_of(50, SETTINGS, "top_k") == 50
    for bad in (-1, 51):
        with pytest.raises(RequestError) as info:
            limit_of(bad, SETTINGS, "k")
        assert message_of(info.value) == f"k must be between 1 and 50 (0 means 10); got {bad}"
