"""TenantCache: weights, least-recently-used eviction, and what is never evicted."""

from __future__ import annotations

import pytest

from pml_common.tenant_cache import TenantCache


def cache(capacity: int, busy: set[str] | None = None) -> TenantCache[str, list[int]]:
    held = busy if busy is not None else set()
    return TenantCache("test", capacity, len, busy=lambda key: key in held)


def test_least_recently_used_values_go_first_once_weights_exceed_the_capacity() -> None:
    tenants = cache(5)
    tenants.put("a", [1, 1])
    tenants.put("b", [1, 1])
    assert tenants.get("a") == [1, 1]  # "b" is now the least recently used
    tenants.put("c", [1, 1])
    assert "b" not in tenants and "a" in tenants and "c" in tenants
    assert tenants.weight() == 4
    assert tenants.keys() == ["a", "c"]


def test_a_value_growing_in_place_makes_others_give_way_on_shrink() -> None:
    tenants = cache(4)
    tenants.put("a", [1])
    grown = tenants.put("b", [1])
    grown.extend([1, 1, 1])
    assert tenants.shrink() == ["a"]
    assert list(tenants._values) == ["b"]


def test_busy_and_newest_values_are_kept_even_over_the_capacity() -> None:
    busy = {"a"}
    tenants = cache(2, busy)
    tenants.put("a", [1, 1])
    tenants.put("huge", [1] * 10)  # alone above the capacity: still served
    assert "a" in tenants and "huge" in tenants
    busy.clear()
    tenants.put("c", [1])
    assert "a" not in tenants and "huge" not in tenants and "c" in tenants


def test_peek_and_replace_are_not_uses() -> None:
    tenants = cache(4)
    tenants.put("a", [1, 1])
    tenants.put("b", [1, 1])
    assert tenants.peek("a") == [1, 1]
    tenants.replace("a", [2, 2])
    tenants.replace("gone", [3])  # not cached: stays out
    tenants.put("c", [1])
    assert "a" not in tenants and "gone" not in tenants
    assert tenants.setdefault("b", [9]) == [1, 1]
    assert tenants.pop("b") == [1, 1] and tenants.pop("b") is None


def test_the_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        cache(0)
