"""Keys built from outside ids are unambiguous, and plain ids keep the keys they always had."""

from __future__ import annotations

import itertools

import pytest

from pml_common import redis_keys

ODD = ["a", "a:x", "x:y", "y", "", ":", "%", "%3A", "a%3Ax", "::", "a:", ":a", "東京:x"]


def test_the_two_tenants_of_the_report_get_different_keys() -> None:
    assert redis_keys.ingest_status("a:x", "y") != redis_keys.ingest_status("a", "x:y")
    assert redis_keys.dedupe("g", "a:x", "y") != redis_keys.dedupe("g", "a", "x:y")
    assert redis_keys.model("a:seq", "current") != redis_keys.model("a", "seq:current")


@pytest.mark.parametrize("family", ["ingest:status", "dedupe"])
def test_keys_are_injective_and_split_back(family: str) -> None:
    pairs = list(itertools.product(ODD, repeat=2))
    keys = {redis_keys.key(family, *pair): pair for pair in pairs}
    assert len(keys) == len(pairs)
    for built, pair in keys.items():
        assert tuple(redis_keys.parts_of(built, family)) == pair


def test_plain_ids_keep_the_keys_earlier_versions_wrote() -> None:
    assert redis_keys.ingest_status("acme", "doc-1") == "pml:ingest:status:acme:doc-1"
    assert redis_keys.model("acme", "blobs") == "pml:model:acme:blobs"
    assert redis_keys.replay("acme", "traces") == "pml:replay:acme:traces"
    assert redis_keys.planner_thresholds("acme") == "pml:planner:thresholds:acme"
    assert redis_keys.TRAINER_LOCK == "pml:trainer:lock"
    assert (
        redis_keys.embedding("use:multilingual-v3", "q", "ab") == "pml:emb:use:multilingual-v3:q:ab"
    )
